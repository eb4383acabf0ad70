#!/usr/bin/env python3
"""Check epochs drawn at read time (clipshard.Loader(dataset=...),
clipshard.draw) against docs/FORMAT.md and the dataset.

    python3 testdata/check_drawn.py DEMO_DS A B C OTHER

DEMO_DS: the demo set with per-clip modalities; A, B, C: datasets of
the same modalities (for mixing), OTHER: one whose motion differs.

- The order: re-derived here from FORMAT.md's "Epochs drawn at read
  time" alone (plain Python integers, no clipshard code), equal to the
  reader's for tile and random sampling, pad and skip, several blocks
  and groups, a held and a streamed modality, and mixes of three sources
  (natural, weighted with a curriculum, epoch_samples below and above
  the sources' windows: more passes).
- Exactly once: world sizes 1, 2, 3, 5, 8 x batch sizes that do not
  divide x DataLoader-style workers 1, 2, 3 (DrawnReader.batches) and
  the Loader's threads 1, 2, prefetch 0, 4: each rank reads its stretch
  of the order (FORMAT's layout), every window once ("drop": all but
  fewer than a global batch; "pad": all, the last batch filled from the
  start), the same batches whatever the workers and threads.
- Each window's bytes are the dataset's rows (zero past valid), each
  per-clip value its clip's.
- Resume: a state (through JSON) after k batches (0, some, the last,
  an epoch's end) resumed with other world sizes and batch sizes, in
  the Loader across epoch boundaries: every window of each epoch once.
- Hostile datasets raise naming the file: a blob cut short, a header
  that lies, index.npy out of range, a held blob changed since
  SHA256SUMS, a blob cut short while the loader reads, only per-clip
  modalities, frames of no values; an epochs folder given as a dataset;
  sources whose modalities differ; a dataset converted again while a
  loader draws from it (its next epoch refused); close() leaves no file
  open.
- A group's read asks the kernel for every row the rank's windows of
  it read, nothing outside its blocks, in each file's order.
- torch (when installed): EpochDataset(dataset=...) through a
  DataLoader with 0 and 2 workers gives the reader's batches, resumes
  from state_dict(batch); torch.Loader(dataset=...) casts to float32.
Prints "ok: drawn ..." or raises.
"""
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from fractions import Fraction

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from clipshard import Dataset, Loader  # noqa: E402
from clipshard.draw import Drawn, DrawnReader  # noqa: E402
from clipshard._cut import Cutter  # noqa: E402

DEMO, A, B, C, OTHER = sys.argv[1:6]
M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


# -- FORMAT.md, by hand ------------------------------------------------------


def mix(z):
    z &= M64
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & M64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def u(seed, E, tag, i):
    k = mix(mix(mix(seed ^ 0x636C697073686172) ^ E) ^ tag)
    return mix(k + (i + 1) * GAMMA)


def below(x, n):
    return min(n - 1, int(((x >> 11) * 2.0 ** -53) * n))


def windows(lengths, W, sampling, K, short, seed, E):
    out = []
    for i, L in enumerate(lengths):
        if L < W:
            if short == "pad" and L > 0:
                out.append((i, 0, L))
        elif sampling == "tile":
            o = below(u(seed, E, 1, i), min(W, L - W + 1))
            k = 0
            while o + k * W + W <= L:
                out.append((i, o + k * W, W))
                k += 1
        else:
            for k in range(K):
                out.append((i, below(u(seed, E, 1, i * K + k), L - W + 1), W))
    return out


def geometry(ds_dir, opts):
    man = json.load(open(os.path.join(ds_dir, "dataset.json")))
    frames = man["frames"]
    hold = opts.get("hold", 64 << 20)
    streamed = []
    for m in man["modalities"]:
        row = int(np.prod(m["frame_shape"], dtype=np.int64)) * np.dtype(m["dtype"]).itemsize
        data = os.path.getsize(os.path.join(ds_dir, m["file"])) - m["data_offset"]
        if not m.get("per_clip") and data > hold:
            streamed.append(m["rate"] * row)
    if not streamed:
        return frames, 1
    group_frames = opts.get("buffer", 2 << 30) // 2 // sum(streamed)
    if opts.get("block", "auto") == "auto":
        BF = max(opts["window"], min(-(-(8 << 20) // max(streamed)), max(-(-(256 << 10) // max(streamed)), group_frames // 2048)))
    else:
        BF = -(-opts["block"] // max(streamed))
    BF = max(1, BF)
    return BF, opts.get("group") or max(1, group_frames // BF)


def source_pass(ds_dir, opts, seed, E):
    idx = np.load(os.path.join(ds_dir, "index.npy"))
    starts, lengths = [int(x) for x in idx[:, 0]], [int(x) for x in idx[:, 1]]
    BF, G = geometry(ds_dir, opts)
    frames = sum(lengths)
    nblocks = -(-frames // BF) if frames else 0
    border = sorted(range(nblocks), key=lambda k: (u(seed, E, 2, k), k))
    group = {k: q // G for q, k in enumerate(border)}
    ws = windows(lengths, opts["window"], opts.get("sampling", "tile"), opts.get("per_clip", 1), opts.get("short", "skip"), seed, E)
    keyed = sorted(range(len(ws)), key=lambda j: (group[(starts[ws[j][0]] + ws[j][1]) // BF], u(seed, E, 3, j), j))
    return [ws[j] for j in keyed]


def split(N, w):
    W = sum(w)
    exact = [Fraction(N) * x / W for x in w]
    c = [int(e) for e in exact]
    for s in sorted(range(len(w)), key=lambda s: (-(exact[s] - c[s]), s))[:N - sum(c)]:
        c[s] += 1
    return c


def epoch_order(dirs, opts, e):
    """[(source, clip, start, valid)] of epoch e, by FORMAT.md."""
    seeds = [(opts.get("seed", 0) + s * GAMMA) & M64 for s in range(len(dirs))]
    first = [source_pass(d, opts, seeds[s], e) for s, d in enumerate(dirs)]
    own = [len(p) for p in first]
    N = opts.get("epoch_samples", 0) or sum(own)
    sched = opts.get("weights")
    if sched is None:
        counts = own if not opts.get("epoch_samples") else split(N, [Fraction(n) for n in own])
    else:
        rs = [{"from": 0, "weights": sched}] if isinstance(sched, dict) else sched
        r = next(r for r in rs if r.get("from", 0) <= e and (not r.get("to") or e < r["to"]))
        counts = split(N, [Fraction(str(r["weights"].get(n, 0))) for n in opts["names"]])
    seqs = []
    for s, d in enumerate(dirs):
        seq, p = [], 0
        while len(seq) < counts[s]:
            seq += first[s] if p == 0 else source_pass(d, opts, seeds[s], e | p << 32)
            p += 1
        seqs.append(seq[:counts[s]])
    if len(dirs) == 1:
        return [(0,) + w for w in seqs[0]]
    keyed = []
    for s, seq in enumerate(seqs):
        c = len(seq)
        for j, w in enumerate(seq):
            k = float(j * (1 << 20) + (u(seeds[s], e, 4, j) >> 44)) / float(c * (1 << 20))
            keyed.append(((k, s, j), (s,) + w))
    return [w for _, w in sorted(keyed)]


def layout(remaining, R, B, remainder, r):
    """Rank r's positions of the order, batch after batch (FORMAT.md)."""
    seq = [p for a, b in remaining for p in range(a, b)]
    n = len(seq)
    nb = n // (R * B) if remainder == "drop" else -(-n // (R * B))
    lo, hi = r * nb * B, (r + 1) * nb * B
    if remainder == "partial":
        hi = min(hi, n)
    return [seq[v % n] for v in range(lo, hi)], nb


# -- the reader against it -------------------------------------------------------

checked = {"orders": 0, "layouts": 0, "windows": 0, "resumes": 0, "hostile": 0}


def order_of(plan, e):
    o = plan.order(e)
    return list(zip(o.source.tolist(), o.clip.tolist(), o.start.tolist(), o.valid.tolist()))


CASES = [
    ([DEMO], dict(window=5, seed=7, block=4096, group=2, hold=4096)),
    ([DEMO], dict(window=7, seed=2 ** 64 - 3, sampling="random", per_clip=3, short="skip", block=4096, group=3, hold=10000)),
    ([DEMO], dict(window=30, seed=1, block=8192, group=1, hold=0)),
    ([DEMO], dict(window=5, seed=5)),  # every modality held: one block
    ([DEMO], dict(window=4, seed=6, hold=0, buffer=1 << 20)),  # block "auto": a block a few windows, groups of ~2 MiB
    ([A, B, C], dict(window=5, seed=3, block=4096, group=2, hold=4096)),
    ([A, B, C], dict(window=6, seed=9, block=4096, group=2, hold=4096,
                     weights=[{"from": 0, "to": 2, "weights": {"a": 1, "b": "2.5", "c": 0}}, {"from": 2, "weights": {"a": 1, "b": 1, "c": 3}}])),
    ([A, B, C], dict(window=5, seed=4, block=4096, group=4, hold=4096, epoch_samples=40)),
    ([A, B, C], dict(window=5, seed=4, sampling="random", per_clip=2, block=4096, buffer=300000, hold=4096, epoch_samples=900,
                     weights={"a": 1, "b": 1, "c": 1})),
]


def plan_of(dirs, opts):
    names = ["a", "b", "c"][:len(dirs)]
    ds = dirs[0] if len(dirs) == 1 else dict(zip(names, dirs))
    kw = {k: v for k, v in opts.items() if k != "names"}
    return Drawn(ds, **kw), dict(opts, names=names)


for dirs, opts in CASES:
    plan, ref_opts = plan_of(dirs, opts)
    for e in (0, 1, 2, 5):
        got, want = order_of(plan, e), epoch_order(dirs, ref_opts, e)
        assert got == want, (dirs, opts, e, got[:5], want[:5])
        checked["orders"] += 1
    plan.close()

# Exactly once, each rank its stretch, the same whatever the workers.
dsets = {DEMO: Dataset(DEMO), A: Dataset(A), B: Dataset(B), C: Dataset(C)}


def check_batch(plan, dirs, b, n=None):
    """The batch's windows are the dataset's rows."""
    smp = b["samples"]
    for i in range(len(smp) if n is None else min(n, len(smp))):
        s = int(smp[i, 3]) if smp.shape[1] == 4 else 0
        want = dsets[dirs[s]].window(smp[i, :3])
        for name, a in want.items():
            got = b[name][i]
            if dsets[dirs[s]].modalities[name].get("per_clip"):
                assert np.array_equal(got, a), name
            else:
                assert np.array_equal(got[:len(a)], a), (name, smp[i])
                assert not got[len(a):].view(np.uint8).any(), (name, "not zero past valid")
        checked["windows"] += 1


# Every R, B, remainder and worker count on a plain and a mixed set with a
# curriculum; with CLIPSHARD_EXHAUSTIVE=1 (CI) on random sampling and
# block "auto" too (their orders are checked by hand above either way).
for dirs, opts in (CASES[0], CASES[1], CASES[4], CASES[6]) if os.environ.get("CLIPSHARD_EXHAUSTIVE") else (CASES[0], CASES[6]):
    plan, _ = plan_of(dirs, opts)
    e = 2
    order = order_of(plan, e)
    n = len(order)
    for R in (1, 2, 3, 5, 8):
        for Bs in (1, 3, 7):
            for remainder in ("drop", "pad") if R > 1 else ("drop", "pad", "partial"):
                if remainder == "drop" and n < R * Bs:
                    continue
                seen = []
                for r in range(R):
                    want, nb = layout([(0, n)], R, Bs, remainder, r)
                    per_worker = {}
                    for nw in (1, 2, 3):
                        got = {}
                        for w in range(nw):
                            rd = DrawnReader(plan, e, rank=r, world_size=R, batch_size=Bs, remainder=remainder)
                            for g, b in zip(range(w, nb, nw), rd.batches(worker_id=w, num_workers=nw)):
                                got[g] = b
                        assert sorted(got) == list(range(nb)), (R, Bs, nw, sorted(got), nb)
                        rows = np.concatenate([got[g]["samples"] for g in range(nb)]) if nb else np.zeros((0, 4))
                        per_worker[nw] = got
                        tuples = [((int(x[3]) if len(x) == 4 else 0), int(x[0]), int(x[1]), int(x[2])) for x in rows]
                        assert tuples == [order[p] for p in want], (R, Bs, remainder, nw)
                    for g in range(nb):  # the same bytes whatever the workers
                        for k in per_worker[1][g]:
                            assert np.array_equal(per_worker[1][g][k], per_worker[3][g][k]), (g, k)
                    if R == 3 and Bs == 3:
                        for g in range(nb):
                            check_batch(plan, dirs, per_worker[2][g])
                    seen += want
                    checked["layouts"] += 1
                if remainder == "drop":
                    assert len(set(seen)) == len(seen) and n - len(seen) < R * Bs, (R, Bs, n, len(seen))
                else:
                    assert set(seen) == set(range(n)) and len(seen) - n < R * Bs, (R, Bs, remainder)
    plan.close()

# The two ways a streamed modality's windows are read (a gather from a
# memory map of the blob, the default; one pread a window, read=True):
# the same bytes, the dataset's rows, zeros past valid (windows of clips
# shorter than W among them: the last two cases' W is the median clip of
# the demo and of the mixed sets: a batch of several sources with short
# windows, its read split among threads).
longW = int(np.median(dsets[DEMO].index[:, 1])) + 1
longWmix = max(int(np.median(dsets[d].index[:, 1])) for d in (A, B, C)) + 1
for dirs, opts in (CASES[0], CASES[2], CASES[4], CASES[6], ([DEMO], dict(window=longW, seed=11, short="pad", block=4096, group=2, hold=0)),
                   ([A, B, C], dict(window=longWmix, seed=12, short="pad", block=4096, group=2, hold=0))):
    plans = [plan_of(dirs, dict(opts, read=r))[0] for r in (False, True)]
    assert [bool(s.maps) for s in plans[0].sources] == [any(not r["held"] for r in s.mods) for s in plans[0].sources]
    assert not any(s.maps for s in plans[1].sources)
    short = 0
    for a, b in zip(*(DrawnReader(p, 1, batch_size=7, remainder="partial").batches(0, 1) for p in plans)):
        for k in b:
            assert np.array_equal(a[k], b[k]), (opts, k)
        check_batch(plans[0], dirs, a)
        short += int((a["samples"][:, 2] < opts["window"]).sum())
    assert short or opts["window"] not in (longW, longWmix), "no window shorter than W: the zeros past valid not checked"
    if len(dirs) > 1 and opts["window"] == longWmix:  # the same, its batches' rows split among 2 and 3 threads
        r = DrawnReader(plans[0], 1, batch_size=7, remainder="partial")
        shapes = plans[0].shapes()
        for g in range(len(r)):
            for parts in (2, 3):
                out = {k: np.empty((7,) + sh, d) for k, (d, sh) in shapes.items()}
                for v in out.values():
                    v.reshape(-1).view(np.uint8)[:] = 0x55  # (not zeros: the zeros past valid are the copy's)
                for job in r.jobs(g, out, parts):
                    job()
                n = len(r.batch_positions(g))
                check_batch(plans[0], dirs, {k: v[:n] for k, v in out.items()})
        assert len(set(r.order.source.tolist())) > 1
        r.close()
    # rows past the blob (an order that disagrees with it) raise, naming it,
    # never copy what mode="clip" would make of them
    src = plans[0].sources[0]
    name = next(iter(src.maps))  # (every case streams a modality)
    (m,), (f,) = src.maps[name], src.files[name]  # (one segment: one blob)
    for first in (len(m), -1):
        try:
            Cutter._gather_index(f, m, np.array([first]), np.array([1]), 1)
            raise AssertionError("row %d of %d gathered" % (first, len(m)))
        except ValueError as e:
            assert f.path in str(e) and "disagree" in str(e), str(e)
    # a destination that is not contiguous is refused (its reshape would
    # be a copy that the rows went to, the batch left as it was)
    r = DrawnReader(plans[0], 1, batch_size=7, remainder="partial")
    shapes = plans[0].shapes()
    out = {k: np.zeros((7,) + shape, dtype=d) for k, (d, shape) in shapes.items()}
    out[name] = np.zeros((7,) + shapes[name][1][:-1] + (2 * shapes[name][1][-1],), shapes[name][0])[..., ::2]
    try:
        r.jobs(0, out, 2)
        raise AssertionError("a strided destination taken")
    except RuntimeError as e:
        assert "contiguous" in str(e) and name in str(e), str(e)
    r.close()
    for p in plans:
        p.close()
for bad in ("yes", 1, 0, None):
    try:
        Drawn(DEMO, window=5, read=bad)
        raise AssertionError("read=%r taken" % (bad,))
    except ValueError as e:
        assert "read" in str(e)
# A misspelt keyword (#64.10: batchsize= was a TypeError of Drawn's, which
# a Loader's user never called): one ValueError naming it and the keyword
# meant, drawn or not.
for kw, meant in ((dict(dataset=DEMO, window=5, batchsize=4), "batch_size="), (dict(dataset=DEMO, window=5, wndow=3), "window="),
                  (dict(edir=DEMO, batchsize=4), "batch_size=")):
    try:
        Loader(epochs=[0], **kw)
        raise AssertionError("%r taken" % (kw,))
    except ValueError as e:
        bad = next(k for k in kw if k not in ("dataset", "window", "edir") or k == "wndow")
        assert "unexpected arguments" in str(e) and bad in str(e) and "did you mean %s" % meant in str(e), str(e)
# A window too long for any clip or memory (#60.6: 2**63 was an
# OverflowError): a ValueError naming window; one that fits the argument
# but not memory, a ValueError naming batch_size.
for bad in (2 ** 63, 2 ** 40, 10 ** 30, 0, -1, 2.5):
    try:
        Loader(dataset=DEMO, window=bad, batch_size=4, epochs=[0])
        raise AssertionError("window=%r taken" % (bad,))
    except ValueError as e:
        assert str(e).startswith("window %r: " % (bad,)), str(e)
try:
    list(Loader(dataset=DEMO, window=2 ** 30, batch_size=4, epochs=[0], short="pad"))
    raise AssertionError("a batch larger than memory taken")
except ValueError as e:
    assert str(e).startswith("batch_size 4: ") and "memory" in str(e), str(e)
# (#64.2) skip, the default: a window longer than every clip refused, as
# shuffle refuses it, naming the longest clip and the fix.
try:
    Loader(dataset=DEMO, window=500, batch_size=4, epochs=[0])
    raise AssertionError("a window longer than every clip taken")
except ValueError as e:
    assert "every clip is shorter than window 500" in str(e) and "short='pad'" in str(e), str(e)
L = Loader(dataset=DEMO, window=int(dsets[DEMO].index[:, 1].max()), batch_size=1, epochs=[0])
n_short = int((dsets[DEMO].index[:, 1] < L.list.drawn.window).sum())
assert L.list.drawn.short_clips == {L.list.drawn.names[0]: n_short} and n_short > 0, (L.list.drawn.short_clips, n_short)
assert ("%d clips shorter than the window" % n_short) in repr(L) and "left out (short='skip')" in repr(L), repr(L)
L.close()

# read="auto": the map where the streamed blobs fit in half the memory
# the process may use, one pread a window where they do not (the same
# batches either way); that memory from MemTotal and the cgroup's limits.
import clipshard.draw  # noqa: E402
from clipshard._files import memory_limit  # noqa: E402
ref = Drawn(DEMO, window=5, seed=4, block=4096, group=2, hold=0, read=False)
assert ref.read is False and ref.sources[0].maps
want = list(DrawnReader(ref, 0, batch_size=4).batches(0, 1))
real = clipshard.draw.memory_limit
need = sum(s.streamed_bytes() for s in ref.sources)
try:
    for limit, mapped in ((need * 2, True), (need * 2 - 2, False), (None, True)):
        clipshard.draw.memory_limit = lambda: limit
        p = Drawn(DEMO, window=5, seed=4, block=4096, group=2, hold=0)
        assert p.read is (not mapped) and bool(p.sources[0].maps) == mapped, (limit, need, p.read)
        got = list(DrawnReader(p, 0, batch_size=4).batches(0, 1))
        assert len(got) == len(want) and all(np.array_equal(a[k], b[k]) for a, b in zip(got, want) for k in b), limit
        p.close()
    # A buffer of more than half that memory, for a source that does not
    # fit either, is warned of (the read-ahead would be evicted); not one
    # that fits.
    import warnings  # noqa: E402
    for limit, buffer, warned in ((need, need, True), (need, need // 2, False), (need * 4, need, False)):
        clipshard.draw.memory_limit = lambda: limit
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            Drawn(DEMO, window=5, seed=4, block=4096, hold=0, buffer=buffer).close()
        said = [str(x.message) for x in w if "buffer" in str(x.message)]
        assert bool(said) == warned, (limit, buffer, said)
        assert not said or ("evicted" in said[0] and "%d bytes" % limit in said[0]), said
    # A file system that cannot map the blobs (some FUSE and network
    # mounts: ENODEV): auto reads them a pread a window, the same batches;
    # read=False refuses, naming the blob.
    clipshard.draw.memory_limit = real
    import errno  # noqa: E402
    from clipshard import _files  # noqa: E402
    real_map = _files.np.memmap

    def no_map(*a, **k):
        raise OSError(errno.ENODEV, "No such device")
    _files.np.memmap = no_map
    try:
        p = Drawn(DEMO, window=5, seed=4, block=4096, group=2, hold=0)
        assert not p.sources[0].maps
        got = list(DrawnReader(p, 0, batch_size=4).batches(0, 1))
        assert len(got) == len(want) and all(np.array_equal(a[k], b[k]) for a, b in zip(got, want) for k in b)
        p.close()
        try:
            Drawn(DEMO, window=5, seed=4, block=4096, group=2, hold=0, read=False)
            raise AssertionError("read=False on a file system that cannot map: taken")
        except ValueError as e:
            assert "cannot be memory-mapped" in str(e) and DEMO in str(e) and ".npy" in str(e) and "read=True" in str(e), str(e)
    finally:
        _files.np.memmap = real_map
finally:
    clipshard.draw.memory_limit = real
ref.close()
assert Drawn(DEMO, window=5, hold=0).read is (memory_limit() is not None and need > memory_limit() // 2)
assert Loader(dataset=DEMO, epochs=[0], window=5, hold=0).drawn.read is Drawn(DEMO, window=5, hold=0).read
assert Loader(dataset=DEMO, epochs=[0], window=5, read=True).drawn.read is True
fake = tempfile.mkdtemp()
GiB = 1 << 30


def fake_tree(files):
    shutil.rmtree(fake)
    for rel, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(fake, rel)), exist_ok=True)
        with open(os.path.join(fake, rel), "w") as f:
            f.write(text)
    return memory_limit(os.path.join(fake, "proc"), os.path.join(fake, "cg"))


meminfo = {"proc/meminfo": "MemTotal:       16777216 kB\nMemFree:  1 kB\n"}  # 16 GiB
for files, want_limit in (
        (dict(meminfo), 16 * GiB),  # no cgroup file
        (dict(meminfo, **{"proc/self/cgroup": "0::/job/step\n", "cg/job/memory.max": "%d\n" % (4 * GiB),
                          "cg/job/step/memory.max": "max\n"}), 4 * GiB),  # v2: a parent's limit
        (dict(meminfo, **{"proc/self/cgroup": "0::/\n", "cg/memory.max": "%d\n" % (2 * GiB)}), 2 * GiB),  # v2, a container's namespace
        (dict(meminfo, **{"proc/self/cgroup": "12:cpu,cpuacct:/x\n9:memory:/slurm/uid_0/job_7\n0::/y\n",
                          "cg/memory/slurm/memory.limit_in_bytes": "9223372036854771712\n",
                          "cg/memory/slurm/uid_0/job_7/memory.limit_in_bytes": "%d\n" % (3 * GiB)}), 3 * GiB),  # v1 (a Slurm job)
        (dict(meminfo, **{"proc/self/cgroup": "garbage\n0::/z\n", "cg/z/memory.max": "lots\n"}), 16 * GiB),
        ({"proc/self/cgroup": "0::/\n"}, None)):
    got_limit = fake_tree(files)
    assert got_limit == want_limit, (files, got_limit, want_limit)
shutil.rmtree(fake)

# The Loader: threads and prefetch change nothing; a cast is numpy's.
dirs, opts = CASES[6]
names = ["a", "b", "c"]
for threads, prefetch, dtype in ((1, 0, None), (2, 4, None), (2, 1, np.float32)):
    L = Loader(dataset=dict(zip(names, dirs)), epochs=[0, 1], rank=1, world_size=2, batch_size=5, threads=threads,
               prefetch=prefetch, dtype=dtype, **opts)
    plan, _ = plan_of(dirs, opts)
    for e in (0, 1):
        ref = list(DrawnReader(plan, e, rank=1, world_size=2, batch_size=5).batches(0, 1))
        got = [{k: np.array(v) for k, v in b.items()} for b in L]
        assert len(got) == len(ref) > 0, (e, len(got), len(ref))
        for a, b in zip(got, ref):
            for k in b:
                want = b[k].astype(np.float32) if dtype is not None and b[k].dtype.kind == "f" else b[k]
                assert a[k].dtype == want.dtype and np.array_equal(a[k], want), (threads, prefetch, k)
            assert np.array_equal(a["source"], b["samples"][:, 3])
    L.close()
    plan.close()


# Resume: any k, any new world size and batch size, across epochs.
def run_loader(dirs, opts, R, B, epochs, state=None, stop=None, remainder="drop"):
    """Every rank's windows per epoch; the state after `stop` batches."""
    seen = {}
    states = []
    ds = dirs[0] if len(dirs) == 1 else dict(zip(names, dirs))
    for r in range(R):
        L = Loader(dataset=ds, epochs=epochs, rank=r, world_size=R, batch_size=B, remainder=remainder,
                   **{k: v for k, v in opts.items() if k != "names"})
        if state is not None:
            L.load_state_dict(json.loads(json.dumps(state)))
        k, st = 0, None
        while L.epoch is not None and st is None:
            e = L.epoch
            for b in L:
                for x in b["samples"]:
                    t = (int(x[3]) if len(x) == 4 else 0, int(x[0]), int(x[1]), int(x[2]))
                    seen.setdefault(e, []).append(t)
                k += 1
                if stop is not None and k == stop:
                    st = L.state_dict()
                    break
        if stop is not None and st is None:
            st = L.state_dict()
        states.append(st)
        L.close()
    if stop is not None:
        assert all(s == states[0] for s in states), "the ranks' states differ"
    return seen, states[0]


for dirs, opts in (CASES[0], CASES[7]):
    plan, ref = plan_of(dirs, opts)
    orders = {e: epoch_order(dirs, ref, e) for e in (0, 1, 2)}
    for (R1, B1, stop, R2, B2) in ((2, 3, 1, 3, 2), (3, 2, 0, 1, 5), (1, 4, 5, 2, 3), (5, 1, 3, 2, 2), (2, 2, 10 ** 6, 3, 1)):
        a, st = run_loader(dirs, opts, R1, B1, [0, 1, 2], stop=stop)
        b, _ = run_loader(dirs, opts, R2, B2, [0, 1, 2], state=st)
        for e in (0, 1, 2):
            got = a.get(e, []) + b.get(e, [])
            assert len(set(got)) == len(got), (R1, B1, stop, R2, B2, e, "twice")
            assert set(got) <= set(orders[e])
            assert len(orders[e]) - len(got) < R1 * B1 + R2 * B2, (e, len(orders[e]), len(got))
        checked["resumes"] += 1
    plan.close()
# A DrawnReader's state, its done epoch, and refusals.
plan, _ = plan_of(*CASES[0])
rd = DrawnReader(plan, 0, batch_size=4)
list(rd)
st = rd.state_dict()
assert st["done"] and st["remaining"] == [], st
rd2 = DrawnReader(plan, 0, batch_size=3, world_size=2, rank=1)
rd2.load_state_dict(json.loads(json.dumps(st)))
assert len(rd2) == 0 and list(rd2) == []
for bad in (dict(st, id="x"), dict(st, epoch=1), dict(st, remaining=[[5, 3]]), dict(st, remaining=[[0, 10 ** 9]]), dict(st, done=1),
            dict(st, remaining=[[0, 4], [2, 6]]), dict(st, format="clipshard.reader")):
    try:
        DrawnReader(plan, 0).load_state_dict(bad)
    except ValueError:
        continue
    raise AssertionError("state %r was taken" % (bad,))
plan.close()

# What a group's read asks of the kernel (posix_fadvise WILLNEED, each
# streamed file in its own order): every row the rank's windows of the
# group read, nothing else; in two parts (two threads), the same.
if hasattr(os, "posix_fadvise"):
    import clipshard._groupreads as _reads
    asked = []
    real_advise, real_cached = os.posix_fadvise, _reads._cached
    os.posix_fadvise = lambda fd, off, n, adv: asked.append((fd, off, n))
    _reads._cached = lambda fd, off, n: False  # (the demo set is in the page cache: ask anyway)
    try:
        for dirs, opts in (CASES[0], CASES[2], CASES[4], CASES[5]):
            plan, _ = plan_of(dirs, opts)
            for R in (1, 3):
                for r in range(R):
                    rd = DrawnReader(plan, 1, batch_size=3, world_size=R, rank=r)
                    o = plan.order(1)
                    pos = rd.positions()
                    for gid in rd.reads._needs()[1].tolist():
                        del asked[:]
                        for part in range(2):
                            rd.reads._fetch(gid, part, 2)
                        halves = sorted(asked)
                        del asked[:]
                        rd.reads._fetch(gid)
                        assert halves == sorted(asked), "group %d: its two parts ask other ranges than it whole" % gid
                        s_, _ = o.groups[gid]
                        src = plan.sources[s_]
                        mine = pos[o.group[pos] == gid]
                        for rec in src.mods:
                            if rec["held"]:
                                continue
                            (f,) = src.files[rec["name"]]
                            mine_f = sorted((off, off + n) for fd, off, n in asked if fd == f.fd)
                            got = [(fd, off) for fd, off, n in asked if fd == f.fd]
                            assert [x[1] for x in got] == sorted(x[1] for x in got), (rec["name"], "asked out of order")
                            step = rec["rate"] * f.row
                            for k in mine.tolist():  # every window's rows inside an asked range
                                a = f.offset + o.gs[k] * step
                                b = a + o.valid[k] * step
                                assert any(lo <= a and b <= hi for lo, hi in mine_f), (rec["name"], k, a, b, mine_f)
                            W = plan.window
                            read = np.zeros(src.frames + 1, bool)  # the frames the windows' gather touches
                            for k in mine.tolist():
                                read[o.gs[k]: min(o.gs[k] + W, src.frames)] = True
                            for lo, hi in mine_f:  # nothing else: not the rows between windows, nor another group's
                                fa, fb = (lo - f.offset) // step, (hi - f.offset) // step
                                assert (lo - f.offset) % step == 0 and (hi - f.offset) % step == 0, (rec["name"], lo, hi)
                                assert read[fa:fb].all(), (rec["name"], "frames %d..%d asked, some no window reads" % (fa, fb))
                                checked["advised"] = checked.get("advised", 0) + 1
            plan.close()
        # A modality's range in the page cache says nothing of another's
        # (a probe of a cold page starts a read of its own): each
        # modality's range is probed and asked for by itself. (The first
        # modality's probe alone skipped them all: a cold epoch of 4000
        # clips read a sixth of the dataset by page faults at its end.)
        plan, _ = plan_of(*CASES[2])
        rd = DrawnReader(plan, 1, batch_size=3)
        src = plan.sources[0]
        streamed = [src.files[rec["name"]][0].fd for rec in src.mods if not rec["held"]]
        assert len(streamed) > 1, "the case streams one modality"
        _reads._cached = lambda fd, off, n: fd == streamed[0]
        for gid in rd.reads._needs()[1].tolist():
            del asked[:]
            rd.reads._fetch(gid)
            fds = {fd for fd, _, _ in asked}
            assert fds == set(streamed[1:]), ("group %d: asked of %s, the uncached modalities are %s" % (gid, fds, streamed[1:]))
            checked["advised"] += 1
        plan.close()
    finally:
        os.posix_fadvise, _reads._cached = real_advise, real_cached
    assert checked["advised"] > 20, checked

# The groups a batch needs are asked for before the groups read ahead
# (asked beside them, they share the disk with them: the first batch of a
# cold epoch waits for both).
import clipshard._cut as _cut  # noqa: E402
# _distinct (np.unique without numpy 2.3+'s import of numpy.ma in a first
# batch): np.unique's answer, empty, one, repeated, negative, int32/int64
_rng = np.random.default_rng(5)
for _a in [np.zeros(0, np.int64), np.array([7]), np.array([3, 3, 3], np.int32), _rng.integers(-5, 5, 50),
           _rng.integers(0, 1 << 40, 300)]:
    _d = _cut._distinct(_a)
    assert _d.dtype == _a.dtype and np.array_equal(_d, np.unique(_a)), (_a, _d)
plan, _ = plan_of(*CASES[2])
rd = DrawnReader(plan, 1, batch_size=3)
events = []


def fetch_logged(gid, part=0, parts=1, _lock=threading.Lock()):
    with _lock:
        events.append(("start", gid))
    time.sleep(0.02)
    with _lock:
        events.append(("end", gid))


rd.reads._fetch = fetch_logged
rd.reads._probe = lambda gid: ([], False, None)  # (every group cold: a warm one a batch needs is not handed to the pool)
grp, seq, first = rd.reads._needs()
assert len(seq) >= 3, "the case has %d groups" % len(seq)
for g in range(rd.batches_left()):
    del events[:]
    rd.prepare(g)
    while not all(f.done() for fs in rd.reads._groups.values() for f in fs):
        time.sleep(0.005)
    need = set(np.unique(grp[g * 3: (g + 1) * 3]).tolist())
    ends = [i for i, (what, x) in enumerate(events) if what == "end" and x in need]
    for i, (what, x) in enumerate(events):
        if what == "start" and x not in need:
            assert all(e < i for e in ends), ("batch %d: group %d read ahead before the groups it needs were asked for: %s" % (g, x, events))
            checked["advised"] += 1
plan.close()
rd.close()

# Hostile datasets: refused, naming the file.
tmp = tempfile.mkdtemp()


def fresh():
    d = os.path.join(tmp, "ds")
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(DEMO, d)
    return d


def refused(what, make, words, when="open", read=False):
    d = make()
    try:
        if when == "open":
            Drawn(d, window=5, block=4096, group=2, read=read)
        else:
            p = Drawn(d, window=5, block=4096, group=2, hold=0, read=read)
            when(d)
            list(DrawnReader(p, 0, batch_size=4))
    except ValueError as e:
        for w in words:
            assert w in str(e), (what, str(e))
        checked["hostile"] += 1
        return
    raise AssertionError("%s: not refused" % what)


def cut(d, name, n):
    p = os.path.join(d, name)
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) - n)


def header_lies(d):
    p = os.path.join(d, "whisper.npy")
    b = bytearray(open(p, "rb").read())
    i = b.index(b"'shape': (") + len(b"'shape': (")
    b[i: i + 1] = b"9"  # another row count, the header's length unchanged
    open(p, "wb").write(bytes(b))
    return d


def index_lies(d):
    p = os.path.join(d, "index.npy")
    a = np.load(p)
    a[3, 0] += 1000
    np.save(p, a)
    import hashlib
    sums = open(os.path.join(d, "SHA256SUMS")).read().replace(
        [ln for ln in open(os.path.join(d, "SHA256SUMS")).read().splitlines() if ln.endswith("  index.npy")][0],
        hashlib.sha256(open(p, "rb").read()).hexdigest() + "  index.npy")
    open(os.path.join(d, "SHA256SUMS"), "w").write(sums)
    return d


def held_changed(d):
    p = os.path.join(d, "emotion.npy")
    b = bytearray(open(p, "rb").read())
    b[-1] ^= 1
    open(p, "wb").write(bytes(b))
    return d


refused("a blob cut short", lambda: (lambda d: (cut(d, "whisper.npy", 128), d)[1])(fresh()), ["whisper.npy", "bytes"])
refused("a header that lies", lambda: header_lies(fresh()), ["whisper.npy"])
refused("index.npy out of range", lambda: index_lies(fresh()), ["index.npy", "clip 3"])
refused("a held blob changed", lambda: held_changed(fresh()), ["emotion.npy", "sha256"])
refused("a blob cut short while reading", fresh, ["whisper.npy", "shorter"], when=lambda d: cut(d, "whisper.npy", 4096))
refused("a blob cut short while reading (read=True)", fresh, ["whisper.npy", "shorter"], when=lambda d: cut(d, "whisper.npy", 4096),
        read=True)
refused("an epochs folder", lambda: (lambda d: (os.rename(os.path.join(d, "dataset.json"), os.path.join(d, "x.json")),
                                                open(os.path.join(d, "epochs.json"), "w").write("{}"), d)[2])(fresh()),
        ["epochs folder"])
# A dataset converted again while a loader draws from it: the next
# epoch is refused, not read from two versions.
d = fresh()
L = Loader(dataset=d, epochs=[0, 1], window=5, batch_size=4, block=4096, group=2, hold=0, prefetch=0)  # (a thread reads on into the next epoch: checked as it starts it)
before = set(os.listdir("/proc/self/fd"))
list(L)
p = os.path.join(d, "dataset.json")
man = json.load(open(p))
man["created"] = "later"
json.dump(man, open(p + ".new", "w"))
os.replace(p + ".new", p)
try:
    list(L)
    raise AssertionError("an epoch was read from a dataset converted again")
except ValueError as e:
    assert "converted again" in str(e) or "changed" in str(e), e
    checked["hostile"] += 1
L.close()
assert set(os.listdir("/proc/self/fd")) <= before, "files left open after close()"
# Only per-clip modalities, or frames of no values (no bytes to bound
# the frames the index claims): refused.
d = fresh()
p = os.path.join(d, "dataset.json")
man = json.load(open(p))
json.dump(dict(man, modalities=[m for m in man["modalities"] if m.get("per_clip")]), open(p, "w"))
refused("only per-clip modalities", lambda: d, ["per clip"])
d = fresh()
man = json.load(open(p))
np.save(os.path.join(d, "empty.npy"), np.zeros((man["frames"], 0), dtype="<f2"))
off = os.path.getsize(os.path.join(d, "empty.npy"))  # (no values: the header is the whole file)
mods = [m for m in man["modalities"] if m.get("per_clip")] + [dict(name="empty", file="empty.npy", dtype="<f2", frame_shape=[0], rate=1,
                                                                  data_offset=off)]
json.dump(dict(man, modalities=mods), open(p, "w"))
refused("frames of no values", lambda: d, ["empty", "no values"])
# dataset.json's numbers infinite (JSON's 1e999: float("inf"), which int()
# refuses with OverflowError, not ValueError), a modality named twice
# (two files under one name): refused, naming the folder.
for what, key, change in (
        ("clips", "clips", lambda m: m.__setitem__("clips", float("inf"))),
        ("frames", "frames", lambda m: m.__setitem__("frames", float("inf"))),
        ("a rate", "rate", lambda m: [x for x in m["modalities"] if not x.get("per_clip")][0].__setitem__("rate", float("inf"))),
        ("a frame shape", "frame_shape", lambda m: m["modalities"][0].__setitem__("frame_shape", [float("inf")])),
        ("a modality named twice", "named twice", lambda m: m["modalities"].append(dict(m["modalities"][-1])))):
    d = fresh()
    man = json.load(open(p))
    change(man)
    open(p, "w").write(json.dumps(man).replace("Infinity", "1e999"))
    refused("dataset.json: " + what, lambda: d, [d, "dataset.json", key])
    try:
        Dataset(d)
        raise AssertionError("Dataset took dataset.json's " + what)
    except ValueError as e:
        assert d in str(e) and key in str(e), (what, str(e))
try:
    Drawn({"a": A}, window=5, epoch_samples=1 << 41)
    raise AssertionError("2**41 windows taken")
except ValueError as e:
    assert "epoch_samples" in str(e), e
try:
    Drawn({"a": A, "other": OTHER}, window=5)
    raise AssertionError("sources that differ were mixed")
except ValueError as e:
    assert "other" in str(e) and "differ" in str(e), e
    checked["hostile"] += 1
shutil.rmtree(tmp)

# torch: EpochDataset(dataset=...) and torch.Loader(dataset=...).
torch_note = "torch not installed"
try:
    import torch  # noqa: F401
except ImportError:
    torch = None
if torch is not None:
    from clipshard.torch import EpochDataset, Loader as TorchLoader
    from spawned import spawned
    # A misspelt keyword of EpochDataset's (#64.10), drawn or not: one
    # ValueError naming the keyword meant, not a TypeError of Drawn's.
    for kw in (dict(dataset=DEMO, window=5, batchsize=4), dict(edir=DEMO, batchsize=4)):
        try:
            EpochDataset(**kw)
            raise AssertionError("%r taken" % (kw,))
        except ValueError as e:
            assert "unexpected arguments ['batchsize']" in str(e) and "did you mean batch_size=" in str(e), str(e)
    dirs, opts = CASES[0]
    plan, _ = plan_of(dirs, opts)
    ref = list(DrawnReader(plan, 1, rank=0, world_size=2, batch_size=3).batches(0, 1))
    # (spawn: the dataset pickled into the workers, its Drawn made again
    # there; its resume state goes with it)
    def loaded(ds, nw, ctx):
        if ctx is None:
            return list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=nw))
        got, err = spawned(ds, nw, ctx)
        assert got is not None, err
        return got
    for nw, ctx in ((0, None), (2, None), (2, "spawn")):
        ds = EpochDataset(dataset=DEMO, epoch=1, rank=0, world_size=2, batch_size=3, **opts)
        got = loaded(ds, nw, ctx)
        assert len(got) == len(ref) > 2
        for a, b in zip(got, ref):
            for k in b:
                assert np.array_equal(a[k].numpy(), b[k]), (nw, k)
        # resume after batch 2, with another world size
        st = ds.state_dict(got[1])
        ds2 = EpochDataset(dataset=DEMO, epoch=1, rank=0, world_size=1, batch_size=4, **opts)
        ds2.load_state_dict(json.loads(json.dumps(st)))
        rest = [tuple(x.tolist()) for b in loaded(ds2, nw, ctx) for x in b["samples"]]
        done = [tuple(x.tolist()) for r in (0, 1) for b in list(DrawnReader(plan, 1, rank=r, world_size=2, batch_size=3).batches(0, 1))[:2]
                for x in b["samples"]]
        every = set(order_of(plan, 1))
        assert not set(done) & set(rest) and len(set(rest)) == len(rest), nw
        assert len(every) - len(set(done) | set(rest)) < 4, (nw, len(every), len(done), len(rest))
    # A dataset converted again between the parent's check and a spawned
    # worker's: the worker refuses it, naming the dataset (it would
    # otherwise draw another order than the parent's state describes).
    tmp = tempfile.mkdtemp()
    copy = os.path.join(tmp, "ds")
    shutil.copytree(DEMO, copy)
    ds = EpochDataset(dataset=copy, epoch=1, batch_size=3, **opts)
    with open(os.path.join(copy, "dataset.json"), "a") as f:
        f.write("\n")  # the same dataset, another dataset.json (its sha256 is what identifies it)
    got, err = spawned(ds, 1)
    assert got is None, "a spawned worker read a dataset changed since the parent checked it"
    assert "ValueError: %s" % copy in err and "changed" in err, err
    shutil.rmtree(tmp)
    L = TorchLoader(dataset=DEMO, epochs=[1], batch_size=3, dtype=torch.float32, rank=0, world_size=2, **opts)
    got = list(L)
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert a["whisper"].dtype == torch.float32 and np.array_equal(a["whisper"].numpy(), b["whisper"].astype(np.float32))
    L.close()
    plan.close()
    torch_note = "torch %s" % torch.__version__

print("ok: drawn %s; numpy %s; %s" % (", ".join("%d %s" % (v, k) for k, v in checked.items()), np.__version__, torch_note))
