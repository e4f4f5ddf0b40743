#!/usr/bin/env python3
"""train: a byte-level BPE (GPT-2 style: ByteLevel pre-tokenizer with its regex, no prefix space,
<|endoftext|> = id 0 as eos) of VOCAB ids on the documents of a --doc-sep text file, written as
DIR/tokenizer.json + DIR/tokenizer_config.json.
encode: the ids Hugging Face's tokenizer(text) + [eos] gives per document of a --doc-sep text
file, as the uint16 token file `megatrain tokenize` writes (to compare the two byte for byte)."""
import sys
from array import array


def docs(path, sep):
    doc = []
    with open(path, encoding="utf-8", newline="") as f:
        for line in f:
            if line == sep + "\n" or line == sep:
                if doc:
                    yield "".join(doc)
                doc = []
            else:
                doc.append(line)
    if doc:
        yield "".join(doc)


def train(text, sep, vocab, out_dir):
    import json, os
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                                  special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs(text, sep), trainer)
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
           "eos_token": "<|endoftext|>", "unk_token": None, "model_max_length": 1024}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    print("vocab", tok.get_vocab_size())


def encode(tok_json, text, sep, out):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tok_json)
    eos = tok.token_to_id("<|endoftext|>")
    ids = array("H")
    for d in docs(text, sep):
        ids.extend(tok.encode(d).ids)
        ids.append(eos)
    if sys.byteorder != "little":
        ids.byteswap()
    with open(out, "wb") as f:
        ids.tofile(f)
    print("tokens", len(ids))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "train":
        train(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    elif cmd == "encode":
        encode(*sys.argv[2:6])
    else:
        sys.exit("usage: tokenizer.py train TEXT SEP VOCAB DIR | encode TOKENIZER.json TEXT SEP OUT.bin")
