"""A reader of an epoch while `shuffle --force` rewrites the folder with
another seed (round 4, point 2): every reader (EpochReader, Loader, and
with torch EpochDataset under DataLoader workers and torch's Loader)
delivers the version of the epoch it started on, or raises a ValueError
naming a shard file; it never mixes two orders.

usage: check_rewrite.py EDIR SEED_A SEED_B SHUFFLE_ARGV...
EDIR holds epoch 0 cut with SEED_A by SHUFFLE_ARGV (which ends with
--seed, given the seed here); it is rewritten with SEED_B mid-read, then
back with SEED_A. Prints "ok: rewrite" at the end.
"""
import gc
import os
import pickle
import subprocess
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402

edir, seed_a, seed_b, argv = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]


def shuffle(seed):
    subprocess.run(argv + [seed, "--force", "--quiet"], check=True, stdout=subprocess.DEVNULL)


def samples_of():
    man = clipshard.load_epochs(edir)
    e = next(x for x in man["epochs"] if x["epoch"] == 0)
    rows = [np.load(os.path.join(edir, s["files"]["samples"])) for s in sorted(e["shards"], key=lambda s: s["shard"])]
    return np.concatenate(rows)


shuffle(seed_a)
A = samples_of()
shuffle(seed_b)
B = samples_of()
shuffle(seed_a)
assert not np.array_equal(A, B), "the two seeds gave the same order: the check would prove nothing"
B_ = 4  # batch size: many batches, many shards still unopened after the first


def judge(name, got, err, rewrites):
    """got: the samples rows delivered, in order; err: the exception."""
    got = np.concatenate(got) if got else np.zeros((0, A.shape[1]), dtype=np.int64)
    n = len(got)
    if np.array_equal(got, A[:n]) or np.array_equal(got, B[:n]):
        one = "A" if np.array_equal(got, A[:n]) else "B"
    else:
        raise SystemExit("%s: MIXED two orders: %d samples delivered, equal to neither version's first %d (%d rewrites)" % (name, n, n, rewrites))
    if err is None:
        if n != len(A) - len(A) % B_:
            raise SystemExit("%s: no error, but %d of %d samples" % (name, n, len(A)))
        print("%s: read version %s whole (%d samples)" % (name, one, n))
    else:
        msg = str(err)
        if not isinstance(err, ValueError) or ".npy" not in msg and "epochs.json" not in msg:
            raise SystemExit("%s: raised %r, want a ValueError naming a shard or epochs.json" % (name, err))
        print("%s: %d samples of version %s, then: %s" % (name, n, one, msg.strip().splitlines()[-1][:200]))


def sequential(name, make, rows):
    """Read a batch, rewrite with seed B (to the end), read on; then put A back."""
    it = iter(make())
    got, err = [], None
    try:
        got.append(rows(next(it)))
        shuffle(seed_b)
        for b in it:
            got.append(rows(b))
    except Exception as e:  # judged below
        err = e
    it = None
    gc.collect()  # (a DataLoader's iterator ends its workers here, not in a worker forked later)
    judge(name, got, err, 1)
    if err is None:
        raise SystemExit("%s: the folder was rewritten after the first batch and the reader noticed nothing" % name)
    shuffle(seed_a)


def concurrent(name, make, rows, tries=3):
    """Rewrite with B and back in a loop while the reader reads."""
    for t in range(tries):
        stop = threading.Event()
        count = [0]

        def writer():
            while not stop.is_set():
                shuffle(seed_b if count[0] % 2 == 0 else seed_a)
                count[0] += 1

        got, err = [], None
        w = threading.Thread(target=writer)
        it = iter(make())
        try:
            got.append(rows(next(it)))
            w.start()
            for b in it:
                got.append(rows(b))
        except Exception as e:
            err = e
        stop.set()
        if w.is_alive():
            w.join()
        it = None
        gc.collect()
        judge("%s try %d" % (name, t), got, err, count[0])
        shuffle(seed_a)


np_rows = lambda b: np.asarray(b["samples"]).copy()  # noqa: E731
sequential("EpochReader", lambda: clipshard.EpochReader(edir, 0, batch_size=B_), np_rows)
sequential("EpochReader read=True", lambda: clipshard.EpochReader(edir, 0, batch_size=B_, read=True), np_rows)
# An EpochReader pickled once it has begun (what a spawned worker gets):
# the copy reads the version begun or raises, the folder rewritten since.
r = clipshard.EpochReader(edir, 0, batch_size=B_)
it = iter(r)
next(it)
blob = pickle.dumps(r)
shuffle(seed_b)
try:
    got = [np_rows(b) for b in pickle.loads(blob)]
    judge("EpochReader pickled", got, None, 1)
    raise SystemExit("EpochReader pickled: the folder was rewritten after its first batch and the copy noticed nothing")
except ValueError as e:
    judge("EpochReader pickled", [], e, 1)
it = None
shuffle(seed_a)
sequential("Loader", lambda: clipshard.Loader(edir, 0, batch_size=B_, prefetch=2), np_rows)
sequential("Loader prefetch 0", lambda: clipshard.Loader(edir, 0, batch_size=B_, prefetch=0), np_rows)
# Rewrites racing the reads: once each by default, more with the
# exhaustive cases (CLIPSHARD_EXHAUSTIVE=1, CI).
TRIES = 3 if os.environ.get("CLIPSHARD_EXHAUSTIVE") else 1
concurrent("Loader (concurrent)", lambda: clipshard.Loader(edir, 0, batch_size=B_, prefetch=2), np_rows, tries=TRIES)
try:
    import torch
    import torch.utils.data
    import clipshard.torch as ct
except ImportError:
    torch = None
if torch is not None:
    t_rows = lambda b: b["samples"].numpy().copy()  # noqa: E731
    sequential("torch Loader", lambda: ct.Loader(edir, 0, batch_size=B_), t_rows)
    for workers in (0, 2):
        sequential("EpochDataset workers=%d" % workers, lambda: torch.utils.data.DataLoader(
            ct.EpochDataset(edir, 0, batch_size=B_), batch_size=None, num_workers=workers), t_rows)
    # Pickled into spawned workers (and a process of its own) after the
    # folder was rewritten: they read the version the dataset was made on,
    # which is gone, so they raise; never the new version's batches.
    from spawned import spawned
    ds = ct.EpochDataset(edir, 0, batch_size=B_)
    shuffle(seed_b)
    got, err = spawned(ds, 2)
    if got is not None:
        raise SystemExit("EpochDataset spawn: the folder was rewritten after the dataset was made, and its spawned workers "
                         "read %d batches" % len(got))
    if "ValueError: " not in err or "epochs.json" not in err and ".npy" not in err:
        raise SystemExit("EpochDataset spawn: want a ValueError naming epochs.json or a shard, got: %s" % err[-2000:])
    print("EpochDataset spawn: %s" % err.strip().splitlines()[-1][:200])
    shuffle(seed_a)
    concurrent("EpochDataset workers=2 (concurrent)", lambda: torch.utils.data.DataLoader(
        ct.EpochDataset(edir, 0, batch_size=B_), batch_size=None, num_workers=2), t_rows, tries=max(1, TRIES - 1))
print("ok: rewrite%s" % ("" if torch is not None else " (no torch: its readers not checked)"))
