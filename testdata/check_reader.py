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
print("ok: reader")
