#!/usr/bin/env python3
"""Dataset-wide per-feature statistics (#64.6):

    python3 testdata/check_feature_stats.py CLIPSHARD DS GROWN TWIN

DS a dataset; GROWN one grown by convert --segments (dead rows none, but
rows in two blobs), TWIN a full convert of GROWN's clip list. Checks:
clipshard.Dataset.feature_stats() and `clipshard inspect --stats --json`
against numpy over every row of every clip (float64, ddof 0), every
modality; GROWN's equal to TWIN's. Prints "ok: feature stats ..." or
raises.
"""
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402

exe, ds, grown, twin = sys.argv[1:5]


def reference(path):
    d = clipshard.Dataset(path)
    out = {}
    for name in d.modalities:
        rows = [np.asarray(d[i][name], dtype=np.float64) for i in range(len(d))]
        per_clip = d._rate[name] == 0
        x = np.concatenate([r.reshape(1, -1) if per_clip else r.reshape(len(r), -1) for r in rows])
        out[name] = dict(mean=x.mean(0), std=x.std(0), min=x.min(0), max=x.max(0), rows=len(x))
    return out


def inspected(path):
    r = subprocess.run([exe, "inspect", "--stats", "--json", path], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return {f["name"]: f for f in json.loads(r.stdout)["feature_stats"]}


def close(a, b, rtol, what):
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    assert a.shape == b.shape and np.allclose(a, b, rtol=rtol, atol=1e-12), (what, np.abs(a - b).max())


n = 0
for path in (ds, grown, twin):
    want = reference(path)
    got = clipshard.Dataset(path).feature_stats()
    ins = inspected(path)
    for name, w in want.items():
        for k in ("mean", "std", "min", "max"):
            close(got[name][k], w[k], 1e-9, (path, name, k, "Dataset.feature_stats"))
            close(ins[name][k], w[k], 1e-6, (path, name, k, "inspect --stats"))
        assert got[name]["rows"] == w["rows"] == ins[name]["rows"], (path, name, got[name]["rows"], w["rows"], ins[name]["rows"])
        n += 1
a, b = clipshard.Dataset(grown).feature_stats(), clipshard.Dataset(twin).feature_stats()
for name in a:
    for k in ("mean", "std", "min", "max"):
        close(a[name][k], b[name][k], 1e-12, (name, k, "grown against its twin"))
try:
    clipshard.Dataset(ds).feature_stats(["nope"])
    raise AssertionError("an unknown modality taken")
except ValueError as e:
    assert str(e).startswith("names: 'nope'"), e
print("ok: feature stats: Dataset.feature_stats and inspect --stats equal numpy's over every row (%d modalities of 3 "
      "datasets), a dataset in segments equal to its twin" % n)
