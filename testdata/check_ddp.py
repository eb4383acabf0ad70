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

A resumed run a rank of which ends by SIGABRT is resumed again from its
checkpoint (at most twice; see below); CLIPSHARD_DDP_ABORT=N makes the
first resumed run crash so, after N steps or more, 2 past a checkpoint
(the tests do, in CI).
"""
import atexit
import json
import os
import random
import resource
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

# The example runs in sessions of its own (so that a kill reaches its
# ranks, not this check): stopped with this check (SIGTERM, ^C, an error),
# what is still running of them goes too, not left on the node.
live = []


def _kill_live():
    for q in live:
        if q.poll() is None:
            try:
                os.killpg(q.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            q.wait()


def _stopped(signum, _frame):
    raise SystemExit("check_ddp: stopped by signal %d" % signum)


atexit.register(_kill_live)
signal.signal(signal.SIGTERM, _stopped)

edir = sys.argv[1]
# With BUCKET_URL CACHE_DIR: the same epochs pushed to a bucket, trained
# from there through the cache (checked against EDIR).
src, cache = (sys.argv[2], ["--cache-dir", sys.argv[3], "--cache-limit", "8MiB"]) if len(sys.argv) > 3 else (edir, [])
man = clipshard.load_epochs(edir)
tmp = tempfile.mkdtemp(prefix="clipshard-ddp-check-")
ckpt, logs = os.path.join(tmp, "ckpt.pt"), os.path.join(tmp, "logs")
os.makedirs(logs)
# A file of the user's beside the checkpoint, and a link named as a fixed
# temporary name would be: the saves must go past both.
mine = os.path.join(tmp, "mine")
with open(mine, "w") as f:
    f.write("the user's\n")
os.symlink(mine, ckpt + ".tmp")
steps = sum(e["samples"] // 8 for e in man["epochs"])  # of the first run (2 ranks x 4)
target = steps // 2  # kill after the checkpoint past half way

p = subprocess.Popen([sys.executable, example, src, "--ranks", "2", "--batch-size", "4", "--every", "3",
                      "--ckpt", ckpt, "--log", logs, "--step-ms", "20"] + cache,
                     stdout=subprocess.PIPE, text=True, start_new_session=True,
                     env=dict(os.environ, TMPDIR=tmp))  # (its rendezvous file, left by the kill, goes with tmp)
live.append(p)
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


def take_logs(ranks, after):
    """What each rank logged, as (step, rank, epoch, samples); the logs
    removed. (A crashed run's steps after its checkpoint are trained again
    by the next run: the caller drops them.)"""
    got = []
    for r in range(ranks):
        f = os.path.join(logs, "rank-%d.jsonl" % r)
        if not os.path.exists(f):
            continue
        with open(f) as lines:
            for line in lines:
                step, epoch, samples = json.loads(line)
                assert step > after, (step, after)  # (a run starts after its checkpoint)
                got.append((step, r, epoch, samples))
        os.remove(f)
    return got


trained = [t for t in take_logs(2, 0) if t[0] <= killed_at]


def ranks_of(pid):
    """The rank processes that mp.spawn started (not its resource tracker)."""
    out = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/stat" % d) as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != pid:
                    continue
            with open("/proc/%s/cmdline" % d, "rb") as f:
                if b"spawn_main" in f.read():
                    out.append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    return out


# The resumed run, on 3 ranks x 3. A rank of it that ends by SIGABRT (torch's
# own C++ std::terminate, "terminate called without an active exception",
# was seen once in CI in a rank of torch 2.15's gloo run; clipshard's reader
# is pure Python) is a crash like the kill above: the run is resumed again
# from its checkpoint, at most twice, and the steps after that checkpoint do
# not count. Any other failure fails the check. With CLIPSHARD_DDP_ABORT=N
# (the tests, CI) the first resumed run is made to crash so: a rank is sent
# SIGABRT once rank 0 has logged N steps or more and 2 past a checkpoint.
abort_at = int(os.environ.get("CLIPSHARD_DDP_ABORT", "0"))
EVERY = 5  # the resumed runs' steps between checkpoints
after, crashes = killed_at, []
for attempt in range(3):
    inject = abort_at if attempt == 0 else 0
    with open(os.path.join(tmp, "stderr-%d" % attempt), "w+") as err:
        p = subprocess.Popen([sys.executable, example, src, "--ranks", "3", "--batch-size", "3", "--every", str(EVERY),
                              "--ckpt", ckpt, "--log", logs] + (["--step-ms", "20"] if inject else []) + cache,
                             stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                             # (faulthandler's dump of every thread on the abort sent
                             # can itself crash with SIGSEGV: seen in CI; and no core file)
                             env=dict({k: v for k, v in os.environ.items() if not (inject and k == "PYTHONFAULTHANDLER")},
                                      TMPDIR=tmp),
                             preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0)) if inject else None)
        live.append(p)
        deadline = time.monotonic() + 300
        while inject and p.poll() is None:
            f = os.path.join(logs, "rank-0.jsonl")
            if os.path.exists(f):
                with open(f) as lf:
                    steps_logged = [json.loads(line)[0] for line in lf]
                # (2-3 steps past a checkpoint: those steps must not count)
                past = len(steps_logged) >= inject and steps_logged[-1] % EVERY == 2
                kids = ranks_of(p.pid) if past else []
                if kids:
                    os.kill(kids[-1], signal.SIGABRT)
                    inject = 0
            if time.monotonic() > deadline:
                os.killpg(p.pid, signal.SIGKILL)
                raise AssertionError("the resumed run is too slow")
            time.sleep(0.005)
        assert not inject, "the resumed run ended before its rank 0 logged %d steps" % abort_at
        try:
            rc = p.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            raise
        err.seek(0)
        stderr = err.read()
    sys.stderr.write(stderr)
    at = torch.load(ckpt)["step"] if rc else None
    got = take_logs(3, after)
    trained += [t for t in got if at is None or t[0] <= at]
    if rc == 0:
        break
    if attempt == 2 or "terminated with signal SIGABRT" not in stderr:
        raise subprocess.CalledProcessError(rc, p.args, stderr=stderr)
    crashes.append((max((t[0] for t in got), default=at), at))
    after = at
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
with open(mine, "rb") as f:
    assert f.read() == b"the user's\n", "a checkpoint was written through the link %s.tmp" % ckpt
assert os.readlink(ckpt + ".tmp") == mine, "the link %s.tmp was replaced" % ckpt
shutil.rmtree(tmp)
print("ok: ddp (gloo, torch %s%s): killed after step %d of %d on 2 ranks x 4, resumed on 3 ranks x 3, every sample once%s"
      % (torch.__version__, ", from " + src if src != edir else "", killed_at, steps,
         "".join("; a rank ended by SIGABRT after step %d, resumed again after step %d" % c for c in crashes)))
