#!/usr/bin/env python3
"""Check python/clipshard_reader.py against the shard files.

    python3 testdata/check_reader.py EPOCHS_DIR
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from clipshard_reader import EpochShards  # noqa: E402

edir = sys.argv[1]
reader0 = EpochShards(edir, epoch=0, rank=0)
man = reader0.manifest
for ep in man["epochs"]:
    for rank in range(man["world_size"]):
        r = EpochShards(edir, epoch=ep["epoch"], rank=rank)
        assert len(r) == ep["per_rank"], (len(r), ep["per_rank"])
        want = {name: [] for name in r.modalities + ["samples"]}
        for sh in r.shards:
            for name in want:
                want[name].append(np.load(os.path.join(edir, sh["files"][name])))
        want = {k: np.concatenate(v) for k, v in want.items()}
        for read in (False, True):
            for bs in (1, 4, 7, 1000):
                got = list(r.batches(bs, read=read))
                assert all(len(b["samples"]) == bs for b in got[:-1]), (bs, read)
                for name in want:
                    cat = np.concatenate([b[name] for b in got])
                    assert cat.dtype == want[name].dtype and cat.shape == want[name].shape, (name, bs, read)
                    assert np.array_equal(cat.view(np.uint8), want[name].view(np.uint8)), (name, bs, read)
        dropped = list(r.batches(7, drop_last=True))
        assert all(len(b["samples"]) == 7 for b in dropped)
        replay = EpochShards(edir, epoch=ep["epoch"], rank=rank, replay_seed=1, virtual_epoch=5)
        assert sorted(s["shard"] for s in replay.shards) == [s["shard"] for s in r.shards]
        assert sum(len(b["samples"]) for b in replay.batches(3)) == len(r)

# The read-ahead asks for every data byte of every shard file of a rank
# once, in order, and for nothing else.
real = os.posix_fadvise
for rank in range(man["world_size"]):
    r = EpochShards(edir, epoch=man["epochs"][0]["epoch"], rank=rank)
    asked = {}
    names = {}

    def record(fd, off, n, advice):
        assert advice == os.POSIX_FADV_WILLNEED and n > 0
        path = os.readlink("/proc/self/fd/%d" % fd)
        asked.setdefault(path, []).append((off, n))

    os.posix_fadvise = record
    try:
        for bs, prefetch, read in ((3, 1, False), (5, None, False), (1000, 2, False), (4, 3, True)):
            asked.clear()
            got = sum(len(b["samples"]) for b in r.batches(bs, read=read, prefetch=prefetch))
            assert got == len(r)
            want = {}
            for sh in r.shards:
                for name in r.modalities + ["samples"]:
                    path = os.path.realpath(os.path.join(edir, sh["files"][name]))
                    a = np.load(path, mmap_mode="r")
                    want[path] = (a.offset, a.offset + a.nbytes)
            assert set(asked) == set(want), (sorted(asked), sorted(want))
            for path, ranges in asked.items():
                pos = want[path][0]
                for off, n in ranges:
                    assert off == pos, (path, off, pos, bs)
                    pos += n
                assert pos == want[path][1], (path, pos, want[path], bs)
        asked.clear()
        assert sum(len(b["samples"]) for b in r.batches(4, read=True)) == len(r) and not asked
    finally:
        os.posix_fadvise = real
print("ok: reader")
