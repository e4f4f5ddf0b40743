"""`megatrain train`'s TensorBoard event files read back with the tensorboard package's own readers.

A run with --eval-every and checkpoints, then a resume from an earlier checkpoint (the later one
removed, so the steps after it run again): every scalar TensorBoard shows equals the float32 of the
same number in metrics.jsonl, exactly, with each (tag, step) once. Checked two ways: the
EventAccumulator that `tensorboard --logdir` uses, and every record of every file in name order
(CRCs verified by tensorboard's record reader; no purging, as importers that read the raw records
see them). Also: --no-tensorboard writes none, --overwrite removes the old run's, and an
OUT/tensorboard that cannot be used is a warning, not a failed run.

Run by tests/tensorboard_roundtrip.sh (it finds a Python with tensorboard or skips):
  python tensorboard_roundtrip.py MEGATRAIN CONFIG.json
"""
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow

# metrics.jsonl key -> TensorBoard tag (every number of a line; the counters stay JSON-only)
TAGS = {
    "loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "clip": "train/clip",
    "ms": "train/step_ms", "tflops": "train/tflops", "tflops_attn": "train/tflops_attn",
    "tok_s": "train/tokens_per_s", "mfu": "train/mfu", "h2d_gbs": "train/h2d_gbs",
    "d2h_gbs": "train/d2h_gbs", "gpu_busy": "train/gpu_busy", "opt_ms": "train/opt_ms",
    "gpu_gib": "train/gpu_gib", "host_gib": "train/host_gib", "eval_loss": "eval/loss",
}
NOT_SCALARS = {"step", "tokens", "targets", "eval_tokens", "attn_docs", "nonfinite", "skipped"}


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(cmd, want=0):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != want:
        fail("exit %d (want %d): %s\n%s" % (p.returncode, want, " ".join(cmd), p.stdout))
    return p.stdout


def expected(out):
    """{tag: {step: float32 value or None (a JSON null)}} from metrics.jsonl."""
    want = {}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            for k, v in j.items():
                if k in NOT_SCALARS:
                    continue
                if k not in TAGS:
                    fail("metrics.jsonl key %r has no TensorBoard tag in this test" % k)
                steps = want.setdefault(TAGS[k], {})
                if j["step"] in steps:
                    fail("metrics.jsonl has step %d twice for %s" % (j["step"], k))
                steps[j["step"]] = None if v is None else f32(v)
    return want


def same(got, want):
    return (not math.isfinite(got)) if want is None else got == want


def event_files(tb):
    return sorted(os.path.join(tb, n) for n in os.listdir(tb) if n.startswith("events.out.tfevents."))


def raw_events(path):
    """Every record of one file through tensorboard's record reader (a bad CRC raises)."""
    reader = pywrap_tensorflow.PyRecordReader_New(path)
    events = []
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return events
        events.append(event_pb2.Event.FromString(reader.record()))


def check_raw(tb, want):
    files = event_files(tb)
    seen = {}
    for i, path in enumerate(files):
        events = raw_events(path)
        if not events or events[0].file_version != "brain.Event:2":
            fail("%s: the first event is not file_version brain.Event:2" % path)
        for e in events[1:]:
            for v in e.summary.value:
                if (v.tag, e.step) in seen:
                    fail("%s: %s step %d twice in the raw records" % (path, v.tag, e.step))
                seen[(v.tag, e.step)] = v.simple_value
    got = {}
    for (tag, step), value in seen.items():
        got.setdefault(tag, {})[step] = value
    compare("raw records", got, want)
    return files


def check_accumulator(tb, want):
    acc = event_accumulator.EventAccumulator(tb, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    got = {}
    for tag in acc.Tags()["scalars"]:
        steps = [e.step for e in acc.Scalars(tag)]
        if len(steps) != len(set(steps)):
            fail("EventAccumulator: %s shows steps %s (a step twice)" % (tag, steps))
        got[tag] = {e.step: e.value for e in acc.Scalars(tag)}
    compare("EventAccumulator", got, want)


def compare(how, got, want):
    if set(got) != set(want):
        fail("%s: tags %s, metrics.jsonl %s" % (how, sorted(got), sorted(want)))
    n = 0
    for tag, steps in want.items():
        if set(got[tag]) != set(steps):
            fail("%s: %s steps %s, metrics.jsonl %s" % (how, tag, sorted(got[tag]), sorted(steps)))
        for s, v in steps.items():
            if not same(got[tag][s], v):
                fail("%s: %s step %d is %r, metrics.jsonl %r" % (how, tag, s, got[tag][s], v))
            n += 1
    print("%s: %d scalars in %d tags equal metrics.jsonl" % (how, n, len(want)))


def main():
    binary, config = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="mt-tb-")
    try:
        rng = random.Random(1)
        words = "the cat sat on a mat while dog ran far".split()
        for name, lines in (("train.txt", 200), ("eval.txt", 40)):
            with open(os.path.join(tmp, name), "w") as f:
                for _ in range(lines):
                    f.write(" ".join(rng.choice(words) for _ in range(30)) + "\n")
        out = os.path.join(tmp, "run")
        tb = os.path.join(out, "tensorboard")
        base = [binary, "train", "--init", config, "--data", os.path.join(tmp, "train.txt"),
                "--eval-data", os.path.join(tmp, "eval.txt"), "--out", out, "--steps", "8",
                "--batch", "2", "--seq", "32", "--eval-every", "3", "--eval-batches", "2",
                "--save-every", "4", "--keep", "5", "--seed", "3", "--device", "cpu"]
        run(base)
        first = check_raw(tb, expected(out))
        check_accumulator(tb, expected(out))
        if len(first) != 1:
            fail("one run, files %s" % first)

        # resume from step 4: steps 5-8 and the evaluations at 6 and 8 run again
        shutil.rmtree(os.path.join(out, "checkpoints", "step_00000008"))
        log = run(base + ["--resume"])
        if "tensorboard: 6 later events dropped" not in log:
            fail("the resume did not say it dropped the 6 later events:\n" + log)
        want = expected(out)
        if sorted(want["train/loss"]) != list(range(1, 9)) or sorted(want["eval/loss"]) != [3, 6, 8]:
            fail("metrics.jsonl after the resume: %s" % {t: sorted(s) for t, s in want.items()})
        files = check_raw(tb, want)
        check_accumulator(tb, want)
        if len(files) != 2 or files[0] != first[0]:
            fail("after the resume, files %s (the first %s, read first)" % (files, first))
        restart = raw_events(files[1])[1]
        if restart.step != 5 or restart.session_log.status != event_pb2.SessionLog.START:
            fail("the resumed file's second event is not a SessionLog START at step 5: %s" % restart)

        # --overwrite: the old run's event files go
        run(base + ["--overwrite", "--steps", "2", "--save-every", "0"])
        if len(event_files(tb)) != 1:
            fail("--overwrite left %s" % event_files(tb))
        check_raw(tb, expected(out))

        # --no-tensorboard: none written
        out2 = os.path.join(tmp, "quiet")
        run([a if a != out else out2 for a in base] + ["--no-tensorboard", "--steps", "2", "--save-every", "0"])
        if os.path.exists(os.path.join(out2, "tensorboard")):
            fail("--no-tensorboard wrote " + os.path.join(out2, "tensorboard"))

        # OUT/tensorboard a file: a warning, and the run goes on
        out3 = os.path.join(tmp, "blocked")
        os.makedirs(out3)
        open(os.path.join(out3, "tensorboard"), "w").close()
        log = run([a if a != out else out3 for a in base] + ["--steps", "2", "--save-every", "0"])
        warnings = [l for l in log.splitlines() if l.startswith("megatrain: warning: ")]
        if len(warnings) != 1 or "no more TensorBoard events" not in warnings[0]:
            fail("not one warning for an unusable OUT/tensorboard:\n" + log)
        if sum('"loss"' in line for line in open(os.path.join(out3, "metrics.jsonl"))) != 2:
            fail("the run with an unusable OUT/tensorboard did not log its 2 steps")
        print("tensorboard round trip: ok")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
