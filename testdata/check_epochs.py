#!/usr/bin/env python3
"""Check epoch shards against their dataset with numpy alone.

    python3 testdata/check_epochs.py EPOCHS_DIR

For every epoch and shard in epochs.json: the shard files open with
np.load(mmap_mode="r") (data 4096-aligned) with shape [S, W*rate, *frame]
([S, *frame] for a per-clip modality, holding each sample's clip row);
the shards hold the epoch's samples in order, shard_samples each (the last
fewer); every sample (clip, start, valid) equals the dataset rows of its
clip [start*rate, (start+W)*rate), zeros past valid; with tile sampling no
window is there twice, and each clip's windows in an epoch start at one
offset modulo W (that every whole window is covered is checked in Go).
Prints "ok" or raises.
"""
import collections
import json
import os
import sys

import numpy as np

edir = sys.argv[1]
man = json.load(open(os.path.join(edir, "epochs.json")))
assert man["format"] == "clipshard.epochs" and man["version"] == 2
assert "world_size" not in man
ds = man["dataset"]["dir"]
dsman = json.load(open(os.path.join(ds, "dataset.json")))
index = np.load(os.path.join(ds, "index.npy"))
blobs = {m["name"]: np.load(os.path.join(ds, m["file"]), mmap_mode="r") for m in dsman["modalities"]}
rates = {m["name"]: m["rate"] for m in dsman["modalities"]}
per_clip = {m["name"] for m in dsman["modalities"] if m.get("per_clip")}
W = man["window"]
S = man["shard_samples"]
total = 0
for ep in man["epochs"]:
    seen = set()
    by_clip = collections.defaultdict(list)
    first = 0
    for k, sh in enumerate(ep["shards"]):
        assert sh["shard"] == k and sh["first"] == first, (sh, first)
        assert sh["samples"] == S or k == len(ep["shards"]) - 1, sh
        assert all(f.startswith(ep["dir"] + "/") and "/" not in f[len(ep["dir"]) + 1:] for f in sh["files"].values()), sh
        smp = np.load(os.path.join(edir, sh["files"]["samples"]), mmap_mode="r")
        assert smp.dtype == np.int64 and smp.shape == (sh["samples"], 3), (sh, smp.shape)
        first += len(smp)
        arrays = {}
        for m in man["modalities"]:
            a = np.load(os.path.join(edir, sh["files"][m["name"]]), mmap_mode="r")
            assert a.offset % 4096 == 0, a.offset
            assert m.get("per_clip", False) == (m["name"] in per_clip), m
            want_shape = (len(smp), *m["frame_shape"]) if m["name"] in per_clip else (len(smp), W * m["rate"], *m["frame_shape"])
            assert a.dtype == blobs[m["name"]].dtype and a.shape == want_shape, (a.shape, want_shape, m)
            arrays[m["name"]] = a
        for i, (clip, start, valid) in enumerate(smp):
            key = (int(clip), int(start))
            if man["sampling"] == "tile":  # random draws may repeat a window
                assert key not in seen, ("sample twice", ep["epoch"], key)
            seen.add(key)
            by_clip[int(clip)].append((int(start), int(valid)))
            c0, length = index[clip]
            assert 0 < valid <= W and start + valid <= length, (clip, start, valid, length)
            for name, a in arrays.items():
                if name in per_clip:
                    assert np.array_equal(np.atleast_1d(a[i]).view(np.uint8), np.atleast_1d(blobs[name][clip]).view(np.uint8)), (name, clip)
                    continue
                r = rates[name]
                want = blobs[name][(c0 + start) * r : (c0 + start + valid) * r]
                got = a[i]
                assert np.array_equal(got[: valid * r].view(np.uint16), want.view(np.uint16)), (name, clip, start)
                assert not got[valid * r :].view(np.uint16).any(), ("padding not zero", name, clip, start)
            total += 1
    assert first == ep["samples"], (first, ep["samples"])
    if man["sampling"] == "tile":
        for clip, wins in by_clip.items():
            length = int(index[clip][1])
            if length < W:
                assert wins == [(0, length)], (clip, wins)
                continue
            starts = sorted(s for s, _ in wins)
            o = starts[0] % W if starts else 0
            assert all(s % W == o for s in starts), (clip, starts)
    print("epoch %d: %d samples in %d shards" % (ep["epoch"], first, len(ep["shards"])))
print("ok: %d samples checked" % total)
