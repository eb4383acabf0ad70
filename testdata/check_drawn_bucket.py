#!/usr/bin/env python3
"""Epochs drawn at read time from a dataset in a bucket (clipshard push):

    python3 testdata/check_drawn_bucket.py DS s3://BUCKET/PREFIX CACHE_ROOT

DS is the dataset folder that was pushed. Checks:
- 2 ranks, a node each (a cache each), read epochs 0 and 1 from the
  bucket: every batch byte-equal to the same Loader's over the folder;
- egress: epoch 0 alone, the bytes both nodes fetched are about the
  dataset's once (at most 1.3x its blobs: each rank fetches the blocks
  of its own stretch of the order, not the whole dataset), and at least
  what the ranks' windows need;
- a cache too small for the dataset's files is refused, naming
  cache_limit;
- a state saved in epoch 0 resumes on 1 rank with another batch size:
  the two runs read each window of the epoch once.
Prints "ok: drawn bucket ..." or raises.
"""
import hashlib
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402

ds, url, root = sys.argv[1:4]
OPTS = dict(window=8, seed=3, buffer="4MiB", hold="1MiB")
man = json.load(open(os.path.join(ds, "dataset.json")))
blobs = sum(os.path.getsize(os.path.join(ds, m["file"])) for m in man["modalities"])


def digest(L, n=None):
    out, k = [], 0
    while L.epoch is not None:
        for b in L:
            h = hashlib.sha256()
            for name in sorted(b):
                h.update(np.ascontiguousarray(np.asarray(b[name])).tobytes())
            out.append(h.hexdigest())
            k += 1
            if n is not None and k == n:
                return out
    return out


def loader(where, rank, world, epochs, B=16, cache=None, limit="64MiB"):
    kw = dict(cache_dir=cache, cache_limit=limit) if cache else {}
    return clipshard.Loader(dataset=where, epochs=epochs, rank=rank, world_size=world, batch_size=B, **kw, **OPTS)


# Byte-equal batches, 2 ranks on 2 nodes.
for rank in (0, 1):
    want = digest(loader(ds, rank, 2, [0, 1]))
    got = digest(loader(url, rank, 2, [0, 1], cache=os.path.join(root, "node%d" % rank)))
    assert got == want and len(want) > 4, (rank, len(got), len(want))

# Egress of one epoch over 2 nodes.
fetched = 0
for rank in (0, 1):
    c = os.path.join(root, "egress%d" % rank)
    L = loader(url, rank, 2, [0], cache=c)
    digest(L)
    fetched += sum(s.remote.fetched for s in L.drawn.sources)
    L.close()
ratio = fetched / blobs
assert 0.5 < ratio <= 1.3, ("egress", fetched, blobs, ratio)  # (256 KiB blocks fetched in 64 KiB BLOCKSUMS blocks: ~1.24x)

# A cache too small for the dataset's files.
try:
    loader(url, 0, 1, [0], cache=os.path.join(root, "small"), limit="1MiB")
    raise AssertionError("a cache of 1 MiB was taken")
except ValueError as e:
    assert "cache_limit" in str(e), e

# Resume from the bucket with another world size and batch size.
seen = []
L = loader(url, 0, 1, [0], B=8, cache=os.path.join(root, "node0"))
k = 0
for b in L:
    seen += [tuple(x) for x in b["samples"].tolist()]
    k += 1
    if k == 3:
        break
st = json.loads(json.dumps(L.state_dict()))
L.close()
L = loader(url, 0, 1, [0], B=5, cache=os.path.join(root, "node0"))
L.load_state_dict(st)
for b in L:
    seen += [tuple(x) for x in b["samples"].tolist()]
o = L.drawn.order(0)
assert len(set(seen)) == len(seen) and o.samples - len(seen) < 5, (len(seen), o.samples)

# torch (when installed): EpochDataset(dataset=s3://...) pickled into
# spawned DataLoader workers, each opening the bucket and the node's cache
# again: the same batches as the folder's.
torch_note = ""
try:
    import torch  # noqa: F401
except ImportError:
    torch = None
if torch is not None:
    import clipshard.torch as ct
    from spawned import spawned
    want = [b["samples"] for b in ct.EpochDataset(dataset=ds, epoch=1, batch_size=16, **OPTS)]
    got, err = spawned(ct.EpochDataset(dataset=url, epoch=1, batch_size=16, cache_dir=os.path.join(root, "spawn"),
                                       cache_limit="64MiB", **OPTS), 2)
    assert got is not None, err
    assert len(got) == len(want) > 4 and all(torch.equal(a["samples"], b) for a, b in zip(got, want)), "EpochDataset spawn"
    torch_note = "; torch EpochDataset in spawned workers"
shutil.rmtree(root, ignore_errors=True)
print("ok: drawn bucket: 2 nodes byte-equal to the folder; egress of one epoch %.3fx the blobs (%d of %d bytes); a small cache "
      "refused; resumed with another batch size%s" % (ratio, fetched, blobs, torch_note))
