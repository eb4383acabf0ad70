#!/usr/bin/env python3
"""Generate a benchmark source set with numpy (used by bench/bench_*.sh).

    python3 bench/bench_gen.py OUT CLIPS T_MIN T_MAX DIM

Per clip c%05d: feat/{clip}.npy float32 [T, DIM] and motion/{clip}.pkl, a
protocol-4 pickle {"exp": float32 [T, 50], "pose": float32 [T, 6]}; T is
T_MIN when T_MIN == T_MAX, else uniform in [T_MIN, T_MAX). Writes
clips.txt last, so a set with clips.txt is complete.
"""
import os
import pickle
import sys

import numpy as np

out = sys.argv[1]
n, tmin, tmax, dim = (int(x) for x in sys.argv[2:6])
os.makedirs(out + "/feat", exist_ok=True)
os.makedirs(out + "/motion", exist_ok=True)
rng = np.random.default_rng(0)
clips = []
for i in range(n):
    c = "c%05d" % i
    t = tmin if tmin == tmax else int(rng.integers(tmin, tmax))
    np.save("%s/feat/%s.npy" % (out, c), rng.standard_normal((t, dim), dtype=np.float32))
    with open("%s/motion/%s.pkl" % (out, c), "wb") as g:
        pickle.dump({"exp": rng.standard_normal((t, 50), dtype=np.float32),
                     "pose": rng.standard_normal((t, 6), dtype=np.float32)}, g, protocol=4)
    clips.append(c)
with open(out + "/clips.txt", "w") as f:
    f.write("".join(c + "\n" for c in clips))
