#!/usr/bin/env python3
"""Run examples/train_ddp.py (real torch.distributed, gloo, CPU) on 2 ranks
with batches of 4, kill it with SIGKILL after a checkpoint, resume it on
3 ranks with batches of 3, and check exactly-once delivery.

    python3 testdata/check_ddp.py EPOCHS_DIR

Each epoch's samples, as trained (by step, then rank; the steps of the
killed run after its last checkpoint are trained again by the resumed one
and do not count), must be the epoch's order from its start, each sample
once, leaving out only what is less than one global batch at the end
(remainder "drop"). Prints "ok: ddp ..." or raises.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

here = os.path.dirname(os.path.abspath(__file__))
example = os.path.join(here, "..", "examples", "train_ddp.py")
sys.path.insert(0, os.path.join(here, "..", "python"))
import clipshard  # noqa: E402

edir = sys.argv[1]
# With BUCKET_URL CACHE_DIR: the same epochs pushed to a bucket, trained
# from there through the cache (checked against EDIR).
src, cache = (sys.argv[2], ["--cache-dir", sys.argv[3], "--cache-limit", "8MiB"]) if len(sys.argv) > 3 else (edir, [])
man = clipshard.load_epochs(edir)
tmp = tempfile.mkdtemp(prefix="clipshard-ddp-check-")
ckpt, logs = os.path.join(tmp, "ckpt.pt"), os.path.join(tmp, "logs")
os.makedirs(logs)
steps = sum(e["samples"] // 8 for e in man["epochs"])  # of the first run (2 ranks x 4)
target = steps // 2  # kill after the checkpoint past half way

p = subprocess.Popen([sys.executable, example, src, "--ranks", "2", "--batch-size", "4", "--every", "3",
                      "--ckpt", ckpt, "--log", logs, "--step-ms", "20"] + cache,
                     stdout=subprocess.PIPE, text=True, start_new_session=True)
saved = 0
deadline = time.monotonic() + 300
while saved < target:
    line = p.stdout.readline()
    assert line, "the first run ended before step %d (%s)" % (target, p.wait())
    if line.startswith("checkpoint step"):
        saved = int(line.split()[2])
    assert time.monotonic() < deadline, "the first run is too slow"
time.sleep(random.uniform(0, 0.05))  # a few steps past the checkpoint
os.killpg(p.pid, signal.SIGKILL)
p.wait()
p.stdout.close()
ck = torch.load(ckpt)
killed_at = ck["step"]

# The killed run's steps after its checkpoint are trained again: drop them.
trained = []  # (step, rank, epoch, samples)
for r in range(2):
    for line in open(os.path.join(logs, "rank-%d.jsonl" % r)):
        step, epoch, samples = json.loads(line)
        if step <= killed_at:
            trained.append((step, r, epoch, samples))
for r in range(2):
    os.remove(os.path.join(logs, "rank-%d.jsonl" % r))

subprocess.run([sys.executable, example, src, "--ranks", "3", "--batch-size", "3", "--every", "5",
                "--ckpt", ckpt, "--log", logs] + cache, check=True, stdout=subprocess.DEVNULL, timeout=300)
for r in range(3):
    for line in open(os.path.join(logs, "rank-%d.jsonl" % r)):
        step, epoch, samples = json.loads(line)
        assert step > killed_at, (step, killed_at)
        trained.append((step, r, epoch, samples))
trained.sort(key=lambda t: (t[0], t[1]))

resumed_in = ck["data"]["epoch"]
for e in man["epochs"]:
    want = np.concatenate([np.load(os.path.join(edir, s["files"]["samples"]))
                           for s in sorted(e["shards"], key=lambda s: s["shard"])])
    got = [s for _, _, ep, ss in trained if ep == e["epoch"] for s in ss]
    got = np.array(got, dtype=np.int64).reshape(-1, want.shape[1])
    n = len(want)
    last = 8 if e["epoch"] < resumed_in else 9  # the global batch of the run that ended the epoch
    assert n - last < len(got) <= n, (e["epoch"], len(got), n)
    assert np.array_equal(got, want[: len(got)]), "epoch %d: not the epoch's order, once" % e["epoch"]
shutil.rmtree(tmp)
print("ok: ddp (gloo, torch %s%s): killed after step %d of %d on 2 ranks x 4, resumed on 3 ranks x 3, every sample once"
      % (torch.__version__, ", from " + src if src != edir else "", killed_at, steps))
