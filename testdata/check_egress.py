#!/usr/bin/env python3
"""Cluster egress of training from a bucket (issue #34, point 3): ranks on
separate nodes (a cache each) fetch only the block ranges of their own
slices, so the epoch's bytes cross the network about once, not once a
node; the ranks of a node (LOCAL_WORLD_SIZE, sharing a cache) fetch their
node's slices once.

    python3 testdata/check_egress.py EDIR s3://BUCKET/PREFIX CACHE_ROOT B

EDIR is the epochs folder that was pushed (with BLOCKSUMS), B the batch
size. Each case runs its ranks as processes at once, each reading its
whole epoch (the Loader; and EpochReader for one case) under a cache
limit that forces eviction, then checks:
- every rank's batches equal the folder's, byte for byte;
- the bytes all ranks fetched: at most 1.1x the epoch's (of the samples
  they read: a remainder is dropped), for R = 2 and 4 ranks, a node each,
  and 4 ranks on 2 nodes of 2; not R x;
- the cache's size (du), sampled while the ranks read, never above the
  limit;
- a rank that resumes from a state (another world size and batch size)
  reads the rest exactly.
Prints "ok: egress ..." with the ratios.
"""
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import clipshard  # noqa: E402

edir, url, root, B = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
man = clipshard.load_epochs(edir)
e = man["epochs"][0]["epoch"]
epoch_bytes = sum(os.path.getsize(os.path.join(edir, f)) for s in man["epochs"][0]["shards"] for f in s["files"].values())

RANK = r'''
import json, os, sys, hashlib
sys.path.insert(0, %r)
import numpy as np
import clipshard
rank, R, B, url, cache, limit, kind = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6]), sys.argv[7]
if kind == "reader":
    r = clipshard.EpochReader(url, %d, rank=rank, world_size=R, batch_size=B, cache_dir=cache, cache_limit=limit)
    batches, remote = r, r.files.remote
else:
    r = clipshard.Loader(url, %d, rank=rank, world_size=R, batch_size=B, cache_dir=cache, cache_limit=limit)
    batches, remote = r, r._remote
h = hashlib.sha256()
n = 0
for b in batches:
    for k in sorted(b):
        h.update(np.ascontiguousarray(np.asarray(b[k])).tobytes())
    n += 1
print(json.dumps({"fetched": remote.fetched, "received": remote.bucket.bytes, "gets": remote.bucket.gets, "batches": n,
                  "sha256": h.hexdigest()}))
''' % (os.path.join(HERE, "..", "python"), e, e)


def local_digest(rank, R):
    h = hashlib.sha256()
    n = 0
    for b in clipshard.Loader(edir, e, rank=rank, world_size=R, batch_size=B):
        for k in sorted(b):
            h.update(np.ascontiguousarray(np.asarray(b[k])).tobytes())
        n += 1
    return h.hexdigest(), n


class Du:
    """Each cache's disk use (du: allocated blocks), sampled every 5 ms."""

    def __init__(self, paths):
        self.paths, self.peak, self.stop = paths, {p: 0 for p in paths}, threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop.is_set():
            for p in self.paths:
                total = 0
                for r, _, names in os.walk(p):
                    for n in names:
                        try:
                            total += os.lstat(os.path.join(r, n)).st_blocks * 512
                        except FileNotFoundError:
                            pass
                self.peak[p] = max(self.peak[p], total)
            time.sleep(0.005)

    def done(self):
        self.stop.set()
        self.t.join()
        return max(self.peak.values())



def least_limit(cache):
    try:
        clipshard.EpochReader(url, e, rank=0, world_size=2, batch_size=B, cache_dir=cache, cache_limit=1)
    except ValueError as err:
        m = re.search(r"give cache_limit >= [0-9.]+ [KMGT]iB \((\d+) bytes\)", str(err))
        assert m, err
        return int(m.group(1))
    raise SystemExit("a cache_limit of 1 byte was taken")


_r = clipshard.EpochReader(edir, e)
group = clipshard._shards.group_disk_bytes(_r.shards, _r.expect)
# One group more than the least a reader takes (a cache a node: the ranks
# sharing one get as many times that): far below the epoch, so the caches
# evict.
limit = least_limit(os.path.join(root, "probe")) + group
assert limit < epoch_bytes, (limit, epoch_bytes, "the limit must force eviction")
ratios = []
n_case = [0]
for R, per_node, kind in ((2, 1, "loader"), (4, 1, "loader"), (4, 2, "loader"), (2, 1, "reader")):
    n_case[0] += 1
    nodes = R // per_node
    caches = [os.path.join(root, "case-%d-node-%d" % (n_case[0], i)) for i in range(nodes)]
    du = Du(caches)
    procs = []
    for rank in range(R):
        env = dict(os.environ)
        if per_node > 1:
            env.update(LOCAL_WORLD_SIZE=str(per_node), LOCAL_RANK=str(rank % per_node))
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(R), str(B), url, caches[rank // per_node], str(limit * per_node), kind],
                                      stdout=subprocess.PIPE, text=True, env=env))
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out
        outs.append(json.loads(out.strip().splitlines()[-1]))
    peak = du.done()
    for rank, o in enumerate(outs):
        want, n = local_digest(rank, R)
        assert o["batches"] == n and o["sha256"] == want, ("rank %d of %d: not the folder's batches" % (rank, R), o, n)
    fetched = sum(o["fetched"] for o in outs)
    # Against the bytes of the samples read (the remainder too short for a
    # global batch is dropped, and never fetched).
    read = sum(o["batches"] for o in outs) * B
    ratio = fetched / (epoch_bytes * read / man["epochs"][0]["samples"])
    ratios.append("R=%d (%d a node, %s): %.3f (%d GETs)" % (R, per_node, kind, ratio, sum(o["gets"] for o in outs)))
    assert ratio <= 1.1, ("cluster egress", R, per_node, ratio, ratios)
    assert peak <= limit * per_node, ("a cache grew past its limit", peak, limit * per_node)

# Resume: 2 nodes read part of the epoch, then 3 nodes go on from the
# state with another batch size: exactly the rest.
c = [os.path.join(root, "resume-%d" % i) for i in range(3)]
first = clipshard.Loader(url, e, rank=0, world_size=2, batch_size=B, cache_dir=c[0], cache_limit=limit)
it = iter(first)
for _ in range(2):
    next(it)
st = first.state_dict()
first.close()
order = np.concatenate([np.asarray(b["samples"]).copy() for b in clipshard.EpochReader(edir, e, batch_size=1)])
rest = []
for rank in range(3):
    ld = clipshard.Loader(url, e, rank=rank, world_size=3, batch_size=B // 2 + 1, cache_dir=c[rank], cache_limit=limit)
    ld.load_state_dict(st)
    rest.append([np.asarray(b["samples"]).copy() for b in ld])
got = np.concatenate([b for batches in zip(*rest) for b in batches])
lo = st["consumed"]
assert np.array_equal(got, order[lo: lo + len(got)]) and len(order) - lo - len(got) < 3 * (B // 2 + 1), ("resume", lo, len(got), len(order))
print("ok: egress; epoch %d bytes, cache limit %d; %s; resumed on 3 nodes with another batch size" % (epoch_bytes, limit, "; ".join(ratios)))
