# Anchor probe: the MegaTrain authors' release (github DLYuanGod/MegaTrain, package `infinity`,
# CPUMasterModel) on one GPU: a random-init Qwen2-family model of the shape in CONFIG (one of
# bench/configs/*.json), random tokens, DeepSpeedCPUAdam as in the release's examples/sft/train.py.
#   python3 bench/baselines/megatrain_release.py CONFIG.json B T STEPS [checkpoint_interval]
# e.g. `... bench/configs/qwen2.5-7b-512k.json 1 131072 3` (issue 11's long-context comparison).
# The release and the wheels it needs come from scripts/release-deps.sh (prebuilt/release/);
# bench/release_longctx.sh sets up PYTHONPATH from them on the GPU machine and runs this beside
# megatrain. MTREF overrides where `infinity` is looked for (default prebuilt/release/mtref).
# Output: one line per step (time, loss, peak GPU memory, host RSS) and a last line
#   RESULT megatrain-release NAME B= T= ci= median step S tokens/s N 6NT-TFLOPS F
# (median over steps 2.., step 1 is warm-up), which goes to bench/RESULTS.md beside ours.
# RELEASE_SDPA=flash|cudnn|efficient pins PyTorch's SDPA backend (default: PyTorch's own choice).
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
mtref = os.environ.get("MTREF", os.path.join(here, "..", "..", "prebuilt", "release", "mtref"))
sys.path.insert(0, mtref)
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
if len(sys.argv) not in (5, 6):
    sys.exit("usage: megatrain_release.py CONFIG.json B T STEPS [checkpoint_interval]")
from transformers import Qwen2Config  # configuration only: no torch needed yet

path, B, T, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ci = int(sys.argv[5]) if len(sys.argv) > 5 else 4
name = os.path.basename(path).removesuffix(".json")
with open(path) as f:
    fields = json.load(f)
if fields.get("model_type") != "qwen2":
    sys.exit(f"megatrain_release.py: {path}: model_type {fields.get('model_type')!r}, this probe builds qwen2 shapes only")
if fields.get("max_position_embeddings", T) < T:
    sys.exit(f"megatrain_release.py: {path}: max_position_embeddings {fields['max_position_embeddings']} < T {T}; use a *-512k config")
fields.pop("model_type")
cfg = Qwen2Config(**fields)
# transformers 5 keeps rope_theta inside rope_parameters; check the config's value got there
rope = getattr(cfg, "rope_parameters", None)
theta = rope.get("rope_theta") if isinstance(rope, dict) else getattr(cfg, "rope_theta", None)
if "rope_theta" in fields and theta != fields["rope_theta"]:
    sys.exit(f"megatrain_release.py: rope_theta {fields['rope_theta']} from {path} did not reach the model config (got {theta})")

import psutil, torch
from transformers import Qwen2ForCausalLM, AutoModelForCausalLM
import transformers.modeling_utils as _mu
from infinity import CPUMasterModel, CPUMasterConfig
_commit_file = os.path.join(mtref, "..", "COMMIT")  # written by scripts/release-deps.sh
commit = open(_commit_file).read().strip()[:12] if os.path.exists(_commit_file) else "unknown commit"

t0 = time.time(); torch.manual_seed(0)
# skip transformers' per-module init (minutes at 7B on the CPU); fill the weights in bulk after
_noop = lambda self, *a, **k: None
torch.nn.Linear.reset_parameters = _noop; torch.nn.Embedding.reset_parameters = _noop
Qwen2ForCausalLM._init_weights = _noop
if hasattr(_mu.PreTrainedModel, "init_weights"): _mu.PreTrainedModel.init_weights = _noop
hf = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
with torch.no_grad():  # weights: slices of one random pool (fast), 1-D params 1.0
    pool = (torch.randn(1 << 26) * 0.02).to(torch.bfloat16); off = 0
    for n_, p_ in hf.named_parameters():
        if p_.dim() < 2: p_.fill_(1.0); continue
        flat = p_.view(-1); i = 0
        while i < flat.numel():
            k = min(flat.numel() - i, pool.numel() - off)
            flat[i:i + k].copy_(pool[off:off + k]); i += k; off = (off + k) % pool.numel()
N = sum(p.numel() for p in hf.parameters())
print(f"{name}: {N} params ({N/1e9:.2f}B), {cfg.num_hidden_layers} layers, rope_theta {theta}, "
      f"max_position_embeddings {cfg.max_position_embeddings}, init {time.time()-t0:.0f}s, release {commit}",
      flush=True)
mc = CPUMasterConfig(model_name="random", dataset_path="random", batch_size=B, max_seq_len=T,
                     attn_implementation="sdpa", checkpoint_interval=ci, num_grad_slabs=max(12, 2 * ci),
                     learning_rate=1e-5, weight_decay=0.1, beta2=0.95)
# The release hands the 2-D padding mask to every layer, which its flash_attention_2 path takes;
# under SDPA (flash-attn is not installable there) a None mask selects PyTorch's causal kernels.
# No row is padded here, so this is the same computation.
_bk = CPUMasterModel._build_layer_kwargs
def _bk_nomask(self, mask, *a):
    kw = _bk(self, mask, *a); kw["attention_mask"] = None; return kw
CPUMasterModel._build_layer_kwargs = _bk_nomask
model = CPUMasterModel(hf, mc); del hf
try:
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    opt = DeepSpeedCPUAdam(model.get_parameters(), lr=1e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, adamw_mode=True)
    kind = "DeepSpeedCPUAdam"
except Exception as e:
    print("!" * 72 + f"\n!! no DeepSpeedCPUAdam ({repr(e)[:300]})\n!! falling back to torch AdamW "
          "on the CPU: NOT the release's optimizer, its step time is not comparable\n" + "!" * 72, flush=True)
    opt = torch.optim.AdamW(model.get_parameters(), lr=1e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    kind = "torch AdamW (fallback)"
sdpa = os.environ.get("RELEASE_SDPA", "")
backends = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}
if sdpa and sdpa not in backends:
    sys.exit(f"megatrain_release.py: RELEASE_SDPA={sdpa!r}: use one of {', '.join(backends)} or leave it unset")
from contextlib import nullcontext
from torch.nn.attention import sdpa_kernel, SDPBackend
attn_ctx = (lambda: sdpa_kernel(getattr(SDPBackend, backends[sdpa]))) if sdpa else nullcontext
print(f"optimizer {kind}, SDPA backend {sdpa or 'PyTorch default'}, B {B} T {T} ci {ci}", flush=True)
x = torch.randint(0, cfg.vocab_size, (B, T))
mask = torch.ones_like(x)
times = []
for s in range(steps):
    t = time.perf_counter()
    with attn_ctx():
        loss, ntok, timing = model.forward_and_backward(x, mask, x.clone())
    torch.nn.utils.clip_grad_norm_(model.get_parameters(), 1.0)
    opt.step(); model._sync_params_to_gpu(); model.zero_grad(); opt.zero_grad()
    torch.cuda.synchronize(); dt = time.perf_counter() - t; times.append(dt)
    print(f"step {s} loss {loss:.3f} total {dt:.2f}s fwd {timing['forward']:.2f} bwd {timing['backward']:.2f} "
          f"6NT-TFLOPS {6*N*B*T/dt/1e12:.0f} peakGPU {torch.cuda.max_memory_allocated()/2**30:.1f}GiB "
          f"RSS {psutil.Process().memory_info().rss/2**30:.1f}GiB", flush=True)
rest = sorted(times[1:])
best = rest[len(rest) // 2] if rest else times[0]
print(f"RESULT megatrain-release {name} B={B} T={T} ci={ci} median step {best:.2f}s tokens/s {B*T/best:.0f} "
      f"6NT-TFLOPS {6*N*B*T/best/1e12:.0f} optimizer {kind.split(' (')[0].replace(' ', '-')}", flush=True)
