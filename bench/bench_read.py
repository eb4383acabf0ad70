#!/usr/bin/env python3
"""The training-read simulation: read one epoch's worth of batches three ways.

    python3 bench/bench_read.py SRC DATASET EPOCHS [cold|warm]

(a) shards, in order, with python/clipshard (EpochReader, one rank, batch 256);
(a') the same with batches(read=True): one read per batch and modality;
(b) random windows gathered from the dataset blobs (np.load mmap), the
    "bt_mode" of the field notes: one vectorised gather per batch;
(b') the same with madvise(MADV_RANDOM) on the maps, as a loader tuned for
    random access would do: no read-around, each window's pages only;
(c) per sample from the original files, as the field notes' __getitem__:
    np.load the whole .npy, astype(float32), slice the window; unpickle the
    motion .pkl. Timed on the first 600 samples and reported per sample.
Cold: posix_fadvise(DONTNEED) on every file involved first. The five in
turn, BENCH_ROUNDS (3) rounds; prints samples/s, median (range).
"""
import glob
import json
import mmap
import os
import pickle
import sys
import time

import numpy as np

from bench_stats import span  # noqa: E402 (bench/bench_stats.py)

src, ds, edir = sys.argv[1:4]
mode = sys.argv[4] if len(sys.argv) > 4 else "warm"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from clipshard import EpochReader  # noqa: E402


def drop(paths):
    os.sync()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


man = json.load(open(os.path.join(edir, "epochs.json")))
W = man["window"]
B = 256
shards = EpochReader(edir, epoch=0, batch_size=B, remainder="pad")
samples = np.concatenate([np.load(os.path.join(edir, s["files"]["samples"])) for s in shards.shards])
n = len(samples)
index = np.load(os.path.join(ds, "index.npy"))
clips = [l.strip() for l in open(os.path.join(src, "clips.txt")) if l.strip()]

# Every batch is copied into one preallocated buffer, as a loader copies
# into pinned memory; that copy is what touches the bytes.
pinned = {}


def land(name, arr):
    buf = pinned.get(name)
    if buf is None or buf.shape[0] < arr.shape[0]:
        buf = pinned[name] = np.empty((B,) + arr.shape[1:], dtype=arr.dtype)
    np.copyto(buf[: arr.shape[0]], arr)




def read_shards(read):
    """(a)/(a'): rank 0's epoch in order; returns the seconds taken."""
    if mode == "cold":
        drop(glob.glob(os.path.join(edir, "epoch-0000", "*.npy")))
    t = time.perf_counter()
    got = 0
    r = EpochReader(edir, epoch=0, batch_size=B, remainder="pad", read=read)
    for b in r.batches(0, 1):
        got += len(b["samples"])
        land("feat", b["feat"])
        land("motion", b["motion"])
    assert got >= n
    return time.perf_counter() - t


rows = (index[samples[:, 0], 0] + samples[:, 1])[:, None] + np.arange(W)[None, :]


def gather(advice):
    """(b)/(b'): the same windows gathered from the dataset blobs, one
    fancy index per batch, with madvise(advice) on the maps if given."""
    blobs = [os.path.join(ds, "feat.npy"), os.path.join(ds, "motion.npy")]
    feat, motion = (np.load(p, mmap_mode="r") for p in blobs)
    if advice is not None:
        for a in (feat, motion):
            a._mmap.madvise(advice)
    if mode == "cold":
        drop(blobs)
    t = time.perf_counter()
    for i in range(0, n, B):
        r = rows[i : i + B]
        land("feat", feat[r.ravel()].reshape(len(r), W, -1))
        land("motion", motion[r.ravel()].reshape(len(r), W, -1))
    return time.perf_counter() - t


# (c) per sample from the sources
k = min(n, 600)


def per_sample():
    if mode == "cold":
        drop(glob.glob(os.path.join(src, "feat", "*.npy")) + glob.glob(os.path.join(src, "motion", "*.pkl")))
    t = time.perf_counter()
    for clip, start, valid in samples[:k]:
        c = clips[clip]
        x = np.load(os.path.join(src, "feat", c + ".npy")).astype(np.float32)[start : start + W]
        with open(os.path.join(src, "motion", c + ".pkl"), "rb") as fh:
            mo = pickle.load(fh)
        y = np.concatenate([mo["exp"], mo["pose"]], axis=-1)[start : start + W]
    return (time.perf_counter() - t) * n / k


# The five ways in turn, BENCH_ROUNDS rounds (3): the median and range of
# the rounds, and each ratio to (a) round by round.
ways = [("(a) shards in order", lambda: read_shards(False)), ("(a') same, read=True", lambda: read_shards(True)),
        ("(b) random gather, blobs", lambda: gather(None)), ("(b') same, MADV_RANDOM", lambda: gather(mmap.MADV_RANDOM)),
        ("(c) per sample, sources", per_sample)]
rounds = max(1, int(os.environ.get("BENCH_ROUNDS", "3")))
load0 = open("/proc/loadavg").read().split()[0]
times = [[] for _ in ways]
for r in range(rounds):
    for i, (_, f) in enumerate(ways):
        times[i].append(f())
load1 = open("/proc/loadavg").read().split()[0]


print("%s: %d samples (W=%d, batch %d), %d rounds, load average %s–%s; samples/s median (range), and (x)/(a) round by round"
      % (mode, n, W, B, rounds, load0, load1))
for i, (label, _) in enumerate(ways):
    line = "  %-26s %s samples/s" % (label, span([n / t for t in times[i]], "%.0f"))
    if i >= 2:
        line += "   %s slower than (a)" % span([t / a for t, a in zip(times[i], times[0])], "%.1fx")
    if i == 4:
        line += " (timed on %d samples)" % k
    print(line)
