#!/usr/bin/env python3
"""Make the demo set with real numpy: 12 clips of audio-to-motion data.

    python3 testdata/demo/gen.py [OUTDIR]     (default: this folder)

Per clip: motion/{clip}.pkl, a pickled dict {"exp": float32 [T, 50],
"pose": float32 [T, 6], "shape": float32 [100] (identity coefficients,
one vector per clip), "fps": 30} (pickle protocols 2, 4 and 5 in turn);
whisper/{clip}.npy, float16 [2T, 64] (two rows per motion frame);
emotion/{clip}.npy, float64 [T, 8] (big-endian for every third clip).
clips.txt lists the clips. expected.py rebuilds what convert must produce.
"""
import os
import pickle
import sys

import numpy as np

out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
for sub in ("motion", "whisper", "emotion"):
    os.makedirs(os.path.join(out, sub), exist_ok=True)
rng = np.random.default_rng(2026)
shape_rng = np.random.default_rng(100)  # its own stream: the other arrays stay as they were
clips = ["clip%03d" % i for i in range(12)]
with open(os.path.join(out, "clips.txt"), "w") as f:
    f.write("# demo clip list: one id per line\n")
    for c in clips:
        f.write(c + "\n")
for i, c in enumerate(clips):
    t = int(rng.integers(20, 90))
    motion = {
        "exp": (rng.standard_normal((t, 50)) * 0.5).astype(np.float32),
        "pose": (rng.standard_normal((t, 6)) * 0.1).astype(np.float32),
        "shape": shape_rng.standard_normal(100).astype(np.float32),
        "fps": 30,
    }
    with open(os.path.join(out, "motion", c + ".pkl"), "wb") as f:
        pickle.dump(motion, f, protocol=(2, 4, 5)[i % 3])
    np.save(os.path.join(out, "whisper", c + ".npy"), rng.standard_normal((2 * t, 64)).astype(np.float16))
    emo = rng.random((t, 8))
    if i % 3 == 0:
        emo = emo.astype(">f8")
    np.save(os.path.join(out, "emotion", c + ".npy"), emo)
print("wrote %d clips to %s" % (len(clips), out))
