#!/usr/bin/env python3
"""A dataset in a bucket that grows (#61.5): epochs drawn at read time from
version 1, then from version 2 pushed over it:

    python3 testdata/check_drawn_bucket_grow.py CLIPSHARD V1 V2 s3://BUCKET/PREFIX CACHE_ROOT

V1 is a dataset folder (format 1) the bucket holds (pushed), V2 the same
dataset grown by convert --segments (version 2, which keeps version 1).
Checks:
- a Loader of the bucket (version 1) reads half of epoch 0, then
  `clipshard push V2` commits version 2 over it: the Loader reads on, and
  its epoch is byte-equal to the same Loader's over V1 (it keeps reading
  version 1, which the bucket keeps);
- a Loader of the bucket made then reads version 2: every batch byte-equal
  to the same Loader's over V2; on this node's cache, which holds version
  1's blobs, it fetches at most 1.1x the new segment's bytes + 2 MiB (the
  version's manifests);
- version=1 reads version 1 from the bucket (byte-equal to V1's), and a
  version the bucket does not keep is refused, naming it.
Prints "ok: drawn bucket grow ..." or raises.
"""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402

exe, v1, v2, url, root = sys.argv[1:6]
OPTS = dict(window=8, seed=3, buffer="4MiB", hold="1MiB", batch_size=16)
cache = os.path.join(root, "node")
man = json.load(open(os.path.join(v2, "dataset.json")))
new = sum(b["size"] for m in man["modalities"] for b in m["blobs"] if b["file"].startswith("segments/"))
assert man["version"] == 2 and new > 0, man


def batches(L):
    out = []
    for b in L:
        h = hashlib.sha256()
        for name in sorted(b):
            h.update(np.ascontiguousarray(np.asarray(b[name])).tobytes())
        out.append(h.hexdigest())
    return out


def fetched(L):
    return sum(s.remote.fetched for s in L.drawn.sources)


want1 = batches(clipshard.Loader(dataset=v1, epochs=[0], **OPTS))
want2 = batches(clipshard.Loader(dataset=v2, epochs=[0], **OPTS))
assert want1 != want2 and len(want1) > 6

# A reader of version 1 while version 2 is pushed over it.
L = clipshard.Loader(dataset=url, epochs=[0], cache_dir=cache, cache_limit="256MiB", **OPTS)
it = iter(L)
got = []
for _ in range(len(want1) // 2):
    b = next(it)
    h = hashlib.sha256()
    for name in sorted(b):
        h.update(np.ascontiguousarray(np.asarray(b[name])).tobytes())
    got.append(h.hexdigest())
r = subprocess.run([exe, "push", "--quiet", "--json", v2, url], capture_output=True, text=True)
assert r.returncode == 0, r.stderr
pushed = json.loads(r.stdout)
assert pushed["bytes_sent"] <= 1.1 * new + (2 << 20), (pushed, new)
for b in it:
    h = hashlib.sha256()
    for name in sorted(b):
        h.update(np.ascontiguousarray(np.asarray(b[name])).tobytes())
    got.append(h.hexdigest())
assert got == want1, "the reader of version 1 after version 2 was pushed"
first = fetched(L)
L.close()

# Version 2, on the node that holds version 1.
L = clipshard.Loader(dataset=url, epochs=[0], cache_dir=cache, cache_limit="256MiB", **OPTS)
assert L.drawn.versions == {L.drawn.names[0]: 2}, L.drawn.versions
assert batches(L) == want2, "version 2 from the bucket"
again = fetched(L)
assert again <= 1.1 * new + (2 << 20), ("fetched for version 2", again, new)
L.close()

# version=1 from the bucket; a version it does not keep.
assert batches(clipshard.Loader(dataset=url, epochs=[0], version=1, cache_dir=cache, cache_limit="256MiB", **OPTS)) == want1
try:
    clipshard.Loader(dataset=url, epochs=[0], version=7, cache_dir=cache, cache_limit="256MiB", **OPTS)
    raise AssertionError("version 7 was read")
except ValueError as e:
    assert "version 7 is not kept" in str(e), e
# No lock file left in the cache (each is removed by its holder once its
# file is made, or by the eviction of the file).
locks = [os.path.join(r, n) for r, _, ns in os.walk(cache) for n in ns if n.endswith(".lock")]
assert not locks, locks[:3]
print("ok: drawn bucket grow: a reader of version 1 read on after version 2 was pushed (%d bytes sent, its new segment %d); "
      "version 2 byte-equal to its folder's, fetching %d bytes on a node holding version 1 (%d at first); version=1 read "
      "from the bucket" % (pushed["bytes_sent"], new, again, first))
