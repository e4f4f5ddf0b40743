"""The peer of `megatrain train --lora` (issue 27): PEFT + transformers LoRA, the fastest common
recipe on one GPU, on a random-init model of a given shape: rank-R adapters on every projection of
attention and MLP, gradient checkpointing, micro-batches accumulated to the batch, torch AdamW over
the adapters; the base in bf16, or in bitsandbytes' 4-bit NF4 (QLoRA: bnb.nn.Linear4bit, bf16
compute, no double quantization, as megatrain's nf4 base). Prints tokens/s of the timed steps
(after one warm-up step), the step time and the peak GPU memory.

Usage: python bench/peft_lora_bench.py --config bench/configs/llama-3.1-8b.json --base nf4 \\
           --rank 16 --batch 16 --micro-batch 4 --seq 4096 --steps 3 [--device cuda|cpu]
           [--targets q_proj,k_proj,...] [--target-parameters mlp.experts.gate_up_proj,...]
(--device cpu with a tiny config checks the script itself; its timing means nothing.)
--targets replaces the module list (gpt-oss: q_proj,k_proj,v_proj,o_proj, its experts being fused
parameters); --target-parameters adds PEFT's adapters on parameters (gpt-oss's experts:
mlp.experts.gate_up_proj,mlp.experts.down_proj), as megatrain's --lora-targets gate_up_proj,down_proj.
"""
import argparse
import json
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def quantize_linears(model, device):
    """Every Linear of the decoder layers -> bnb.nn.Linear4bit (NF4), its bf16 weight quantized as it
    moves to the device (bitsandbytes' Params4bit)."""
    import bitsandbytes as bnb

    for layer in model.model.layers:
        for parent in layer.modules():
            for name, child in list(parent.named_children()):
                if not isinstance(child, torch.nn.Linear) or name not in TARGETS:
                    continue
                q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                      compute_dtype=torch.bfloat16, quant_type="nf4", device="meta")
                q.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, quant_type="nf4")
                if child.bias is not None:
                    q.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
                setattr(parent, name, q.to(device))
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--base", choices=["bf16", "nf4"], default="bf16")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--target-parameters", default="")
    a = ap.parse_args()
    targets = a.targets.split(",")
    params = [p for p in a.target_parameters.split(",") if p]
    assert a.batch % a.micro_batch == 0, "--micro-batch must divide --batch"
    torch.manual_seed(0)
    with open(a.config) as f:
        cfg = AutoConfig.for_model(**json.load(f))
    # drawn on the device: an 8B random init on the CPU takes minutes
    with torch.device(a.device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    if a.base == "nf4":
        model = quantize_linears(model, a.device)
    model.to(a.device)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    extra = {"target_parameters": params} if params else {}
    model = get_peft_model(model, LoraConfig(r=a.rank, lora_alpha=2 * a.rank, lora_dropout=0.0,
                                             target_modules=targets, bias="none", task_type="CAUSAL_LM",
                                             **extra))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device=a.device)
    accum = a.batch // a.micro_batch
    cuda = a.device.startswith("cuda")
    times = []
    for step in range(a.steps + 1):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for m in range(accum):
            rows = ids[m * a.micro_batch:(m + 1) * a.micro_batch]
            loss = model(input_ids=rows, labels=rows).loss / accum
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if step:  # the first step warms up
            times.append(dt)
        print(f"step {step}: loss {loss.item() * accum:.4f} {dt:.3f} s", flush=True)
    mean = sum(times) / len(times)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    print(f"peft {a.base}: rank {a.rank} ({trainable} trainable), {a.batch} x {a.seq} a step "
          f"(micro-batch {a.micro_batch}), {mean:.3f} s a step, {a.batch * a.seq / mean:.0f} tok/s, "
          f"peak GPU {peak:.2f} GiB")


if __name__ == "__main__":
    main()
