# Random token ids for throughput benchmarks: make_tokens.py VOCAB COUNT OUT.bin
# (uint16 when VOCAB <= 65536, else uint32, as megatrain reads them).
import sys
import numpy as np

vocab, count, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dtype = np.uint16 if vocab <= 65536 else np.uint32
np.random.default_rng(0).integers(0, vocab, size=count, dtype=np.int64).astype(dtype).tofile(out)
