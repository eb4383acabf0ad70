#!/usr/bin/env python3
"""Generate the mixed benchmark set of just bench convert with numpy: the
kind users have.

    python3 bench/bench_gen_mixed.py OUT [CLIPS] [HUGE]

Per clip c%05d, T uniform in [100, 200) frames:
  motion/{clip}.pkl   protocol-4 pickle {"exp": float32 [T, 50], "pose": float32 [T, 6]}
  whisper/{clip}.npy  float16 [2T, 512]   (features stored as float16)
  w2v/{clip}.npy      float32 [T, 1024]
  emotion/{clip}.npy  float32 [T, 8]
A quarter of each .npy modality's files are stored otherwise, cycling
through big-endian, Fortran order and float64 (whisper: big-endian and
Fortran only, to stay float16). With HUGE, clip c00000 has HUGE times
the median length (150 frames): one huge clip among the others. Writes
clips.txt last.
"""
import os
import pickle
import sys

import numpy as np

out = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 400
huge = int(sys.argv[3]) if len(sys.argv) > 3 else 0
for d in ("motion", "whisper", "w2v", "emotion"):
    os.makedirs(os.path.join(out, d), exist_ok=True)
rng = np.random.default_rng(0)


def save(path, a, i, allow64=True):
    kind = i % 12  # a quarter of the files: 3 kinds of 12
    if kind == 1:
        a = a.astype(a.dtype.newbyteorder(">"))
    elif kind == 5:
        a = np.asfortranarray(a)
    elif kind == 9 and allow64:
        a = a.astype(np.float64)
    np.save(path, a)


clips = []
for i in range(n):
    c = "c%05d" % i
    t = int(rng.integers(100, 200))
    if i == 0 and huge:
        t = 150 * huge
    with open("%s/motion/%s.pkl" % (out, c), "wb") as g:
        pickle.dump({"exp": rng.standard_normal((t, 50), dtype=np.float32),
                     "pose": rng.standard_normal((t, 6), dtype=np.float32)}, g, protocol=4)
    save("%s/whisper/%s.npy" % (out, c), rng.standard_normal((2 * t, 512), dtype=np.float32).astype(np.float16), i, False)
    save("%s/w2v/%s.npy" % (out, c), rng.standard_normal((t, 1024), dtype=np.float32), i)
    save("%s/emotion/%s.npy" % (out, c), rng.random((t, 8), dtype=np.float32), i)
    clips.append(c)
open(out + "/clips.txt", "w").write("\n".join(clips) + "\n")
