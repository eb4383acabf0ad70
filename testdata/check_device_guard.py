#!/usr/bin/env python3
"""The loader's buffer reuse rule against a fake device (#62.5), numpy
only: a device stage whose copies of a batch's host buffers complete only
when the test says so (and read the buffers then, as a DMA does), in
order, as on one stream.

    python3 testdata/check_device_guard.py EDIR DATASET

Checks, for epochs (EDIR) and drawn epochs (DATASET), prefetch 4 and 0:
- with copies left in flight (completed 3 batches late, at random, and
  when the read thread waits for one), every copy reads the bytes its
  batch had when it was read: 0 corrupted batches, and the batches
  equal a plain Loader's;
- the rule can fail: the same run with Assembly.hold disabled (the
  loader reusing a buffer as soon as nothing refers to it) corrupts
  copies;
- a Loader closed with copies in flight waits for them (no buffer let go
  of under a copy).
Prints "ok: device guard ..." or raises.
"""
import ctypes
import hashlib
import os
import random
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402
from clipshard.loader import HostDevice  # noqa: E402

edir, dataset = sys.argv[1:3]


class Copy:
    """One batch's copy in flight: where its arrays are (address, bytes),
    the bytes they had when the batch was read, and what the copy saw."""

    def __init__(self, dev, arrays):
        self.dev = dev
        self.where = {n: (a.__array_interface__["data"][0], a.nbytes) for n, a in arrays.items()}
        self.want = {n: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() for n, a in arrays.items()}
        self.got = None

    def query(self):
        return self.got is not None

    def synchronize(self):
        self.dev.complete(until=self)


class FakeDevice(HostDevice):
    """Copies complete in order, when complete() is called: each reads its
    arrays' memory then."""

    def __init__(self, guard=True):
        self.guard = guard
        self.lock = threading.Lock()
        self.pending = []
        self.corrupted = 0
        self.copies = 0

    def finish(self, arrays, asm):
        used = asm.take_used()
        c = Copy(self, arrays)
        with self.lock:
            self.pending.append(c)
        if self.guard:
            asm.hold(used, c)
        return c  # (the batch on the device: its bytes once the copy completed)

    def complete(self, k=None, until=None):
        with self.lock:
            while self.pending and (k is None or k > 0):
                c = self.pending.pop(0)
                # (the buffers are the pool's, alive: read as a DMA would)
                c.got = {n: hashlib.sha256(ctypes.string_at(addr, size)).hexdigest() for n, (addr, size) in c.where.items()}
                self.copies += 1
                self.corrupted += c.got != c.want
                if k is not None:
                    k -= 1
                if c is until:
                    break

    def wrap(self, c):
        return c


def run(kw, guard, prefetch, seed):
    dev = FakeDevice(guard)
    L = clipshard.Loader(**kw, prefetch=prefetch, _device=dev)
    rnd = random.Random(seed)
    out = []
    for c in L:
        out.append(c)
        if len(dev.pending) > 3 and rnd.random() < 0.7:
            dev.complete(1 + rnd.randrange(2))
    dev.complete()
    L.close()
    return dev, [c.want for c in out]


def plain(kw):
    L = clipshard.Loader(**kw)
    got = [{n: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() for n, a in b.items()} for b in L]
    L.close()
    return got


cases = {
    "epochs": dict(edir=edir, epochs=[0, 1], batch_size=4),
    "drawn": dict(dataset=dataset, epochs=[0], batch_size=4, window=5, seed=2, buffer="1MiB", hold="64KiB"),
}
notes = []
for what, kw in cases.items():
    want = plain(kw)
    for prefetch in (4, 0):
        dev, got = run(kw, True, prefetch, 1)
        assert dev.corrupted == 0 and dev.copies >= len(want) > 6, (what, prefetch, dev.corrupted, dev.copies, len(want))
        assert got == want, (what, prefetch, "the batches differ from a plain Loader's")
    bad, _ = run(kw, False, 4, 1)
    assert bad.corrupted > 0, (what, "without the rule, no copy was corrupted: the check cannot fail")
    notes.append("%s: 0 of %d copies corrupted (without the rule: %d)" % (what, dev.copies, bad.corrupted))

# Closed with copies in flight: close() waits for them.
dev = FakeDevice(True)
L = clipshard.Loader(**cases["epochs"], _device=dev)
it = iter(L)
for _ in range(3):
    next(it)
assert dev.pending
L.close()
assert not dev.pending and dev.corrupted == 0, (len(dev.pending), dev.corrupted)

# torch (when installed): nothing of CUDA touched before the first batch;
# without CUDA the first batch says so; a loader that used CUDA refuses in
# a forked child, in one line.
try:
    import torch
except ImportError:
    torch = None
if torch is not None and not torch.cuda.is_available():
    import clipshard.torch as ct
    for kw in (dict(device="cuda"), dict(pin_memory=True)):
        L = ct.Loader(edir, epochs=[0], batch_size=4, **kw)  # (made: no CUDA call)
        try:
            next(iter(L))
            raise AssertionError("a batch without CUDA")
        except ValueError as e:
            assert "CUDA is not available" in str(e), e
        L.close()
    d = ct.TorchDevice(torch.device("cuda"), None, True)
    d._pid = os.getpid() + 1  # (as if it had used CUDA in its parent)
    try:
        d.enter()
        raise AssertionError("entered across a fork")
    except ValueError as e:
        assert "crossed a fork" in str(e) and "\n" not in str(e), e
    notes.append("torch: no CUDA touched before the first batch, a fork refused")
print("ok: device guard: " + "; ".join(notes) + "; close waits for the copies in flight")
