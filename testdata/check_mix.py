#!/usr/bin/env python3
"""Check a mixed epochs folder (shuffle --source ..., format version 3)
against its sources, with numpy alone (and torch if it is there).

    python3 testdata/check_mix.py EPOCHS_DIR [BATCH] [SHARE_TOL] [SHARE_PCT]

For every epoch: the samples files have four int64 columns (clip, start,
valid, source); the samples of each source number the epoch's recorded
count, which is the largest-remainder split of the epoch's samples by its
weights (worked out here again with fractions, not taken from Go); every
sample's rows equal its own source's rows of its clip (zeros past valid);
in every whole batch of BATCH (256) consecutive samples each source's
count is within SHARE_TOL (4) samples of its weight's share, in at least
SHARE_PCT (99) percent of the batches; sources really mix (no batch of a
mixed epoch is all one source when two have shares above a tenth). Then
clipshard.EpochReader and clipshard.Loader (world sizes 1 and 3) give
batches whose "source" equals the samples' fourth column, and
reader.sources the names; torch's EpochDataset and Loader too, if torch
imports.
Prints "ok: mix ..." or raises.
"""
import json
import os
import sys
from fractions import Fraction

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402

edir = sys.argv[1]
BATCH = int(sys.argv[2]) if len(sys.argv) > 2 else 256
TOL = int(sys.argv[3]) if len(sys.argv) > 3 else 4
PCT = float(sys.argv[4]) if len(sys.argv) > 4 else 99.0
man = json.load(open(os.path.join(edir, "epochs.json")))
assert man["format"] == "clipshard.epochs" and man["version"] == 3, man.get("version")
assert "dataset" not in man
names = [s["name"] for s in man["sources"]]
W = man["window"]


def largest_remainder(weights, n):
    ws = [Fraction(str(w)) for w in weights]
    total = sum(ws)
    q = [w * n / total for w in ws]
    out = [int(x) for x in q]  # floor (x >= 0)
    order = sorted(range(len(ws)), key=lambda i: -(q[i] - out[i]))  # stable: the earlier source first on ties
    i = 0
    while sum(out) < n:
        out[order[i % len(order)]] += 1
        i += 1
    return out


sources = []
for s in man["sources"]:
    d = json.load(open(os.path.join(s["dir"], "dataset.json")))
    assert d["clips"] == s["clips"], (s, d["clips"])
    sources.append({
        "index": np.load(os.path.join(s["dir"], "index.npy")),
        "blobs": {m["name"]: np.load(os.path.join(s["dir"], m["file"]), mmap_mode="r") for m in d["modalities"]},
    })

shares_checked = 0
worst = {}
for ep in man["epochs"]:
    n = ep["samples"]
    weights = [ep["weights"][x] for x in names]
    counts = [ep["counts"][x] for x in names]
    assert counts == largest_remainder(weights, n), (ep["epoch"], counts, weights, n)
    rows = []
    for sh in ep["shards"]:
        smp = np.load(os.path.join(edir, sh["files"]["samples"]), mmap_mode="r")
        assert smp.dtype == np.int64 and smp.shape == (sh["samples"], 4), smp.shape
        arrays = {m["name"]: np.load(os.path.join(edir, sh["files"][m["name"]]), mmap_mode="r") for m in man["modalities"]}
        for i, (clip, start, valid, src) in enumerate(smp):
            assert 0 <= src < len(names), (sh, i, src)
            S = sources[src]
            c0, length = S["index"][clip]
            assert 0 <= start and start + valid <= length and valid <= W, (ep["epoch"], i, clip, start, valid, length)
            for m in man["modalities"]:
                blob, got = S["blobs"][m["name"]], arrays[m["name"]][i]
                if m.get("per_clip"):
                    assert np.array_equal(got.view(np.uint8), blob[clip].view(np.uint8)), (m["name"], ep["epoch"], i)
                    continue
                r = m["rate"]
                want = blob[(c0 + start) * r:(c0 + start + valid) * r]
                assert np.array_equal(got[: valid * r].view(np.uint8), want.view(np.uint8)), (m["name"], ep["epoch"], i, names[src], clip, start)
                assert not got[valid * r:].view(np.uint8).any()
        rows.append(np.asarray(smp))
    order = np.concatenate(rows) if rows else np.zeros((0, 4), np.int64)
    got = np.bincount(order[:, 3], minlength=len(names)).tolist() if len(order) else [0] * len(names)
    assert got == counts, (ep["epoch"], got, counts)
    # Shares per whole batch.
    whole = n // BATCH
    if whole:
        share = [Fraction(c, n) for c in counts]
        per = np.stack([np.bincount(order[b * BATCH:(b + 1) * BATCH, 3], minlength=len(names)) for b in range(whole)])
        dev = np.abs(per - np.array([float(s * BATCH) for s in share]))
        okb = (dev <= TOL).all(axis=1)
        pct = 100.0 * okb.mean()
        assert pct >= PCT, ("epoch %d: %.1f%% of %d batches within +-%d of the shares (want %.0f%%); worst %s"
                            % (ep["epoch"], pct, whole, TOL, PCT, dev.max(axis=0)))
        big = [i for i, s in enumerate(share) if s > Fraction(1, 10)]
        if len(big) >= 2:
            assert (per[:, big] > 0).all(), ("a batch without one of the large sources", ep["epoch"])
        worst[ep["epoch"]] = float(dev.max())
        shares_checked += whole

# The readers' "source" is the samples' fourth column.
for e in [x["epoch"] for x in man["epochs"]]:
    for R, B in ((1, 64), (3, 17)):
        for rank in range(R):
            r = clipshard.EpochReader(edir, epoch=e, rank=rank, world_size=R, batch_size=B)
            assert r.sources == names and r.mixed
            for b in r:
                assert np.array_equal(b["source"], b["samples"][:, 3]) and b["source"].shape == (B,)
    with clipshard.Loader(edir, epochs=[e], batch_size=64, prefetch=2) as ld:
        assert ld.sources == names
        for b in ld:
            assert np.array_equal(b["source"], b["samples"][:, 3])
try:
    import torch  # noqa: F401
    from clipshard.torch import EpochDataset
except ImportError:
    torch = None
if torch is not None:
    from clipshard.torch import Loader as TorchLoader
    e = man["epochs"][0]["epoch"]
    ds = EpochDataset(edir, epoch=e, batch_size=32)
    for b in ds:
        assert torch.equal(b["source"], b["samples"][:, 3])
    with TorchLoader(edir, epochs=[e], batch_size=32, dtype=torch.float32) as ld:
        assert ld.sources == names
        seen = []
        for b in ld:
            assert torch.equal(b["source"], b["samples"][:, 3]) and b["source"].dtype == torch.int64
            seen.append(b["source"].clone())
        assert sum(int((torch.cat(seen) == i).sum()) for i in range(len(names))) == len(torch.cat(seen))
print("ok: mix %d epochs, %d batches of %d within +-%d of the shares (worst deviation per epoch %s), sources %s%s"
      % (len(man["epochs"]), shares_checked, BATCH, TOL, worst, names, ", torch" if torch is not None else ""))
