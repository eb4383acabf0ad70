#!/usr/bin/env python3
"""Epochs drawn at read time against materialised epochs (just bench drawn).

    bench_drawn.py fake DIR CLIPS MIN MAX        a dataset of CLIPS clips of MIN..MAX frames, the
                                                 bench set's four modalities, sparse blobs (for orders only)
    bench_drawn.py quality DS [EDIR] [B]         the quality table (EDIR: two materialised epochs of DS)
    bench_drawn.py speed ROW MODE S DS EDIR [N]  one row's pass over epochs 0..N-1 (6): a JSON line
    bench_drawn.py table JSONL                   the speed table (median and range of the rounds)
    bench_drawn.py gather DS [ROUNDS]            the gather's copy alone, against other ways of making it

Quality: clipshard.quality.measure of epoch 1's order (batch B, rank 0 of
1), the share of epoch 1's batch-mate clip pairs (two clips in one batch,
over the first 64 batches) that were batch mates in epoch 0 too, and the
share of epoch 1's windows (clip, start) that epoch 0 had. Rows: a full
shuffle (the materialised epochs of shuffle; without EDIR a uniform
permutation of the drawn windows, which is what shuffle does), drawn
epochs at several buffers and blocks, a replay of epoch 0 with
mix_shards, and Mosaic's py1e simulated on the same windows stored in
clip order (as bench_quality.py; the real Mosaic's figure is in
bench-peers).
"""
import json
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402
from clipshard.draw import Drawn, DrawnReader  # noqa: E402

B = int(os.environ.get("BENCH_B", 256))  # (the tests run it on the demo set with small batches)
W = int(os.environ.get("BENCH_W", 15))
MODS = [("motion", "<f2", [56], 1), ("whisper", "<f2", [512], 2), ("w2v", "<f2", [1024], 1), ("emotion", "<f2", [8], 1)]


def fake(d, clips, lo, hi):
    """A dataset whose blobs are sparse (zeros): for orders, not reads."""
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(0)
    lengths = rng.integers(lo, hi + 1, clips).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    np.save(os.path.join(d, "index.npy"), np.stack([starts, lengths], axis=1))
    frames = int(lengths.sum())
    mods = []
    for name, dtype, frame, rate in MODS:
        rows = frames * rate
        head = {"descr": dtype, "fortran_order": False, "shape": tuple([rows] + frame)}
        text = repr(head).encode()
        pad = 4096 - 10 - len(text) - 1
        hdr = b"\x93NUMPY\x01\x00" + (4096 - 10).to_bytes(2, "little") + text + b" " * pad + b"\n"
        p = os.path.join(d, name + ".npy")
        with open(p, "wb") as f:
            f.write(hdr)
            f.truncate(4096 + rows * int(np.prod(frame)) * 2)
        mods.append({"name": name, "file": name + ".npy", "dtype": dtype, "frame_shape": frame, "rate": rate,
                     "data_offset": 4096, "rows": rows, "size": os.path.getsize(p)})
    man = {"format": "clipshard.dataset", "version": 1, "clips": clips, "frames": frames,
           "files": {"index": "index.npy"}, "modalities": mods}
    with open(os.path.join(d, "dataset.json"), "w") as f:
        json.dump(man, f)


def pairs(order, batches=64):
    """The batch-mate clip pairs of the first batches, as int64 keys."""
    out = []
    for b in range(min(batches, len(order) // B)):
        c = np.unique(order[b * B:(b + 1) * B, 0]).astype(np.int64)
        i, j = np.triu_indices(len(c), 1)
        out.append(c[i] * (1 << 32) + c[j])
    return np.unique(np.concatenate(out)) if out else np.zeros(0, np.int64)


def row(name, e0, e1, note=""):
    q = clipshard.quality.measure(e1, B)
    p0, p1 = pairs(e0), pairs(e1)
    mates = len(np.intersect1d(p0, p1)) / max(1, len(p1))
    w0 = set(zip(e0[:, 0].tolist(), e0[:, 1].tolist()))
    same = sum((c, s) in w0 for c, s in zip(e1[:, 0].tolist(), e1[:, 1].tolist())) / max(1, len(e1))
    return {"order": name, "distinct": q.get("distinct_clips_mean", 0), "distinct_min": q.get("distinct_clips_min", 0),
            "neighbours": q["same_clip_neighbours"], "spearman": q.get("spearman", 0), "displacement": q["mean_displacement"],
            "mates_kept": mates, "windows_kept": same, "note": note}


def drawn_order(ds, e, **kw):
    plan = Drawn(ds, window=W, seed=3, **kw)
    o = plan.order(e)
    g = plan.sources[0]
    out = np.stack([o.clip, o.start, o.valid], axis=1).astype(np.int64)
    geo = "%d frames a block, %d blocks a group of %d" % (g.block_frames, g.group_blocks, g.blocks)
    plan.close()
    return out, geo


def py1e(s, seed, shard=1024, block=1 << 18):
    rng = np.random.default_rng(seed)
    st = s[np.lexsort((s[:, 1], s[:, 0]))]
    shards = [st[k * shard:(k + 1) * shard] for k in rng.permutation(-(-len(st) // shard))]
    stream = np.concatenate(shards)
    key = np.arange(len(stream)) + rng.uniform(-block / 2, block / 2, len(stream))
    return stream[np.argsort(key, kind="stable")]


def quality(ds, edir=None):
    rows = []
    d1, _ = drawn_order(ds, 1, block="auto")
    if edir:
        def epoch(e):
            r = clipshard.EpochReader(edir, epoch=e, batch_size=1024, remainder="pad")
            return np.concatenate([b["samples"] for b in r.batches(0, 1)])[:r.samples]
        f0, f1 = epoch(0), epoch(1)
        rows.append(row("full shuffle (shuffle's epochs 0, 1)", f0, f1))
    else:
        rng = np.random.default_rng(1)
        d0, _ = drawn_order(ds, 0, block="auto")
        f0, f1 = d0[rng.permutation(len(d0))], d1[rng.permutation(len(d1))]
        rows.append(row("full shuffle (a uniform permutation of the drawn windows)", f0, f1))
    size = sum(os.path.getsize(os.path.join(ds, m["file"])) for m in json.load(open(os.path.join(ds, "dataset.json")))["modalities"])
    for buf in (2 * size, size // 2, size // 8, size // 32):
        for block in ("auto", 8 << 20):
            if buf < 4096:
                continue
            e0, geo = drawn_order(ds, 0, block=block, buffer=buf)
            e1, _ = drawn_order(ds, 1, block=block, buffer=buf)
            rows.append(row("drawn, buffer %s, block %s" % (_mib(buf), block if block == "auto" else _mib(block)), e0, e1, geo))
    if edir:
        for K in (4,):
            def rep(v):
                r = clipshard.EpochReader(edir, epoch=0, batch_size=1024, remainder="pad", replay_seed=7, virtual_epoch=v, mix_shards=K)
                return np.concatenate([b["samples"] for b in r.batches(0, 1)])[:r.samples]
            rows.append(row("replay of epoch 0 + mix_shards %d" % K, rep(0), rep(1)))
    rows.append(row("Mosaic py1e (simulated, clip-order shards of 1024)", py1e(f0, 0), py1e(f0, 1)))
    print("| order | distinct clips / batch of %d (mean, min) | same-clip neighbours | Spearman ρ | batch-mate pairs kept from epoch 0 | windows kept from epoch 0 | geometry |" % B)
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print("| %s | %.1f, %d | %.4f | %.3f | %.3f | %.3f | %s |" % (r["order"], r["distinct"], r["distinct_min"], r["neighbours"],
                                                                   r["spearman"], r["mates_kept"], r["windows_kept"], r["note"]))
    print("(%d windows an epoch, %d clips)" % (len(d1), len(np.unique(d1[:, 0]))))
    # A window's offset in its clip, epoch 0 against epoch 1 (tile): the
    # first window's start of each long clip.
    d0, _ = drawn_order(ds, 0)
    first0 = {c: s for c, s in zip(d0[:, 0].tolist(), d0[:, 1].tolist()) if s < W}
    first1 = {c: s for c, s in zip(d1[:, 0].tolist(), d1[:, 1].tolist()) if s < W}
    both = [c for c in first1 if c in first0]
    same = sum(first0[c] == first1[c] for c in both) / max(1, len(both))
    hist = np.bincount([first1[c] for c in both], minlength=W)
    print("tile offsets (first window's start, clips of >= 2 windows): the same in epochs 0 and 1 for %.3f of %d clips "
          "(1/W = %.3f); epoch 1's offsets 0..%d: %s" % (same, len(both), 1 / W, W - 1, hist.tolist()))


def _mib(n):
    return "%.0f MiB" % (n / 2 ** 20) if n < 1 << 30 else "%.1f GiB" % (n / 2 ** 30)


def speed(row_name, mode, S, ds, edir, epochs="6"):
    """Epochs 0..EPOCHS-1 (float16, B=256, threads 2, prefetch 4), a step
    of S ms after each batch: samples/s, the wait per step, CPU."""
    S = float(S)
    ep = range(int(epochs))
    if row_name == "materialised":
        L = clipshard.Loader(edir, epochs=ep, batch_size=B)
    else:  # drawn-BLOCK[-BUFFER][-read]: read, one pread a window (read=True), not a gather from a memory map
        parts = row_name.split("-")
        kw = {"read": True} if parts[-1] == "read" else {}
        parts = parts[:-1] if kw else parts
        if len(parts) > 2:
            kw["buffer"] = parts[2]
        L = clipshard.Loader(dataset=ds, epochs=ep, window=W, seed=3, batch_size=B, block=parts[1], **kw)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    waits, n, per_epoch = [], 0, []
    for e in L.epochs:
        it = iter(L)
        a0, n0 = time.perf_counter(), n
        while True:
            a = time.perf_counter()
            try:
                b = next(it)
            except StopIteration:
                break
            waits.append(time.perf_counter() - a)
            n += len(b["samples"])
            if S:
                time.sleep(S / 1000)
        per_epoch.append((n - n0) / (time.perf_counter() - a0))
    t = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    L.close()
    w = np.array(waits[1:]) * 1000 if len(waits) > 1 else np.zeros(1)
    print(json.dumps({"row": row_name, "mode": mode, "S": S, "samples": n, "seconds": t, "samples_s": n / t,
                      # (the first epoch of the process apart: the later ones' median; the first pays the start-up)
                      "first_epoch_samples_s": per_epoch[0] if per_epoch else 0,
                      "steady_samples_s": float(np.median(per_epoch[1:])) if len(per_epoch) > 1 else None,
                      "wait_median_ms": float(np.median(w)), "wait_p90_ms": float(np.percentile(w, 90)),
                      "first_ms": waits[0] * 1000 if waits else 0, "cpu_ms_batch": cpu * 1000 / max(1, len(waits)),
                      "peak_rss_mib": r1.ru_maxrss / 1024, "load": os.getloadavg()[0]}))


def table(path):
    rows = [json.loads(x) for x in open(path) if x.strip()]
    keys = []
    for r in rows:
        k = (r["mode"], r["S"], r["row"])
        if k not in keys:
            keys.append(k)
    # (the k-th line of a row is its k-th round: the script runs every row once a round)
    print("| mode | step S | row | samples/s (median, range) | × materialised, round by round: median (range) "
          "| × materialised: the first epoch; the later epochs' median | wait per step, ms (median; p90) | first batch, ms "
          "| CPU ms / batch | peak RSS MiB | load avg |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")

    def ratios(rs, base, f):
        v = sorted(a[f] / b[f] for a, b in zip(rs, base) if a.get(f) and b.get(f))
        return "%.2f (%.2f–%.2f)" % (np.median(v), v[0], v[-1]) if v else "-"
    for k in keys:
        rs = [r for r in rows if (r["mode"], r["S"], r["row"]) == k]
        base = [r for r in rows if (r["mode"], r["S"], r["row"]) == (k[0], k[1], "materialised")]
        v = sorted(r["samples_s"] for r in rs)
        mat = k[2] == "materialised"
        med = lambda f: float(np.median([r[f] for r in rs]))  # noqa: E731
        print("| %s | %g ms | %s | %.0f (%.0f–%.0f) | %s | %s | %.2f; %.2f | %.0f | %.1f | %.0f | %.2f–%.2f |" % (
            k[0], k[1], k[2], np.median(v), v[0], v[-1],
            "1" if mat else ratios(rs, base, "samples_s") if base else "",
            "1; 1" if mat else "%s; %s" % (ratios(rs, base, "first_epoch_samples_s"), ratios(rs, base, "steady_samples_s")) if base else "",
            med("wait_median_ms"), med("wait_p90_ms"), med("first_ms"),
            med("cpu_ms_batch"), med("peak_rss_mib"), min(r["load"] for r in rs), max(r["load"] for r in rs)))


def gather(ds, rounds="5"):
    """The copy a drawn batch's gather makes, alone: batches of B random
    windows of W rows of DS's widest blob (warm: read first), into a ring
    of 6 batch buffers, half a batch a thread (2 threads, as the Loader),
    in rounds (each variant once a round): np.take of a window's rows (what
    DrawnReader._gather does); np.take of whole windows from a view whose
    rows are windows (starts at multiples of W only: what a copy a window
    could reach, not a gather of any start); the windows sorted by their
    start modulo W, taken from W such views into a scratch, then put in
    place by a second np.take (any start); and preadv of as many
    contiguous bytes a half batch (the kernel's copy, what the
    materialised Loader makes). GB/s: median (range) of the rounds."""
    from concurrent.futures import ThreadPoolExecutor
    import threading
    blobs = [f for f in os.listdir(ds) if f.endswith(".npy") and f != "index.npy"]
    if not blobs:
        raise SystemExit("%s: no blob (*.npy but index.npy) to gather from" % ds)
    path = os.path.join(ds, max(blobs, key=lambda f: os.path.getsize(os.path.join(ds, f))))
    a = np.load(path, mmap_mode="r")  # (its memory map, and a.offset: where its rows start)
    m = a.reshape(len(a), -1).view(np.uint8)
    row, off = m.shape[1], a.offset
    if len(m) < 2 * W:
        raise SystemExit("%s: %d rows, fewer than 2 windows of %d" % (path, len(m), W))
    fd = os.open(path, os.O_RDONLY)
    int(m.reshape(-1)[::4096].sum())  # (every page read and mapped)
    rng = np.random.default_rng(0)
    nb = max(4, min(200, (1 << 30) // (B * W * row)))
    anyw = [rng.integers(0, len(m) - W + 1, B) for _ in range(nb)]
    nq = len(m) // W
    aligned = [rng.integers(0, nq, B) for _ in range(nb)]
    ring = [np.empty((B, W, row), np.uint8) for _ in range(6)]
    shifted = [m[s: s + (len(m) - s) // W * W].reshape(-1, W * row) for s in range(W)]
    local, ar = threading.local(), np.arange(W, dtype=np.int64)

    def rows(i, lo, hi):
        np.take(m, anyw[i][lo:hi, None] + ar, axis=0, out=ring[i % 6][lo:hi], mode="clip")

    def windows(i, lo, hi):
        np.take(shifted[0], aligned[i][lo:hi], axis=0, out=ring[i % 6][lo:hi].reshape(hi - lo, -1), mode="clip")

    def by_shift(i, lo, hi):
        tmp = getattr(local, "tmp", None)
        if tmp is None:
            tmp = local.tmp = np.empty((B, W * row), np.uint8)
        first = anyw[i][lo:hi]
        o = np.argsort(first % W, kind="stable")
        s, q = first[o] % W, first[o] // W
        cut = np.r_[0, np.flatnonzero(np.diff(s)) + 1, len(o)]
        for x, y in zip(cut[:-1].tolist(), cut[1:].tolist()):
            np.take(shifted[int(s[x])], q[x:y], axis=0, out=tmp[x:y], mode="clip")
        inv = np.empty_like(o)
        inv[o] = np.arange(len(o))
        np.take(tmp[:len(o)], inv, axis=0, out=ring[i % 6][lo:hi].reshape(hi - lo, -1), mode="clip")

    def kernel(i, lo, hi):
        n = (hi - lo) * W * row
        at = off + (int(aligned[i][lo]) * W * row) % max(1, len(m) * row - n + 1)
        os.preadv(fd, [memoryview(ring[i % 6].reshape(-1))[lo * W * row: lo * W * row + n]], at)

    pool = ThreadPoolExecutor(2)
    variants = [("np.take, a row at a time (the gather)", rows), ("np.take, a window at a time (aligned starts only)", windows),
                ("by start modulo W, then np.take into place", by_shift), ("preadv, contiguous (the kernel's copy)", kernel)]
    got = {v: [] for v, _ in variants}
    for _ in range(int(rounds)):
        for v, fn in variants:
            t = time.perf_counter()
            for i in range(nb):
                list(pool.map(lambda ab: fn(i, *ab), [(0, B // 2), (B // 2, B)]))
            got[v].append(nb * B * W * row / (time.perf_counter() - t) / 1e9)
    pool.shutdown()
    os.close(fd)
    print("%s: %d rows of %d bytes; %d batches of %d windows of %d rows; 2 threads; %s rounds; load average %.2f"
          % (path, len(m), row, nb, B, W, rounds, os.getloadavg()[0]))
    print("| copy | GB/s, median (range) |")
    print("| --- | --- |")
    for v, _ in variants:
        x = sorted(got[v])
        print("| %s | %.1f (%.1f–%.1f) |" % (v, float(np.median(x)), x[0], x[-1]))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "fake":
        fake(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif cmd == "quality":
        if len(sys.argv) > 4:
            B = int(sys.argv[4])
        quality(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "-" else None)
    elif cmd == "speed":
        speed(*sys.argv[2:8])
    elif cmd == "table":
        table(sys.argv[2])
    elif cmd == "gather":
        gather(*sys.argv[2:4])
    else:
        raise SystemExit(__doc__)
