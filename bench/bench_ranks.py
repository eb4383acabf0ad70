#!/usr/bin/env python3
"""Cold epoch read per rank, today's layout against the per-rank files of
epochs format 1 (just bench read).

    python3 bench/bench_ranks.py OLD_READER_DIR NEW_EDIR OLD_EDIR_R1 OLD_EDIR_R2 OLD_EDIR_R8

For R = 1, 2, 8 simulated ranks, every rank reads its share of epoch 0,
batch 256, memory-mapped with the readers' read-ahead, each from a cold
page cache (posix_fadvise DONTNEED on every shard file first): format 2
(one global order; rank r reads the slices [g*B*R + r*B, +B) of it) with
python/clipshard, format 1 (rank r's own files, written for that world
size) with the reader of that version. Old and new runs alternate (and
which goes first alternates); the median of 5 per rank. Prints seconds
per rank (mean over ranks of the medians) and the ratio.
"""
import glob
import importlib.util
import os
import statistics
import sys
import time

import numpy as np

old_reader, new_edir = sys.argv[1], sys.argv[2]
old_edirs = dict(zip((1, 2, 8), sys.argv[3:6]))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from clipshard import EpochReader  # noqa: E402

spec = importlib.util.spec_from_file_location("clipshard_reader", os.path.join(old_reader, "clipshard_reader.py"))
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
B = 256
buf = {}


def land(b):
    for k, v in b.items():
        dst = buf.get(k)
        if dst is None or dst.shape[0] < len(v) or dst.shape[1:] != v.shape[1:]:
            dst = buf[k] = np.empty((B,) + v.shape[1:], dtype=v.dtype)
        np.copyto(dst[: len(v)], v)
        got = len(v)
    return got


def drop(edir):
    os.sync()
    for p in glob.glob(os.path.join(edir, "epoch-0000", "**", "*.npy"), recursive=True):
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def timed(edir, batches):
    drop(edir)
    t = time.perf_counter()
    n = sum(land(b) for b in batches)
    return time.perf_counter() - t, n


print("load average at the start: %s" % open("/proc/loadavg").read().split()[0])
for R in (1, 2, 8):
    tn, to, an, bo = [], [], [], []
    for r in range(R):
        a, b = [], []
        for rep in range(5):
            for which in ((0, 1) if rep % 2 == 0 else (1, 0)):
                if which == 0:
                    t, n1 = timed(new_edir, EpochReader(new_edir, 0, rank=r, world_size=R, batch_size=B).batches(0, 1))
                    a.append(t)
                else:
                    t, n2 = timed(old_edirs[R], old.EpochShards(old_edirs[R], epoch=0, rank=r).batches(B, drop_last=True))
                    b.append(t)
        tn.append(statistics.median(a))
        to.append(statistics.median(b))
        an.append(a)
        bo.append(b)
    # the ratio of each round (the same rep of every rank), its median and range
    x = sorted(sum(a[i] for a in an) / sum(b[i] for b in bo) for i in range(5))
    print("R=%d: per rank %.3f s (format 2, slices of one order) vs %.3f s (format 1, per-rank files): %.2fx, "
          "round by round %.2fx (%.2f–%.2f)   [%d vs %d samples a rank; load average %s]"
          % (R, np.mean(tn), np.mean(to), np.mean(tn) / np.mean(to), x[2], x[0], x[-1], n1, n2,
             open("/proc/loadavg").read().split()[0]))
