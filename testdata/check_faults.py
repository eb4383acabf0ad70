#!/usr/bin/env python3
"""Reading epochs from a bucket through a fault-injecting proxy (issue #34,
point 4): every fault either delivers the right bytes or raises a
ValueError naming the object; none delivers wrong bytes.

    python3 testdata/check_faults.py EDIR s3://BUCKET/PREFIX CACHE_ROOT FAULT=ENDPOINT...

FAULT is 503, reset, truncate, stall (retried: the right bytes),
overwrite (a shard file replaced between two ranged reads: raises, naming
it), overwrite-sums (an epoch's BLOCKSUMS so: raises, naming it), or kill
(a stall proxy in which a fetcher is killed; CLIPSHARD_TEST_DIRECT_ENDPOINT
is the server itself, for the reader that takes over). EDIR is
the folder that was pushed. CHECK_WORLD=R reads with R ranks (one cache:
with the bucket's BLOCKSUMS, by the ranges of each rank's slices).
Prints "ok: faults ..." at the end.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402

edir, url, root = sys.argv[1], sys.argv[2], sys.argv[3]
man = clipshard.load_epochs(edir)
e = man["epochs"][0]["epoch"]
R = int(os.environ.get("CHECK_WORLD", "1"))


def read(src, **kw):
    """Every rank's batches, rank after rank."""
    return [{k: np.asarray(v).copy() for k, v in b.items()}
            for rank in range(R) for b in clipshard.EpochReader(src, e, rank=rank, world_size=R, batch_size=5, **kw)]


want = read(edir)
said: list = []
# First (the overwrite case below replaces objects for good): a fetcher
# killed (SIGKILL) in the middle of an object (held in the
# stall): its lock is released with it, another reader of the same cache
# takes the entry over and delivers the right bytes, and the dead
# fetcher's temporary file is gone.
stall = dict(a.split("=", 1) for a in sys.argv[4:]).get("kill")  # a stall proxy of its own
if stall:
    import signal
    import subprocess
    import time
    cache = os.path.join(root, "cache-killed")
    child = subprocess.Popen([sys.executable, "-c", """
import os, sys
sys.path.insert(0, %r)
import clipshard
for b in clipshard.EpochReader(%r, %d, rank=0, world_size=%d, batch_size=5, cache_dir=%r, cache_limit="1GiB"):
    pass
""" % (os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"), url, e, R, cache)],
        env=dict(os.environ, AWS_ENDPOINT_URL=stall))
    # It is in the middle of a fetch once it has a temporary file (a whole
    # file) or marks (blocks) and has stayed a moment (held in the stall).
    deadline = time.monotonic() + 20
    tmps: list = []
    while time.monotonic() < deadline and not tmps:
        time.sleep(0.05)
        tmps = [os.path.join(r, n) for r, _, ns in os.walk(cache) for n in ns if ".tmp.%d." % child.pid in n or n.endswith(".have")]
    assert tmps, "the child never began a fetch"
    time.sleep(0.3)
    assert child.poll() is None, "the child ended before it could be killed"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    # And as if it had died between making a file and removing its lock:
    # a lock file beside each file it made (nobody holds them).
    made = [os.path.join(r, n) for r, _, ns in os.walk(cache) for n in ns
            if n.endswith(".npy") and not os.path.exists(os.path.join(r, n + ".lock"))]
    for m in made:
        open(m + ".lock", "w").close()
    os.environ["AWS_ENDPOINT_URL"] = os.environ["CLIPSHARD_TEST_DIRECT_ENDPOINT"]  # the server itself
    got = read(url, cache_dir=cache, cache_limit="1GiB")
    assert len(got) == len(want) and all(np.array_equal(a[k], b[k]) for a, b in zip(got, want) for k in b), "after a killed fetcher"
    left = [os.path.join(r, n) for r, _, ns in os.walk(cache) for n in ns if ".tmp.%d." % child.pid in n]
    assert not left, ("the dead fetcher's temporary files are left", left)
    # The lock files the dead fetcher held, or left beside files it made,
    # are removed by the reader that took its entries over.
    # (a fetch thread reading ahead may still be between its rename, which
    # the reader took, and its lock's removal: a moment)
    deadline = time.monotonic() + 10
    while True:
        locks = [os.path.join(r, n) for r, _, ns in os.walk(cache) for n in ns if n.endswith(".lock")]
        if not locks or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not locks, ("lock files left after a killed fetcher was taken over", locks[:3])
    said.append("a fetcher killed mid-object: taken over, right bytes, no temporary or lock file of it left")
import time as _time
for i, arg in enumerate(sys.argv[4:]):
    fault, endpoint = arg.split("=", 1)
    if fault == "kill":
        continue  # below
    _t0 = _time.monotonic()
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    cache = os.path.join(root, "cache-%d" % i)
    try:
        got = read(url, cache_dir=cache, cache_limit="1GiB")
    except ValueError as err:
        named = "/BLOCKSUMS: " if fault == "overwrite-sums" else ".npy: "
        assert "s3://" in str(err) and named in str(err), (fault, "the error does not name the object", err)
        assert fault.startswith("overwrite"), (fault, "raised where retries should have delivered", err)
        said.append("%s: raised (%s)" % (fault, str(err).split(": ")[1][:60]))
        continue
    assert not fault.startswith("overwrite"), "an object replaced between two ranged reads was delivered"
    assert len(got) == len(want), (fault, len(got), len(want))
    for a, b in zip(got, want):
        for k in b:
            assert np.array_equal(a[k], b[k], equal_nan=b[k].dtype.kind == "f"), (fault, "WRONG BYTES", k)
    said.append("%s: right bytes (%.1fs)" % (fault, _time.monotonic() - _t0))
print("ok: faults; " + "; ".join(said))
