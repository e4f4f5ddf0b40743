# Summarizes a megatrain metrics.jsonl: median over steps after the first (warm-up).
# summarize.py METRICS.jsonl LABEL
import json, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
rest = rows[1:] or rows
med = lambda k: statistics.median(r[k] for r in rest if k in r)
keys = ["ms", "tflops", "tflops_attn", "mfu", "tok_s", "h2d_gbs", "d2h_gbs", "gpu_busy", "opt_ms", "host_gib", "gpu_gib"]
vals = {k: med(k) for k in keys if all(k in r for r in rest)}
print("RESULT megatrain %s steps=%d " % (sys.argv[2], len(rows)) +
      " ".join("%s=%.3g" % (k, v) for k, v in vals.items()))
