#!/usr/bin/env python3
"""Reading epochs from a bucket through a fault-injecting proxy (issue #34,
point 4): every fault either delivers the right bytes or raises a
ValueError naming the object; none delivers wrong bytes.

    python3 testdata/check_faults.py EDIR s3://BUCKET/PREFIX CACHE_ROOT FAULT=ENDPOINT...

FAULT is 503, reset, truncate, stall (retried: the right bytes) or
overwrite (the object replaced between two ranged reads: raises). EDIR is
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
said = []
for i, arg in enumerate(sys.argv[4:]):
    fault, endpoint = arg.split("=", 1)
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
