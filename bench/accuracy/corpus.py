#!/usr/bin/env python3
"""Builds the accuracy corpus from a Linux source tarball: the .c/.h files of a few subtrees,
train in byte order of their paths, each file one document followed by a separator line; a file goes
to eval when the MD5 of its path falls in EVAL_PCT percent, else to train. Deterministic: the
same tarball gives byte-identical files. Prints one JSON line of facts."""
import hashlib, json, sys, tarfile

SUBTREES = ("kernel", "mm", "lib", "fs", "net", "sound", "crypto", "security", "block",
            "io_uring", "ipc", "init", "virt")
EXCLUDE = ("fs/nls/",)       # code-page tables: numbers, not code
MAX_FILE = 1 << 20           # generated tables (crypto/testmgr.h) are left out
EVAL_PCT = 1


def main():
    tar_path, sep, train_path, eval_path, list_path = sys.argv[1:6]
    docs, skipped = {}, {"not_utf8": 0, "too_big": 0, "has_sep": 0, "nul": 0}
    with tarfile.open(tar_path, "r:*") as tf:
        for m in tf:
            if not m.isfile() or not m.name.endswith((".c", ".h")):
                continue
            rel = m.name.split("/", 1)[1] if "/" in m.name else m.name
            if rel.split("/", 1)[0] not in SUBTREES or rel.startswith(EXCLUDE):
                continue
            if m.size > MAX_FILE:
                skipped["too_big"] += 1
                continue
            data = tf.extractfile(m).read()
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                skipped["not_utf8"] += 1     # so both tokenizers see the same text
                continue
            if "\0" in text:
                skipped["nul"] += 1
                continue
            if not text.endswith("\n"):
                text += "\n"                 # a document is whole lines before the separator
            if sep in text.split("\n"):
                skipped["has_sep"] += 1
                continue
            docs[rel] = text
    def md5(rel):
        return int(hashlib.md5(rel.encode("utf-8")).hexdigest()[:8], 16)
    paths = sorted(docs, key=lambda p: p.encode("utf-8"))
    train = [p for p in paths if md5(p) % 100 >= EVAL_PCT]
    # eval in hash order: any prefix of it (`--eval-batches N`) samples every subtree
    evals = sorted((p for p in paths if md5(p) % 100 < EVAL_PCT), key=lambda p: (md5(p), p))
    facts = {"files": len(paths), "eval_files": len(evals), "train_bytes": 0, "eval_bytes": 0,
             "skipped": skipped}
    for part, out_path, key in ((train, train_path, "train_bytes"), (evals, eval_path, "eval_bytes")):
        with open(out_path, "w", encoding="utf-8", newline="") as out:
            for rel in part:
                out.write(docs[rel])
                out.write(sep + "\n")
                facts[key] += len(docs[rel].encode("utf-8"))
    with open(list_path, "w", encoding="utf-8") as ls:
        ls.writelines("train %s\n" % p for p in train)
        ls.writelines("eval %s\n" % p for p in evals)
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
