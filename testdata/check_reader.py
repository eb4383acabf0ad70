#!/usr/bin/env python3
"""Check the clipshard Python package (python/clipshard) against the shard
files, with numpy alone.

    python3 testdata/check_reader.py EPOCHS_DIR

- Any world size R and batch size B: rank r's batch g is the slice
  [g*B*R + r*B, g*B*R + (r+1)*B) of the epoch's order; the ranks' batches
  are disjoint, equal in number, and together the first G*B*R samples
  (remainder "drop") or all of them, padded from the start ("pad").
- DataLoader-style workers share a rank's batches round-robin: their
  union, taken in turn, is the single-process sequence.
- Resume from state_dict() with another R and B goes on exactly where the
  count says: nothing read twice, nothing skipped.
- read=True gives the bytes of the memory-mapped views; replay and mixing
  permute whole shards, or samples within blocks of K shards.
- The read-ahead asks for every data byte of a rank's batches once, in
  order, and for nothing else.
- Dataset: rows by clip id and by row, and sample windows, equal the blobs.
Prints "ok: reader ..." or raises.
"""
import json
import os
import pickle
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402
import clipshard._files  # noqa: E402
from clipshard import EpochReader  # noqa: E402


edir = sys.argv[1]
man = clipshard.load_epochs(edir)
checked = 0


def order(epoch):
    """The epoch's samples and windows in order, straight from the files."""
    entry = next(e for e in man["epochs"] if e["epoch"] == epoch)
    names = [m["name"] for m in man["modalities"]] + ["samples"]
    parts = {n: [] for n in names}
    for sh in sorted(entry["shards"], key=lambda s: s["shard"]):
        for n in names:
            parts[n].append(np.load(os.path.join(edir, sh["files"][n])))
    return {n: np.concatenate(v) for n, v in parts.items()}


def same(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    assert np.array_equal(np.atleast_1d(a).view(np.uint8), np.atleast_1d(b).view(np.uint8)), what


for ep in man["epochs"]:
    e = ep["epoch"]
    want = order(e)
    n = len(want["samples"])
    assert n == ep["samples"], (n, ep["samples"])
    for R in (1, 2, 3, 8):
        for B in (1, 4, 7):
            for remainder in ("drop", "pad"):
                G = n // (B * R) if remainder == "drop" else -(-n // (B * R))
                got = {}
                if G == 0 and n:
                    # Too few samples for one global batch: refused, not silently empty.
                    try:
                        list(EpochReader(edir, e, rank=0, world_size=R, batch_size=B, remainder=remainder))
                        raise AssertionError("an epoch of %d samples read in global batches of %d" % (n, B * R))
                    except ValueError as err:
                        assert "fewer than one global batch" in str(err), err
                    continue
                for r in range(R):
                    rd = EpochReader(edir, e, rank=r, world_size=R, batch_size=B, remainder=remainder)
                    assert len(rd) == G, (len(rd), G)
                    got[r] = list(rd.batches(0, 1))
                    assert len(got[r]) == G and rd.consumed == G * B * R, (r, len(got[r]), rd.consumed)
                for g in range(G):
                    for r in range(R):
                        pos = (np.arange(g * B * R + r * B, g * B * R + (r + 1) * B)) % n
                        for name, a in got[r][g].items():
                            same(np.asarray(a), want[name][pos], (e, R, B, remainder, g, r, name))
                        checked += B
            # Workers: round-robin, in turn, the single-process sequence.
            if n < B * R:
                continue
            single = list(EpochReader(edir, e, rank=R - 1, world_size=R, batch_size=B).batches(0, 1))
            for W in (2, 3):
                per = [list(EpochReader(edir, e, rank=R - 1, world_size=R, batch_size=B).batches(w, W)) for w in range(W)]
                merged = [per[g % W][g // W] for g in range(len(single))]
                assert sum(len(p) for p in per) == len(single), (W, [len(p) for p in per], len(single))
                for a, b in zip(merged, single):
                    same(np.asarray(a["samples"]), np.asarray(b["samples"]), ("workers", W))

    # Resume with another world size and batch size: the samples read
    # before and after are the order's prefix, each once.
    rng = np.random.default_rng(e)
    for (R1, B1), (R2, B2) in (((2, 4), (3, 5)), ((1, 7), (4, 2)), ((3, 3), (3, 3)), ((8, 1), (1, 9))):
        readers = [EpochReader(edir, e, rank=r, world_size=R1, batch_size=B1) for r in range(R1)]
        its = [rd.batches(0, 1) for rd in readers]
        stop = int(rng.integers(0, max(1, len(readers[0])) + 1))
        seen = []
        for g in range(stop):
            for it in its:
                seen.append(next(it)["samples"])
        state = readers[0].state_dict()
        assert all(rd.state_dict() == state for rd in readers), "ranks disagree on the state"
        assert state["consumed"] == stop * B1 * R1, state
        for it in its:
            it.close()
        later = [EpochReader(edir, e, rank=r, world_size=R2, batch_size=B2) for r in range(R2)]
        for rd in later:
            rd.load_state_dict(state)
        its = [rd.batches(0, 1) for rd in later]
        for g in range(len(later[0])):
            for it in its:
                seen.append(next(it)["samples"])
        cat = np.concatenate(seen) if seen else np.zeros((0, 3), np.int64)
        c2 = state["consumed"] + len(later[0]) * B2 * R2
        assert c2 <= n and n - c2 < B2 * R2, (c2, n)
        same(cat, want["samples"][:c2], ("resume", R1, B1, R2, B2, stop))

    # read=True, replay and mixing.
    for B in (3, 1000):  # (1000: more than the epoch, padded)
        a = list(EpochReader(edir, e, batch_size=B, remainder="pad").batches(0, 1))
        b = list(EpochReader(edir, e, batch_size=B, read=True, remainder="pad").batches(0, 1))
        assert len(a) == len(b) > 0
        for x, y in zip(a, b):
            for name in x:
                same(np.asarray(x[name]), np.asarray(y[name]), ("read=True", B, name))
    shards = sorted(ep["shards"], key=lambda s: s["shard"])
    rp = EpochReader(edir, e, replay_seed=1, virtual_epoch=5, batch_size=1, remainder="pad")
    assert sorted(s["shard"] for s in rp.shards) == [s["shard"] for s in shards]
    assert sum(len(x["samples"]) for x in rp) == n
    for K in (2, 3):
        mixed = EpochReader(edir, e, replay_seed=1, virtual_epoch=5, mix_shards=K, batch_size=2, remainder="pad")
        plain = EpochReader(edir, e, replay_seed=1, virtual_epoch=5, batch_size=2, remainder="pad")
        m = np.concatenate([x["samples"] for x in mixed])[:n]
        p = np.concatenate([x["samples"] for x in plain])[:n]
        wins = np.concatenate([x[man["modalities"][0]["name"]] for x in mixed])[:n]
        assert not np.array_equal(m, p) or n <= 2
        for lo in range(0, len(plain.shards), K):
            a0, a1 = plain.order.starts[lo], plain.order.starts[min(lo + K, len(plain.shards))]
            assert sorted(map(tuple, m[a0:a1])) == sorted(map(tuple, p[a0:a1])), ("mix block", K, lo)
        # Each mixed sample's window is its own.
        key = {tuple(s): i for i, s in enumerate(want["samples"]) if man["sampling"] == "tile"}
        for i, s in enumerate(m):
            if tuple(s) in key:
                same(wins[i], want[man["modalities"][0]["name"]][key[tuple(s)]], ("mixed window", K, i))
        q = clipshard.quality.measure(m, 4)
        assert q["samples"] == n

    # The read-ahead: every data byte of the rank's batches, once, in order
    # (as if nothing were cached: what is cached is not asked for, below).
    real, real_cached = os.posix_fadvise, clipshard._shards.cached
    clipshard._shards.cached = lambda fd, off, n: False
    for R, B, prefetch in ((1, 3, 1), (2, 4, 2), (3, 5, 3)):
        if n < B * R:
            continue  # (no batch: refused, above)
        for r in range(R):
            asked = {}

            def record(fd, off, ln, advice):
                assert advice == os.POSIX_FADV_WILLNEED and ln > 0
                asked.setdefault(os.readlink("/proc/self/fd/%d" % fd), []).append((off, ln))

            os.posix_fadvise = record
            try:
                rd = EpochReader(edir, e, rank=r, world_size=R, batch_size=B, prefetch=prefetch)
                rows = {}
                for g, _ in enumerate(rd.batches(0, 1)):
                    lo = g * B * R + r * B
                    for k, sh in enumerate(rd.shards):
                        a, b = max(lo, rd.order.starts[k]), min(lo + B, rd.order.starts[k + 1])
                        if a < b:
                            for name in rd.names:
                                path = os.path.realpath(rd.files.path(k, name))
                                f = clipshard._files.Npy(path)
                                off, row = f.offset, f.row
                                f.close()
                                rows.setdefault(path, []).append((off + (a - rd.order.starts[k]) * row, off + (b - rd.order.starts[k]) * row))
            finally:
                os.posix_fadvise = real
            for path, spans in rows.items():
                got = asked.get(path, [])
                cover = []
                for off, ln in got:
                    if cover and cover[-1][1] == off:
                        cover[-1] = (cover[-1][0], off + ln)
                    else:
                        cover.append((off, off + ln))
                merged = []
                for a, b in spans:
                    if merged and merged[-1][1] == a:
                        merged[-1] = (merged[-1][0], b)
                    else:
                        merged.append((a, b))
                assert cover == merged, ("read-ahead", R, B, r, path, cover, merged)
            assert set(asked) <= set(rows), ("asked for other files", set(asked) - set(rows))
    # Memory-mapped batches never probe the page cache (a range whose ends
    # are cached but not its middle would be faulted a page at a time
    # under MADV_RANDOM): every range is asked for, cached or not.
    probes = []
    clipshard._shards.cached = lambda fd, off, n: probes.append((fd, off, n)) or True
    asked = {}
    os.posix_fadvise = lambda fd, off, ln, advice: asked.setdefault(fd, []).append((off, ln))
    try:
        for _ in EpochReader(edir, e, batch_size=3, prefetch=1).batches(0, 1):
            pass
    finally:
        os.posix_fadvise = real
    assert not probes and asked, ("an EpochReader's mapped batches probed the cache", probes[:3])
    # The probe (the Loader's, which reads with preadv): a range found
    # cached is not asked for; after a miss the next PROBE_BACKOFF ranges
    # are asked for unprobed, then probing starts again.
    rd = EpochReader(edir, e, batch_size=3, prefetch=1)
    fd = next(iter(rd.files.shard(0).values())).fd
    answers = []
    clipshard._shards.cached = lambda fd, off, n: probes.append(off) or answers.pop(0)
    asked = {}
    os.posix_fadvise = lambda fd, off, ln, advice: asked.setdefault(fd, []).append((off, ln))
    try:
        answers[:] = [True]
        rd.files.advise_one(fd, 4096, 4100, probe=True)
        assert probes == [4096] and not asked, ("a cached range asked for", probes, asked)
        answers[:] = [False]
        rd.files.advise_one(fd, 4096, 4100, probe=True)
        assert len(probes) == 2 and len(asked[fd]) == 1, (probes, asked)
        for i in range(clipshard._shards.PROBE_BACKOFF):
            rd.files.advise_one(fd, 8192 + i, 8193 + i, probe=True)
        assert len(probes) == 2 and len(asked[fd]) == 1 + clipshard._shards.PROBE_BACKOFF, ("probed within the back-off", probes)
        answers[:] = [True]
        rd.files.advise_one(fd, 4096, 4100, probe=True)
        assert len(probes) == 3 and not answers, ("no probe after the back-off", probes)
        rd.files.advise_one(fd, 4096, 4100)  # probe=False: asked, not probed
        assert len(probes) == 3 and len(asked[fd]) == 2 + clipshard._shards.PROBE_BACKOFF
    finally:
        os.posix_fadvise = real
        clipshard._shards.cached = real_cached
        rd.close()
    # The probe itself reads a byte at the range's middle and at its first
    # and last whole pages, not at its ends: a range whose end pages a
    # neighbour brought in (a drawn block shares its last W-1 frames with
    # the next one's first) but not its middle is not "cached". (Checked
    # on the calls: a RWF_NOWAIT read of a page the cache lacks may
    # still return it if the read it starts is done in time.)
    if getattr(os, "RWF_NOWAIT", None) is not None:
        real_preadv, probed = os.preadv, []

        def fake(fd, bufs, at, flags=0):
            assert flags == os.RWF_NOWAIT
            probed.append(at)
            if at // 4096 in lacks:
                raise BlockingIOError
            return 1

        os.preadv = fake
        try:
            lacks = {128}  # the middle page of [4000, 4000 + 1040576)
            assert not clipshard._files.cached(0, 4000, 1040576) and probed == [524288], probed
            lacks, probed[:] = {0, 254 + 1}, []  # only the pages it shares with its neighbours
            assert clipshard._files.cached(0, 4000, 1040576) and probed == [524288, 4096, 1044479], probed
            lacks, probed[:] = {1}, []
            assert not clipshard._files.cached(0, 4000, 1040576) and probed == [524288, 4096], probed
            lacks, probed[:] = {0}, []  # less than a whole page: its middle
            assert not clipshard._files.cached(0, 100, 200) and probed == [200], probed
        finally:
            os.preadv = real_preadv
    # The Loader over files the page cache holds (just read) asks for
    # nothing: asking walks every page of them.
    if getattr(os, "RWF_NOWAIT", None) is not None:
        asked = {}
        os.posix_fadvise = lambda fd, off, ln, advice: asked.setdefault(fd, []).append((off, ln))
        try:
            ld = clipshard.Loader(edir, e, batch_size=3, prefetch=1)
            for _ in ld:
                pass
        finally:
            os.posix_fadvise = real
        assert not asked, ("cached bytes asked for by the Loader", asked)

# Dataset: by id, by row, and sample windows.
ds = clipshard.Dataset(man["dataset"]["dir"])
assert ds.ids is not None and len(ds.ids) == len(ds)
first = man["epochs"][0]
smp = order(first["epoch"])
for i, clip in enumerate(ds.ids):
    a, b = ds[clip], ds[i]
    for name in a:
        same(np.asarray(a[name]), np.asarray(b[name]), ("dataset", clip, name))
        if ds.modalities[name].get("per_clip"):
            assert a[name].shape == tuple(ds.modalities[name]["frame_shape"]), (name, a[name].shape)
            same(np.asarray(a[name]), np.asarray(ds.blobs[name][i]), ("per-clip", clip, name))
            continue
        rate = ds.modalities[name]["rate"]
        assert len(a[name]) == ds.index[i][1] * rate
for j, s in enumerate(smp["samples"][:50]):
    w = ds.window(s)
    for name, rows in w.items():
        if ds.modalities[name].get("per_clip"):
            same(smp[name][j], np.asarray(rows), ("per-clip value", j, name))
            continue
        same(smp[name][j][: len(rows)], np.asarray(rows), ("window", j, name))
try:
    ds["no such clip"]
    raise AssertionError("unknown clip id found")
except KeyError:
    pass

# Pickled (a DataLoader worker started by spawn or forkserver gets its
# dataset so): a Dataset maps its blobs again instead of copying them into
# the pickle, and refuses a dataset.json changed since; an EpochReader is
# made again at its resume point.
blob = pickle.dumps(ds)
data_bytes = sum(np.asarray(a).nbytes for a in ds.blobs.values())
assert len(blob) < 64 << 10 and (data_bytes < 64 << 10 or len(blob) < data_bytes // 4), (len(blob), data_bytes)
back = pickle.loads(blob)
for name in ds.modalities:
    same(np.asarray(back.blobs[name]), np.asarray(ds.blobs[name]), ("pickled dataset", name))
    assert isinstance(back.blobs[name], np.memmap), name
tmp = tempfile.mkdtemp()
copy = os.path.join(tmp, "ds")
shutil.copytree(ds.dir, copy)
blob = pickle.dumps(clipshard.Dataset(copy))
with open(os.path.join(copy, "dataset.json")) as f:
    changed = json.load(f)
changed["clips_note"] = "converted again"
with open(os.path.join(copy, "dataset.json"), "w") as f:
    json.dump(changed, f)
try:
    pickle.loads(blob)
    raise AssertionError("a Dataset unpickled over a changed dataset.json")
except ValueError as e:
    assert copy in str(e) and "changed" in str(e), e
shutil.rmtree(tmp)
e0 = man["epochs"][0]["epoch"]
for R, r, B in ((1, 0, 4), (3, 2, 2)):
    a = EpochReader(edir, e0, rank=r, world_size=R, batch_size=B)
    a.load_state_dict(dict(a.state_dict(), consumed=B * R))
    b = pickle.loads(pickle.dumps(a))
    got, want = list(b), list(a)
    assert len(got) == len(want) > 0, (R, len(got), len(want))
    for x, y in zip(got, want):
        for name in y:
            same(np.asarray(x[name]), np.asarray(y[name]), ("pickled reader", R, name))
print("ok: reader (%d samples checked; pickled Dataset and EpochReader)" % checked)
