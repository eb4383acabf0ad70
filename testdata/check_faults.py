#!/usr/bin/env python3
"""Reading epochs from a bucket through a fault-injecting proxy (issue #34,
point 4): every fault either delivers the right bytes or raises a
ValueError naming the object; none delivers wrong bytes.

    python3 testdata/check_faults.py EDIR s3://BUCKET/PREFIX CACHE_ROOT FAULT=ENDPOINT...

FAULT is 503, reset, truncate, stall (retried: the right bytes),
overwrite (the object replaced between two ranged reads: raises), or kill
(a stall proxy in which a fetcher is killed; CLIPSHARD_TEST_DIRECT_ENDPOINT
is the server itself, for the reader that takes over). EDIR is
the folder that was pushed. Prints "ok: faults ..." at the end.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402

edir, url, root = sys.argv[1], sys.argv[2], sys.argv[3]
man = clipshard.load_epochs(edir)
e = man["epochs"][0]["epoch"]
want = [{k: np.asarray(v).copy() for k, v in b.items()} for b in clipshard.EpochReader(edir, e, batch_size=5)]
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
for b in clipshard.EpochReader(%r, %d, batch_size=5, cache_dir=%r, cache_limit="1GiB"):
    pass
""" % (os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"), url, e, cache)],
        env=dict(os.environ, AWS_ENDPOINT_URL=stall))
    deadline = time.monotonic() + 20
    tmps = []
    while time.monotonic() < deadline and not tmps:
        time.sleep(0.05)
        tmps = [os.path.join(r, n) for r, _, ns in os.walk(cache) for n in ns if ".tmp.%d." % child.pid in n]
    assert tmps, "the child never began a fetch"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    os.environ["AWS_ENDPOINT_URL"] = os.environ["CLIPSHARD_TEST_DIRECT_ENDPOINT"]  # the server itself
    got = [{k: np.asarray(v).copy() for k, v in b.items()}
           for b in clipshard.EpochReader(url, e, batch_size=5, cache_dir=cache, cache_limit="1GiB")]
    assert len(got) == len(want) and all(np.array_equal(a["samples"], b["samples"]) for a, b in zip(got, want)), "after a killed fetcher"
    left = [t for t in tmps if os.path.exists(t)]
    assert not left, ("the dead fetcher's temporary files are left", left)
    said.append("a fetcher killed mid-object: taken over, right bytes, its temporary file gone")
for i, arg in enumerate(sys.argv[4:]):
    fault, endpoint = arg.split("=", 1)
    if fault == "kill":
        continue  # below
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    cache = os.path.join(root, "cache-%d" % i)
    try:
        got = [{k: np.asarray(v).copy() for k, v in b.items()}
               for b in clipshard.EpochReader(url, e, batch_size=5, cache_dir=cache, cache_limit="1GiB")]
    except ValueError as err:
        assert "s3://" in str(err) and ".npy" in str(err), (fault, "the error does not name the object", err)
        assert fault == "overwrite", (fault, "raised where retries should have delivered", err)
        said.append("%s: raised (%s)" % (fault, str(err).split(": ")[1][:60]))
        continue
    assert fault != "overwrite", "an object replaced between two ranged reads was delivered"
    assert len(got) == len(want), (fault, len(got), len(want))
    for a, b in zip(got, want):
        for k in b:
            assert np.array_equal(a[k], b[k], equal_nan=b[k].dtype.kind == "f"), (fault, "WRONG BYTES", k)
    said.append("%s: right bytes" % fault)
print("ok: faults; " + "; ".join(said))
