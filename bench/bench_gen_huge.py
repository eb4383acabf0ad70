#!/usr/bin/env python3
"""One huge clip among small ones, for the benchmarks:

    python3 bench/bench_gen_huge.py OUTDIR

41 clips of float32 [T, 1024] features (feat/{clip}.npy): clip h020 has
T = 131072 (512 MiB), the others 100-199 frames. Writes clips.txt last.
"""
import os
import sys

import numpy as np

out = sys.argv[1]
os.makedirs(os.path.join(out, "feat"), exist_ok=True)
rng = np.random.default_rng(7)
ids = ["h%03d" % i for i in range(41)]
for i, c in enumerate(ids):
    rows = 131072 if i == 20 else int(rng.integers(100, 200))
    np.save("%s/feat/%s.npy" % (out, c), rng.standard_normal((rows, 1024), dtype=np.float32))
with open(os.path.join(out, "clips.txt"), "w") as f:
    f.write("\n".join(ids) + "\n")
