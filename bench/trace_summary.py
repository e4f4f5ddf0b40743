"""Summarizes a `megatrain train --trace` file: for the last step, how busy each stream was (device
time), how long the optimizer threads ran beside it, and the largest idle gaps of the compute
stream with what the next piece of compute was waiting for (its weights on the H2D stream, or the
optimizer's update of its layer).  usage: python3 bench/trace_summary.py TRACE.json [label]"""
import json
import sys

LANES = {4: "compute", 5: "H2D", 6: "D2H"}


def union_ms(spans):
    total, end = 0.0, None
    for t0, t1 in sorted(spans):
        if end is None or t0 > end:
            total += t1 - t0
            end = t1
        elif t1 > end:
            total += t1 - end
            end = t1
    return total / 1e3


def main():
    events = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
    label = sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]
    dev = [e for e in events if e["tid"] in LANES]
    if not dev:
        print(f"TRACE {label}: no device spans in the trace")
        return
    step = max(e["args"]["step"] for e in dev if e["tid"] == 4)
    cur = [e for e in dev if e["args"]["step"] == step]
    t_begin = min(e["ts"] for e in cur)
    t_end = max(e["ts"] + e["dur"] for e in cur)
    window = (t_end - t_begin) / 1e3
    parts = []
    for tid, name in LANES.items():
        spans = [(e["ts"], e["ts"] + e["dur"]) for e in cur if e["tid"] == tid]
        parts.append(f"{name} {union_ms(spans):.0f} ms ({100 * union_ms(spans) / window:.0f}%)")
    opt = [e for e in events if e["tid"] == 3 and e["args"]["step"] == step - 1]
    opt_ms = union_ms([(e["ts"], e["ts"] + e["dur"]) for e in opt])
    waits = [e for e in events if e["tid"] == 0 and e["args"]["step"] == step and e["name"].startswith("wait optimizer")]
    wait_ms = sum(e["dur"] for e in waits) / 1e3
    print(f"TRACE {label} step {step}: {window:.0f} ms from first to last stream work; busy: "
          + ", ".join(parts) + f"; optimizer of step {step - 1}: {opt_ms:.0f} ms; host waited for it "
          f"{wait_ms:.0f} ms before issuing loads")

    comp = sorted((e for e in cur if e["tid"] == 4), key=lambda e: e["ts"])
    prev = [e["ts"] + e["dur"] for e in dev if e["tid"] == 4 and e["args"]["step"] == step - 1]
    if prev:
        # between steps: the last gradients leave, the norm comes back, the optimizer updates the
        # embedding and layer 0 and they are loaded, all before the first forward can start
        print(f"  compute idle between step {step - 1} and step {step}: {(comp[0]['ts'] - max(prev)) / 1e3:.0f} ms")
    loads = {}
    for e in cur:
        if e["tid"] == 5 and e["name"].startswith("load"):
            loads.setdefault(e["name"].split()[-1], []).append(e)
    opt_end = {e["name"].split()[-1]: e["ts"] + e["dur"] for e in opt}
    gaps = []
    for a, b in zip(comp, comp[1:]):
        gap = b["ts"] - (a["ts"] + a["dur"])
        if gap > 500:
            gaps.append((gap, a, b))
    idle = sum(g for g, _, _ in gaps) / 1e3
    print(f"  compute idle in gaps > 0.5 ms: {idle:.0f} ms ({100 * idle / window:.1f}%), {len(gaps)} gaps")
    for gap, a, b in sorted(gaps, key=lambda g: -g[0])[:6]:
        group = b["name"].split()[-1]
        why = []
        load = [l for l in loads.get(group, []) if l["ts"] + l["dur"] <= b["ts"] + 1]
        if load:
            why.append(f"its load ended {(b['ts'] - load[-1]['ts'] - load[-1]['dur']) / 1e3:.1f} ms before")
        if group in opt_end and b["name"].startswith("forward"):
            why.append(f"its update ended {(b['ts'] - opt_end[group]) / 1e3:.1f} ms before")
        print(f"    {gap / 1e3:6.1f} ms before {b['name']} (after {a['name']}): " + ", ".join(why))


if __name__ == "__main__":
    main()
