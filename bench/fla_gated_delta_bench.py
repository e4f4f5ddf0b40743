# The Gated DeltaNet's chunked rule on the H200, the peers of megatrain's kernel
# (tests/gpu/test_cuda_gated_delta --bench), at the Qwen3.6-35B-A3B layer shape (32 value heads of
# 128, keys of 128), B 1, T 4096 / 32768 / 131072, bf16 in, fp32 state:
#  - flash-linear-attention 0.6's chunk_gated_delta_rule (Triton): forward; its backward refuses to
#    run on Hopper with the image's Triton 3.6 (it says so), which is tried and reported;
#  - transformers' torch_chunk_gated_delta_rule (PyTorch ops), forward and backward, T 4096 only
#    (its chunk loop is Python), with --transformers, in a process without fla on the path (with
#    fla importable, the image's transformers refused it with fla's Triton message).
# Also the training shape B 16, T 4096 for fla's forward.
# Usage (on the GPU machine, wheels of fla, fla-core and einops in WHEELS):
#   PYTHONPATH=$WHEELS_UNPACKED python3 bench/fla_gated_delta_bench.py
#   python3 bench/fla_gated_delta_bench.py --transformers
import time
import torch
import torch.nn.functional as F

H, K, V = 32, 128, 128


def inputs(T, grad=True, B=1):
    g0 = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g0)
    q, k, v = mk(B, T, H, K), mk(B, T, H, K), mk(B, T, H, V)
    q, k = F.normalize(q.float(), dim=-1).to(torch.bfloat16), F.normalize(k.float(), dim=-1).to(torch.bfloat16)
    g = (-F.softplus(torch.randn(B, T, H, device="cuda", generator=g0))).float()
    beta = torch.rand(B, T, H, device="cuda", generator=g0).to(torch.bfloat16)
    return [t.requires_grad_(grad) for t in (q, k, v, g, beta)]


def timed(fn, n=5):
    fn()
    torch.cuda.synchronize()
    t0 = time.time()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.time() - t0) / n


def flops(T):  # megatrain's count of the chunked form (mt_gated_delta_flops), per value head
    L = 64
    nc = (T + L - 1) // L
    fwd = nc * (4 * L * L * K + 4 * L * L * V + 6 * L * K * V + L * (L * L - 1) / 3)
    bwd = nc * (10 * L * L * K + 10 * L * L * V + 14 * L * K * V + L * (L * L - 1) / 3)
    return fwd * H, bwd * H


def main():
    import sys
    print("device", torch.cuda.get_device_name(), "torch", torch.__version__)
    if "--transformers" in sys.argv:
        return transformers_rule()
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        import triton
        print("fla", __import__("fla").__version__, "triton", triton.__version__)
    except Exception as e:  # noqa
        print("fla: not importable:", e)
        chunk_gated_delta_rule = None
    for B, T in ((1, 4096), (1, 32768), (1, 131072), (16, 4096)):
        ff, fb = flops(T)
        ff, fb = ff * B, fb * B
        if chunk_gated_delta_rule:
            q, k, v, g, beta = inputs(T, grad=False, B=B)
            with torch.no_grad():
                t = timed(lambda: chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=False))
            print(f"RESULT fla forward B={B} T={T}: {t*1e3:.3f} ms, {ff/t/1e12:.1f} TFLOP/s (megatrain's count)", flush=True)
            q, k, v, g, beta = inputs(T, B=B)
            try:
                o = chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=False)[0]
                do = torch.randn_like(o)
                t = timed(lambda: torch.autograd.grad(
                    chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=False)[0],
                    (q, k, v, g, beta), do))
                print(f"RESULT fla forward+backward B={B} T={T}: {t*1e3:.3f} ms, {(ff+fb)/t/1e12:.1f} TFLOP/s", flush=True)
            except Exception as e:  # noqa
                print(f"RESULT fla backward B={B} T={T}: refused: {str(e).splitlines()[0][:300]}", flush=True)
            del q, k, v, g, beta
            torch.cuda.empty_cache()


def transformers_rule():
    try:
        try:
            from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule as tcd
        except Exception:
            from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule as tcd
        import transformers
        print("transformers", transformers.__version__)
        T = 4096
        ff, fb = flops(T)
        q, k, v, g, beta = inputs(T)
        o = tcd(q, k, v, g=g, beta=beta)[0]
        do = torch.randn_like(o)
        t = timed(lambda: tcd(q, k, v, g=g, beta=beta), n=3)
        tb = timed(lambda: torch.autograd.grad(tcd(q, k, v, g=g, beta=beta)[0], (q, k, v, g, beta), do), n=3)
        print(f"RESULT transformers torch_chunk_gated_delta_rule T={T}: forward {t*1e3:.3f} ms "
              f"({ff/t/1e12:.1f} TFLOP/s), forward+backward {tb*1e3:.3f} ms ({(ff+fb)/tb/1e12:.1f} TFLOP/s)", flush=True)
    except Exception as e:  # noqa
        print("transformers' chunked rule: not run:", str(e).splitlines()[0][:300])


if __name__ == "__main__":
    main()
