#!/usr/bin/env python3
"""Make broken stand-ins for demo clip003's sources, with real numpy.

    python3 testdata/convert/gen.py [OUTDIR]      (default: this folder)

Each file replaces one source of clip003 in a copy of testdata/demo, and
convert must refuse it with one line naming the file, the clip and the key.
"""
import os
import pickle
import sys

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
out = sys.argv[1] if len(sys.argv) > 1 else here
demo = os.path.join(here, "..", "demo")
os.makedirs(out, exist_ok=True)
emo = np.load(os.path.join(demo, "emotion", "clip003.npy"))
with open(os.path.join(demo, "motion", "clip003.pkl"), "rb") as f:
    motion = pickle.load(f)
t = len(emo)


def save(name, arr):
    np.save(os.path.join(out, name), arr)


bad = emo.copy()
bad[5, 2] = np.nan
save("nan_emotion.npy", bad)
bad = emo.copy()
bad[2, 0] = 70000.0
save("overflow_emotion.npy", bad)
save("int_emotion.npy", (emo * 100).astype(np.int64))
save("short_emotion.npy", emo[:-1])
save("short5_emotion.npy", emo[:-5])  # 5 frames short: beyond the default --max-trim
save("wide_emotion.npy", np.concatenate([emo, emo[:, :1]], axis=1))
save("zerowidth_emotion.npy", emo[:, :0])  # shape (T, 0): frames hold no values
with open(os.path.join(out, "nopose_motion.pkl"), "wb") as f:
    pickle.dump({"exp": motion["exp"], "fps": 30}, f, protocol=4)
data = pickle.dumps(motion, protocol=4)
with open(os.path.join(out, "truncated_motion.pkl"), "wb") as f:
    f.write(data[: len(data) // 2])
print("wrote broken sources for clip003 (T=%d) to %s" % (t, out))
