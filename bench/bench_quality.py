#!/usr/bin/env python3
"""Shuffle quality of the orders a trainer could read (just bench read).

    python3 bench/bench_quality.py EDIR [BATCH]

EDIR holds epochs 0 and 1 of a dataset (shuffle). Orders compared, with
clipshard.quality.measure (the figures `shuffle --json` reports) and one
more: the share of neighbouring clip pairs of an epoch's order that were
neighbours in the epoch before too (0 for independent epochs; high when
an epoch repeats the one before).
- clipshard: epoch 1 as materialised (a full shuffle of fresh windows);
- replay: epoch 0 read in a seeded shard order as virtual epoch 1;
- replay + mix K: the same, samples shuffled across blocks of K shards;
- peers, simulated on the same samples stored in clip order (by clip,
  then start) in shards of the same size: WebDataset (shard order
  shuffled, then a 1000-sample shuffle buffer), FFCV quasi-random (8 MiB
  pages of 355 KB samples, page order shuffled, samples shuffled within
  groups of 2 x batch pages), Mosaic py1e (shard order shuffled, each
  sample moved uniformly within a block of 262144 samples).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402

edir = sys.argv[1]
B = int(sys.argv[2]) if len(sys.argv) > 2 else 256
man = clipshard.load_epochs(edir)
S = man["shard_samples"]


def epoch(e):
    shards = sorted(next(x for x in man["epochs"] if x["epoch"] == e)["shards"], key=lambda s: s["shard"])
    return np.concatenate([np.load(os.path.join(edir, s["files"]["samples"])) for s in shards])


def read(**kw):
    r = clipshard.EpochReader(edir, batch_size=1024, remainder="pad", **kw)
    out = np.concatenate([b["samples"] for b in r.batches(0, 1)])
    return out[: r.samples]


def clip_order(s):
    return s[np.lexsort((s[:, 1], s[:, 0]))]


def webdataset(s, seed):
    rng = np.random.default_rng(seed)
    st = clip_order(s)
    shards = [st[k * S: (k + 1) * S] for k in rng.permutation(-(-len(st) // S))]
    stream = np.concatenate(shards)
    buf, out = [], []
    for x in stream:
        if len(buf) < 1000:
            buf.append(x)
            continue
        i = rng.integers(len(buf))
        out.append(buf[i])
        buf[i] = x
    rng.shuffle(buf)
    return np.array(out + buf)


def ffcv(s, seed, sample_bytes=355 << 10, page=8 << 20):
    rng = np.random.default_rng(seed)
    st = clip_order(s)
    per = max(1, page // sample_bytes)
    pages = [st[i: i + per] for i in range(0, len(st), per)]
    order = rng.permutation(len(pages))
    out = []
    for g in range(0, len(order), 2 * B):
        group = np.concatenate([pages[i] for i in order[g: g + 2 * B]])
        out.append(group[rng.permutation(len(group))])
    return np.concatenate(out)


def py1e(s, seed, block=1 << 18):
    rng = np.random.default_rng(seed)
    st = clip_order(s)
    shards = [st[k * S: (k + 1) * S] for k in rng.permutation(-(-len(st) // S))]
    stream = np.concatenate(shards)
    key = np.arange(len(stream)) + rng.uniform(-block / 2, block / 2, len(stream))
    return stream[np.argsort(key, kind="stable")]


def kept(a, b):
    """Share of a's neighbouring clip pairs that are neighbours in b."""
    pa = set(zip(a[:-1, 0].tolist(), a[1:, 0].tolist()))
    pb = set(zip(b[:-1, 0].tolist(), b[1:, 0].tolist())) | set(zip(b[1:, 0].tolist(), b[:-1, 0].tolist()))
    pa = {p for p in pa if p[0] != p[1]}
    return len(pa & pb) / max(1, len(pa))


e0, e1 = epoch(0), epoch(1)
rows = [("clipshard epoch (full shuffle)", e1, e0)]
rows.append(("replay of epoch 0", read(epoch=0, replay_seed=7, virtual_epoch=1), read(epoch=0, replay_seed=7, virtual_epoch=0)))
for K in (8, 64):
    rows.append(("replay + mix %d shards" % K, read(epoch=0, replay_seed=7, virtual_epoch=1, mix_shards=K),
                 read(epoch=0, replay_seed=7, virtual_epoch=0, mix_shards=K)))
rows.append(("WebDataset, 1000-sample buffer", webdataset(e0, 1), webdataset(e0, 0)))
rows.append(("FFCV quasi-random", ffcv(e0, 1), ffcv(e0, 0)))
rows.append(("Mosaic py1e", py1e(e0, 1), py1e(e0, 0)))
print("| order | distinct clips / batch of %d (mean, min) | same-clip neighbours | mean displacement | Spearman ρ | clip pairs kept from the epoch before |" % B)
print("| --- | --- | --- | --- | --- | --- |")
for name, o, prev in rows:
    q = clipshard.quality.measure(o, B)
    print("| %s | %.1f, %d | %.4f | %.3f | %.3f | %.3f |" % (name, q["distinct_clips_mean"], q["distinct_clips_min"],
          q["same_clip_neighbours"], q["mean_displacement"], q["spearman"], kept(o, prev)))
print("(%d samples an epoch, %d clips, shards of %d)" % (len(e1), len(set(e1[:, 0].tolist())), S))
