#!/usr/bin/env python3
"""Check a clipshard dataset against its sources with numpy alone.

    python3 testdata/check_dataset.py DATASET_DIR CLIP_LIST ROOT

For every modality in dataset.json: np.load(blob, mmap_mode="r") must equal,
bit for bit, np.concatenate([x.astype(np.float16) for x in clips]) built here
from the sources (pickles loaded with pickle, keys joined along the last
axis, rows cut as --align trim would, skipped clips left out); NaN positions
must match. Also: data starts at a 4096-aligned offset, index.npy holds
(start, length) with start_0 = 0 and no gaps, and the header agrees with
dataset.json. A per-clip modality (NAME@clip=) must equal
np.stack([np.asarray(x).astype(np.float16) for x in clips]): one row per
clip, whatever the value's shape (a scalar gives [N]). Prints "ok" or raises.
"""
import json
import os
import pickle
import sys

import numpy as np

ds_dir, clip_list, root = sys.argv[1:4]
meta = json.load(open(os.path.join(ds_dir, "dataset.json")))
assert meta["format"] == "clipshard.dataset" and meta["version"] == 1, meta
clips = []
for line in open(clip_list):
    line = line.strip()
    if line and not line.startswith("#"):
        clips.append(line)
skipped = {s["clip"] for s in (meta.get("skipped") or [])}
clips = [c for c in clips if c not in skipped]
assert meta["clips"] == len(clips), (meta["clips"], len(clips))


def load(m, clip):
    path = os.path.join(root, m["template"].replace("{clip}", clip))
    if path.endswith(".npy"):
        return np.load(path)
    with open(path, "rb") as f:
        obj = pickle.load(f)
    if not m["keys"]:
        return np.asarray(obj)
    parts = []
    for k in m["keys"].split("+"):
        v = obj
        for step in k.split("/"):
            v = v[int(step)] if isinstance(v, (list, tuple)) else v[step]
        parts.append(np.asarray(v))
    return np.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0]


mods = meta["modalities"]
sources = {m["name"]: [load(m, c) for c in clips] for m in mods}
lengths = []
for i, c in enumerate(clips):
    frames = [len(sources[m["name"]][i]) // m["rate"] for m in mods if not m.get("per_clip")]
    lengths.append(min(frames))
    if meta["align"] == "strict":
        assert len(set(frames)) == 1, (c, frames)

index = np.load(os.path.join(ds_dir, "index.npy"))
assert index.dtype == np.int64 and index.shape == (len(clips), 2), (index.dtype, index.shape)
starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
assert np.array_equal(index[:, 0], starts) and np.array_equal(index[:, 1], lengths), index
assert meta["frames"] == int(np.sum(lengths))

for m in mods:
    blob = np.load(os.path.join(ds_dir, m["file"]), mmap_mode="r")
    assert blob.offset % 4096 == 0 and blob.offset == m["data_offset"], (m["file"], blob.offset)
    out_dtype = np.float16 if m["dtype"] == "<f2" else np.dtype(m["dtype"])
    with np.errstate(all="ignore"):
        if m.get("per_clip"):
            assert m["rate"] == 0, m
            want = np.stack([np.asarray(x).astype(out_dtype) for x in sources[m["name"]]])
        else:
            parts = [x[: n * m["rate"]].astype(out_dtype) for x, n in zip(sources[m["name"]], lengths)]
            want = np.concatenate(parts)
    assert blob.dtype == want.dtype and blob.shape == want.shape, (m["name"], blob.dtype, blob.shape, want.shape)
    assert list(blob.shape[1:]) == m["frame_shape"] and blob.shape[0] == m["rows"], m
    got_bits = np.asarray(blob).view(np.uint8)
    want_bits = np.ascontiguousarray(want).view(np.uint8)
    if not np.array_equal(got_bits, want_bits):
        nan_ok = np.isnan(np.asarray(blob, dtype=np.float32)) == np.isnan(want.astype(np.float32))
        same = (np.asarray(blob) == want) | (np.isnan(np.asarray(blob, dtype=np.float32)) & np.isnan(want.astype(np.float32)))
        bad = np.argwhere(~same)
        assert nan_ok.all() and same.all(), (m["name"], "differs at", bad[:5].tolist())
print("ok: %d clips, %d frames, modalities %s" % (len(clips), meta["frames"], [m["name"] for m in mods]))
