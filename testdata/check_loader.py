#!/usr/bin/env python3
"""Check clipshard.Loader (and clipshard.torch.Loader when torch is there)
against the shard files and against EpochReader.

    python3 testdata/check_loader.py EPOCHS_DIR

- Its batches are byte-equal to EpochReader's, for every epoch, world
  size, rank, batch size, remainder and prefetch, and for replayed and
  mixed epochs.
- Exactly once: ranks R in {1, 2, 3, 5, 8}, batch sizes that do not
  divide the epoch, prefetch 0, 1 and 4, stopped at a random batch, at
  the last batch of a padded epoch and at an epoch's end, resumed from
  state_dict() (through JSON) with another R, B and prefetch: every
  epoch's samples are trained in the epoch's order, each once (the
  "drop" rule leaves out what is too little for a global batch; "pad"
  fills the last one from the epoch's start). "partial" (one rank) keeps
  a short last batch; with several ranks it is refused, and so is an
  epoch smaller than one global batch with "drop".
- A batch handed out is never written again (all batches held, then
  compared), and the loader holds at most prefetch + 2 buffers.
- After a break, close() or an error the thread is gone and no fd is
  left open (/proc/self/fd); an error of the thread (a shard cut short
  after the loader was made) reaches the consumer naming the file.
- torch: the same batches as tensors, float32 and bfloat16 casts equal
  to torch's own, pinned buffers when asked (and possible).
Prints "ok: loader ..." or raises.
"""
import gc
import json
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402
from clipshard import EpochReader, Loader  # noqa: E402

edir = sys.argv[1]
man = clipshard.load_epochs(edir)
on_disk = sorted(e["epoch"] for e in man["epochs"])
checked = 0


def fds():
    return sorted(os.listdir("/proc/self/fd"))


def threads():
    return [t for t in threading.enumerate() if t.name.startswith("clipshard-")]


def same(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), what


def order(epoch):
    entry = next(e for e in man["epochs"] if e["epoch"] == epoch)
    return np.concatenate([np.load(os.path.join(edir, s["files"]["samples"]))
                           for s in sorted(entry["shards"], key=lambda s: s["shard"])])


fd0 = fds()
# Every combination with CLIPSHARD_EXHAUSTIVE=1 (CI); else each option
# value at least once (every R, B, remainder and prefetch of the lists
# below, fewer of their products).
EXHAUSTIVE = bool(os.environ.get("CLIPSHARD_EXHAUSTIVE"))

# -- byte-equal to EpochReader --------------------------------------------
for i, (R, B) in enumerate(((1, 4), (3, 5), (2, 7))):
    for j, remainder in enumerate(("drop", "pad")):
        for prefetch in (0, 1, 4) if EXHAUSTIVE else ((0, 1, 4)[(2 * i + j) % 3],):
            for r in range(R):
                ld = Loader(edir, rank=r, world_size=R, batch_size=B, remainder=remainder, prefetch=prefetch,
                            threads=1 if prefetch == 1 else 3 if R == 2 else 2)
                held = []
                for e in on_disk:
                    assert ld.epoch == e
                    n = len(ld)
                    got = list(ld)  # every batch held: none may be written again
                    assert len(got) == n, (len(got), n)
                    held.append((e, got))
                assert ld.epoch is None and list(ld) == []
                assert all(len(p) <= prefetch + 2 for p in ld.assembly.pool.values()), ld.assembly.pool
                for e, got in held:
                    ref = list(EpochReader(edir, e, rank=r, world_size=R, batch_size=B, remainder=remainder, read=True))
                    assert len(got) == len(ref), (e, len(got), len(ref))
                    for a, b in zip(got, ref):
                        assert list(a) == list(b)
                        for k in b:
                            same(a[k], b[k], (R, r, B, remainder, prefetch, e, k))
                            checked += 1
                ld.close()
assert not threads(), threads()

# Replayed and mixed epochs: epochs past the materialised ones.
later = list(range(max(on_disk) + 1, max(on_disk) + 4))
for kw in (dict(replay_seed=5), dict(replay_seed=5, mix_shards=2, mix_seed=3)):
    for prefetch in (0, 2):
        ld = Loader(edir, on_disk[:1] + later, batch_size=3, prefetch=prefetch, **kw)
        for e in ld.epochs:
            got = list(ld)
            rk = {} if e in on_disk else dict(replay_seed=5, virtual_epoch=e, mix_shards=kw.get("mix_shards", 1),
                                                mix_seed=kw.get("mix_seed", 0))
            ref = list(EpochReader(edir, e if e in on_disk else on_disk[e % len(on_disk)], batch_size=3, **rk))
            assert len(got) == len(ref), (kw, e)
            for a, b in zip(got, ref):
                for k in b:
                    same(a[k], b[k], (kw, e, k))
        ld.close()

# A batch's "samples" kept (as a log would) keeps its own buffer, not the
# batch's: the other modalities' buffers are reused.
ld = Loader(edir, on_disk[0], batch_size=2, prefetch=1)
kept = [b["samples"] for b in ld]
assert len(kept) > 6 and all(len(p) <= 3 for n, p in ld.assembly.pool.items() if n != "samples"), {n: len(p) for n, p in ld.assembly.pool.items()}
same(np.concatenate(kept), order(on_disk[0])[: 2 * len(kept)], "samples kept")
ld.close()

# A cast in the thread equals numpy's.
for nthreads in (1, 2):
    ld = Loader(edir, on_disk[0], batch_size=5, dtype=np.float32, threads=nthreads)
    for a, b in zip(ld, EpochReader(edir, on_disk[0], batch_size=5)):
        for k in b:
            want = b[k].astype(np.float32) if b[k].dtype.kind == "f" else b[k]
            same(a[k], want, ("float32", nthreads, k))
assert ld.host_bytes >= (ld.prefetch + 2) * ld.batch_bytes

# -- exactly once, across stops and resumes -------------------------------


def train(R, B, prefetch, remainder, state, stop):
    """Trains R simulated ranks in lockstep from state (or the start); after
    `stop` global batches (None: to the end) returns the state (through
    JSON, as a checkpoint would keep it) and the samples trained, per
    epoch in (global batch, rank) order."""
    lds = [Loader(edir, rank=r, world_size=R, batch_size=B, prefetch=prefetch, remainder=remainder) for r in range(R)]
    if state is not None:
        for ld in lds:
            ld.load_state_dict(json.loads(state))
    trained, steps = {}, 0
    for e in lds[0].epochs:
        if lds[0].epoch != e:
            continue
        for ld in lds:
            ld.set_epoch(e)
        its = [iter(ld) for ld in lds]
        for _ in range(len(lds[0])):
            bs = [next(it) for it in its]
            trained.setdefault(e, []).extend(b["samples"].copy() for b in bs)
            steps += 1
            if stop is not None and steps == stop:
                st = lds[0].state_dict()
                assert all(ld.state_dict() == st for ld in lds), "ranks disagree on the state"
                for ld in lds:
                    ld.close()
                return json.dumps(st), trained
        for it in its:  # the epoch ends: the loaders move on
            assert next(it, None) is None
    for ld in lds:
        ld.close()
    return None, trained


want = {e: order(e) for e in on_disk}
rng = np.random.default_rng(0)
cases = 0
CONFIGS = ((1, 3, 2, 5), (3, 2, 5, 3), (8, 1, 1, 7), (2, 5, 3, 2), (5, 3, 8, 1), (2, 7, 8, 2))
for R1, B1, R2, B2 in CONFIGS if EXHAUSTIVE else CONFIGS[:3]:  # (the first three: R 1, 2, 3, 5 and 8)
    for remainder in ("drop", "pad"):
        full = Loader(edir, world_size=R1, rank=0, batch_size=B1, remainder=remainder)
        per_epoch = []
        for e in full.epochs:
            per_epoch.append(len(full))
            list(full)
        full.close()
        total = sum(per_epoch)
        stops = {int(rng.integers(1, total + 1)), per_epoch[0], per_epoch[0] + 1, total}  # random, an epoch's end, past it, the very end
        if remainder == "pad":
            stops.add(per_epoch[0])  # the last batch of a padded epoch
        for stop in sorted(s for s in stops if 1 <= s <= total):
            p1, p2 = (0, 1, 4)[cases % 3], (4, 0, 1)[cases % 3]
            cases += 1
            state, first = train(R1, B1, p1, remainder, None, stop)
            _, second = train(R2, B2, p2, remainder, state, None)
            st = json.loads(state)
            for e in on_disk:
                n = len(want[e])
                got = first.get(e, []) + second.get(e, [])
                got = np.concatenate(got) if got else np.zeros((0, 3), np.int64)
                # The positions the two runs cover: the first from 0 up
                # to where it stopped in that epoch, the second on from
                # there (every position of an epoch after the stop).
                def k(left, per):
                    return 0 if left <= 0 else left // per if remainder == "drop" else -(-left // per)
                if e < st["epoch"]:
                    pos = list(range(k(n, R1 * B1) * R1 * B1))
                elif e == st["epoch"]:
                    c = st["consumed"]
                    pos = list(range(c)) + ([] if st["done"] else list(range(c, c + k(n - c, R2 * B2) * R2 * B2)))
                else:
                    pos = list(range(k(n, R2 * B2) * R2 * B2))
                pos = np.array(pos, dtype=np.int64) % n
                assert len(got) == len(pos) and np.array_equal(got, want[e][pos]), (
                    R1, B1, R2, B2, remainder, stop, e, st, len(got), len(pos))
                if remainder == "drop":
                    assert len(np.unique(pos)) == len(pos), "a sample twice"
                else:
                    assert set(pos.tolist()) == set(range(n)), "a sample skipped"
assert not threads(), threads()

# -- break, close, errors: the thread ends, the files close ---------------
for prefetch in (0, 1, 4):
    ld = Loader(edir, batch_size=2, prefetch=prefetch)
    for i, b in enumerate(ld):
        if i == 2:
            break
    assert not threads(), ("after break", prefetch, threads())
    assert fds() == fd0, ("fds after break", prefetch, set(fds()) - set(fd0))
    # The loader goes on from the batch after the last one handed out.
    st = ld.state_dict()
    assert st["consumed"] == 6 and not st["done"], st
    nxt = next(iter(ld))
    ref = list(EpochReader(edir, on_disk[0], batch_size=2, read=True))[3]
    same(nxt["samples"], ref["samples"], "after a break")
    ld.close()
    assert not threads() and fds() == fd0, ("after close", prefetch)

# A loader let go of after an epoch, while its thread reads on into the
# next one: collected, its thread ends and its files close.
if len(on_disk) > 1:
    ld = Loader(edir, on_disk, batch_size=2, prefetch=2)
    first = list(ld)
    deadline = time.monotonic() + 5
    while not threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threads(), "the thread did not read on into the next epoch"
    del ld
    gc.collect()
    deadline = time.monotonic() + 5
    while (threads() or fds() != fd0) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not threads() and fds() == fd0, ("a loader let go of", threads(), set(fds()) - set(fd0))
    assert len(first) > 0 and first[0]["samples"].shape == (2, 3)  # the batches handed out are intact

tmp = tempfile.mkdtemp()
d = os.path.join(tmp, "ep")
shutil.copytree(edir, d)
entry = next(e for e in man["epochs"] if e["epoch"] == on_disk[0])
last = sorted(entry["shards"], key=lambda s: s["shard"])[-1]
victim = os.path.join(d, last["files"][man["modalities"][0]["name"]])
for prefetch, dtype in ((0, None), (2, None), (2, np.float32)):  # (float32: read through the cast's scratch)
    ld = Loader(d, on_disk[0], batch_size=1, prefetch=prefetch, dtype=dtype)
    it = iter(ld)
    next(it)
    with open(victim, "r+b") as f:  # after the loader checked the folder
        f.truncate(os.path.getsize(victim) - 64)
    try:
        for _ in it:
            pass
        raise AssertionError("a shard cut short after the start: no error")
    except ValueError as e:
        assert victim in str(e), str(e)
    assert not threads(), ("after an error", threads())
    assert fds() == fd0, ("fds after an error", set(fds()) - set(fd0))
    shutil.copyfile(os.path.join(edir, last["files"][man["modalities"][0]["name"]]), victim)
shutil.rmtree(tmp)

# remainder: "partial" (one rank) keeps the short last batch, every
# sample once, the state after it done; with several ranks it is refused;
# an epoch smaller than one global batch is refused with "drop", not
# silently empty.
e0 = on_disk[0]
n = EpochReader(edir, e0).samples
order = np.concatenate([np.asarray(b["samples"]) for b in EpochReader(edir, e0, batch_size=1)])
B = max(2, n // 3 + 1)
for make in (lambda **kw: EpochReader(edir, e0, **kw), lambda **kw: Loader(edir, e0, **kw), lambda **kw: Loader(edir, e0, prefetch=0, **kw)):
    r = make(batch_size=B, remainder="partial")
    got = [np.asarray(b["samples"]).copy() for b in r]
    assert len(got) == -(-n // B) and len(got[-1]) == n - (len(got) - 1) * B, ("partial", [len(g) for g in got], n, B)
    assert np.array_equal(np.concatenate(got), order), "partial: not every sample once, in order"
    st = r.state_dict()
    assert st["consumed"] == n, ("partial: the state after the last batch", st)
    for bad in (dict(rank=0, world_size=2, batch_size=B, remainder="partial"), dict(batch_size=n + 1)):
        try:
            list(make(**bad))
            raise AssertionError("taken: %r" % (bad,))
        except ValueError as err:
            assert ("partial" in str(err) and "one rank" in str(err)) or ("fewer than one global batch" in str(err) and "%d samples" % n in str(err)), err
    assert len(list(make(batch_size=n + 1, remainder="pad"))) == 1
cases += 1
# A batch spanning many shards (5 shards' samples): every shard of it is
# read before any is closed (before, the Loader closed the first ones
# while it opened the rest: "Bad file descriptor").
S = man["shard_samples"]
if n >= 5 * S:
    for pf in (0, 4):
        got = [np.asarray(b["samples"]).copy() for b in Loader(edir, e0, batch_size=5 * S - 1, prefetch=pf, remainder="partial")]
        assert np.array_equal(np.concatenate(got), order), "a batch over many shards"
    cases += 1

# A Loader made before a fork and iterated on both sides: a batch the
# child holds stays as it was handed out while the parent reads on (the
# buffers were shared anonymous memory, MAP_SHARED: the parent's reads
# rewrote the child's batch; the Loader's own pages must be the
# process's, MAP_PRIVATE).
if hasattr(os, "fork"):
    assert not threads(), threads()
    ld = Loader(edir, on_disk, batch_size=2, prefetch=2)
    (r1, w1), (r2, w2) = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 4
        try:
            os.close(r1), os.close(w2)  # (each side keeps only its own ends: one that dies ends the other's read)
            b = next(iter(ld))
            kept = {k: np.array(v) for k, v in b.items()}
            os.write(w1, b"x")
            os.read(r2, 1)  # (the parent has read every epoch)
            code = 0 if all(np.array_equal(kept[k].view(np.uint8), np.asarray(b[k]).view(np.uint8)) for k in kept) else 3
        finally:
            os._exit(code)
    os.close(w1), os.close(r2)
    try:
        if os.read(r1, 1):  # (b"": the child died before its first batch)
            for e in on_disk:
                for b in ld:
                    pass
            os.write(w2, b"x")
    finally:
        os.close(r1), os.close(w2)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    ld.close()
    assert code == 0, "a Loader made before a fork: the child's batch changed while the parent read (exit %d)" % code
    cases += 1

msg = "ok: loader %d arrays equal, %d stop/resume cases" % (checked, cases)

# -- torch ------------------------------------------------------------------
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    from clipshard.torch import Loader as TorchLoader
    fd0 = fds()  # (importing torch opens files of its own)
    e0 = on_disk[0]
    for dtype in (None, torch.float32, torch.bfloat16):
        for prefetch in (0, 3):
            ld = TorchLoader(edir, e0, rank=1, world_size=2, batch_size=3, dtype=dtype, prefetch=prefetch)
            got = list(ld)
            ref = list(EpochReader(edir, e0, rank=1, world_size=2, batch_size=3, read=True))
            assert len(got) == len(ref)
            for a, b in zip(got, ref):
                for k in b:
                    t = torch.from_numpy(np.array(b[k]))
                    if dtype is not None and t.dtype.is_floating_point:
                        t = t.to(dtype)
                    assert a[k].dtype == t.dtype and a[k].shape == t.shape, (k, a[k].dtype, t.dtype)
                    assert torch.equal(a[k].view(torch.uint8) if a[k].dim() else a[k], t.view(torch.uint8) if t.dim() else t), (dtype, k)
            ld.close()
    # A partial last batch as tensors (float32: cast in the thread), and
    # EpochDataset's.
    from clipshard.torch import EpochDataset
    got = list(TorchLoader(edir, e0, batch_size=B, remainder="partial", dtype=torch.float32))
    assert [len(b["samples"]) for b in got][-1] == n - (len(got) - 1) * B and torch.equal(torch.cat([b["samples"] for b in got]), torch.from_numpy(order))
    got = list(torch.utils.data.DataLoader(EpochDataset(edir, e0, batch_size=B, remainder="partial"), batch_size=None, num_workers=0))
    assert torch.equal(torch.cat([b["samples"] for b in got]), torch.from_numpy(order)) and int(got[-1]["consumed"]) == n
    try:
        pinned = TorchLoader(edir, e0, batch_size=3, pin_memory=True)
        b = next(iter(pinned))
        assert all(t.is_pinned() for t in b.values())
        pinned.close()
        msg += "; torch %s (pinned)" % torch.__version__
    except (RuntimeError, ValueError) as e:  # pinning needs a CUDA driver (ValueError: CUDA not available, said at construction)
        msg += "; torch %s (pinned memory: not on this machine, no CUDA driver: %s)" % (torch.__version__, str(e).split("\n")[0][:60])
    assert not threads() and fds() == fd0, ("torch: fds or thread left", threads(), [os.readlink("/proc/self/fd/" + x) for x in set(fds()) - set(fd0) if os.path.exists("/proc/self/fd/" + x)])
print(msg)
