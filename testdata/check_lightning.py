#!/usr/bin/env python3
"""examples/train_lightning.py end to end (#64.8):

    python3 testdata/check_lightning.py EDIR WORKDIR

Lightning on 2 CPU processes (DDP, gloo), batches of 4 a rank: a run
stopped after step 7 (a checkpoint there), then resumed from it to the
end. Each epoch's samples trained by both ranks over both runs are the
epoch's (its global batches of 8, the remainder dropped), each exactly
once, under the right epoch. Prints "ok: lightning ..." or raises.
"""
import collections
import json
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "python"))
import clipshard  # noqa: E402

edir, work = sys.argv[1:3]
script = os.path.join(here, "..", "examples", "train_lightning.py")
ck, log = os.path.join(work, "ck"), os.path.join(work, "log")
for extra in (["--max-steps", "7"], []):
    r = subprocess.run([sys.executable, script, edir, ck, "--devices", "2", "--batch-size", "4", "--log", log] + extra,
                       capture_output=True, text=True, cwd=work, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
rows = []
for rank in (0, 1):
    with open("%s.%d" % (log, rank)) as f:
        rows += [tuple(json.loads(line)) for line in f]
got = collections.Counter(rows)
assert max(got.values()) == 1, [k for k, v in got.items() if v > 1][:5]
n = 0
for e in clipshard.Loader(edir, batch_size=8).epochs:
    want = {(e,) + tuple(s) for b in clipshard.Loader(edir, epochs=[e], batch_size=8) for s in b["samples"].tolist()}
    mine = {k for k in got if k[0] == e}
    assert mine == want, (e, len(mine), len(want), sorted(mine ^ want)[:5])
    n += len(want)
assert n == len(rows), (n, len(rows))
print("ok: lightning: 2 ranks, stopped at step 7 and resumed: %d samples of %d epochs trained exactly once" % (
    n, len(clipshard.Loader(edir, batch_size=8).epochs)))
