#!/usr/bin/env python3
"""One row of just bench ab (bench/bench_ab.sh): the Python reader of one
checkout (PKG: its python/ folder) on the bench set, printed as a JSON
line. Two checkouts' rows, interleaved, say whether a change of the
reader kept its batches, its states and its speed.

    bench_ab.py hash MODE PKG WORK        sha256 of every batch of MODE, in order,
                                          and of the rest after a state saved
                                          at a third of the epoch (STATE)
    bench_ab.py resume MODE PKG WORK STATE  the rest of MODE from the state file
                                          STATE (saved by another checkout)
    bench_ab.py speed MODE PKG WORK       samples/s of MODE (float32 torch, warm
                                          or, for bucket, a cold cache)

MODE:
  materialised  clipshard.torch.Loader over WORK/ep, epochs 0-2, float32
  reader        clipshard.EpochReader over WORK/ep epoch 1 (numpy views)
  replay        clipshard.Loader over WORK/ep, epochs 3-4 replayed, mixing 2 shards
  drawn         clipshard.torch.Loader(dataset=WORK/ds), epochs 0-1, float32
  mixed         clipshard.Loader over WORK/mix (two sources), epoch 0
  bucket        clipshard.torch.Loader over s3://bench/ep (AWS_ENDPOINT_URL), epochs 0-2,
                a new cache under WORK, float32
  drawn-bucket  clipshard.Loader(dataset=s3://bench/ds), epoch 0, float16
B is 256 (BENCH_BATCH).
"""
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

mode, pkg, work = sys.argv[2], sys.argv[3], sys.argv[4]
sys.path.insert(0, pkg)
import numpy as np  # noqa: E402
import clipshard  # noqa: E402

B = int(os.environ.get("BENCH_BATCH", 256))


def make():
    """The loader (or reader) of mode, and whether it yields torch tensors."""
    if mode in ("materialised", "drawn", "bucket"):
        import torch
        from clipshard.torch import Loader as TL
        if mode == "materialised":
            return TL(os.path.join(work, "ep"), epochs=[0, 1, 2], batch_size=B, dtype=torch.float32)
        if mode == "drawn":
            return TL(dataset=os.path.join(work, "ds"), epochs=[0, 1], window=15, seed=5, batch_size=B, dtype=torch.float32)
        cache = tempfile.mkdtemp(dir=work, prefix="ab-cache-")
        return TL("s3://bench/ep", epochs=[0, 1, 2], batch_size=B, dtype=torch.float32, cache_dir=cache, cache_limit="4GiB")
    if mode == "reader":
        return clipshard.EpochReader(os.path.join(work, "ep"), 1, batch_size=B)
    if mode == "replay":
        return clipshard.Loader(os.path.join(work, "ep"), epochs=[3, 4], replay_seed=9, mix_shards=2, batch_size=B)
    if mode == "mixed":
        return clipshard.Loader(os.path.join(work, "mix"), epochs=[0], batch_size=B)
    if mode == "drawn-bucket":
        cache = tempfile.mkdtemp(dir=work, prefix="ab-cache-")
        return clipshard.Loader(dataset="s3://bench/ds", epochs=[0], window=15, seed=5, batch_size=B, cache_dir=cache,
                                cache_limit="4GiB")
    raise SystemExit("bench_ab.py: no mode %r" % mode)


def digest(batch):
    h = hashlib.sha256()
    for k in sorted(batch):
        v = batch[k]
        a = v.numpy() if hasattr(v, "numpy") else np.asarray(v)
        h.update(k.encode() + str(a.dtype).encode() + str(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def batches(ld):
    """Every batch of ld, in order (a Loader: each of its epochs)."""
    if isinstance(ld, clipshard.EpochReader):
        yield from ld
        return
    for e in ld.epochs:
        ld.set_epoch(e)
        yield from ld


def rest_of(ld, pos):
    """A loader's batches from its resume point in epoch pos on."""
    for i, e in enumerate(ld.epochs[pos:]):
        if i:
            ld.set_epoch(e)
        yield from ld


def cleanup():
    for n in os.listdir(work):
        if n.startswith("ab-cache-"):
            shutil.rmtree(os.path.join(work, n), ignore_errors=True)


cmd = sys.argv[1]
try:
    if cmd == "hash":
        ld = make()
        whole, rest = hashlib.sha256(), hashlib.sha256()
        digests = [digest(b) for b in batches(ld)]
        for d in digests:
            whole.update(d.encode())
        # the state a third of the way (of the first epoch), and the rest
        ld2 = make()
        k = max(1, len(digests) // 3)
        it = batches(ld2)
        for _ in range(k):
            next(it)
        state = ld2.state_dict()
        it.close()
        for d in digests[k:]:
            rest.update(d.encode())
        out = {"mode": mode, "batches": len(digests), "sha256": whole.hexdigest(), "state_at": k, "state": state,
               "rest_sha256": rest.hexdigest()}
        print(json.dumps(out, default=int))
    elif cmd == "resume":
        state = json.load(open(sys.argv[5]))
        ld = make()
        ld.load_state_dict(state)
        rest, n = hashlib.sha256(), 0
        if isinstance(ld, clipshard.EpochReader):
            left = iter(ld)
        else:
            left = rest_of(ld, ld.epochs.index(state["epoch"]))
        for b in left:
            rest.update(digest(b).encode())
            n += 1
        print(json.dumps({"mode": mode, "resumed_batches": n, "rest_sha256": rest.hexdigest()}))
    elif cmd == "speed":
        ld = make()
        if mode not in ("bucket", "drawn-bucket"):
            for _ in batches(make()):
                pass  # (warm: every file read once)
        t, n = time.perf_counter(), 0
        for b in batches(ld):
            n += len(b["samples"])
        print(json.dumps({"mode": mode, "samples": n, "seconds": time.perf_counter() - t,
                          "samples_s": n / (time.perf_counter() - t)}))
    else:
        raise SystemExit("bench_ab.py: no command %r" % cmd)
finally:
    cleanup()
