#!/usr/bin/env python3
"""The trainer's loop, side by side (just bench train; docs/BENCHMARKS.md).

    python3 bench/bench_train.py one ROW S MODE SRC DATASET EPOCHS [BATCHES]

reads BENCH_PASSES (5) epochs (or their first BATCHES batches) of rank 0
of 1, B=256, float32 delivered (float16 for the *-f16 rows and cat), in a
loop that sleeps S ms per step after each batch (a simulated accelerator
step: the CPU idles as it does while a GPU computes), and prints one JSON
line of the epochs after the first: the time each step waited for its
batch (median, p99), the median epoch wall time, samples and bytes
delivered (the first epoch's wall time apart). Each pass reads an epoch
of its own where EPOCHS holds BENCH_PASSES of them (bench_train.sh makes
them), else replays of the first. MODE "warm" reads every file of SRC,
DATASET and EPOCHS first; any other MODE drops their page cache before
each pass (the caller caps the memory or mounts the files over sshfs).

Rows:
  cat               the epoch's shard files read whole (S ignored): the disk's rate
  loader-f16        clipshard.Loader, the shards' float16, prefetch 4 (BENCH_PREFETCH)
  loader            clipshard.torch.Loader(dtype=torch.float32), prefetch 4
  loader-np         clipshard.Loader(dtype=np.float32) (numpy alone)
  epochds-w0/-w2    clipshard.torch.EpochDataset in DataLoader(batch_size=None,
                    num_workers=0/2, pin_memory=False), .float() by the loop
  reader-mmap/-read clipshard.EpochReader (read=False/True), float16 (for the
                    network filesystem's read path)
  naive-w0/-w2      the per-clip loader users had: a map-style Dataset whose
                    __getitem__ np.loads the sample's .npy files whole,
                    astype(float32), slices the window and unpickles the
                    motion .pkl; DataLoader(batch_size=256, num_workers=0/2)
  naive-np          the same without torch (a loop, np.stack)
  preload           every blob read into RAM first (timed, in the wall time),
                    then one gather per modality per batch, astype(float32)
"""
import glob
import json
import os
import pickle
import stat
import sys
import time

import numpy as np

from bench_stats import span  # noqa: E402 (bench/bench_stats.py)

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "python"))
import clipshard  # noqa: E402

B = 256
PASSES = int(os.environ.get("BENCH_PASSES", "5"))  # epochs per run: the first, then the reported ones


def epoch_files(edir, k=0):
    man = clipshard.load_epochs(edir)
    e = man["epochs"][k]
    return man, e, [os.path.join(edir, f) for s in e["shards"] for f in s["files"].values()]


def loop(batches, S, limit, to_f32=None):
    """Waits per step (s), wall (s), samples, bytes."""
    waits, n, nbytes = [], 0, 0
    t0 = time.perf_counter()
    it = iter(batches)
    while limit is None or len(waits) < limit:
        a = time.perf_counter()
        try:
            b = next(it)
        except StopIteration:
            break
        if to_f32 is not None:
            b = to_f32(b)
        waits.append(time.perf_counter() - a)
        for k, v in b.items():
            if k != "samples" and hasattr(v, "shape"):
                nbytes += v.nbytes if hasattr(v, "nbytes") else v.element_size() * v.nelement()
        n += len(b["samples"])
        if S:
            time.sleep(S / 1000)
    wall = time.perf_counter() - t0
    del it
    return waits, wall, n, nbytes


def naive_dataset(src, ds_dir, samples, window):
    """The per-clip loader: every sample opens and loads its clip's files."""
    try:
        import torch.utils.data
        base = torch.utils.data.Dataset
    except ImportError:
        base = object

    dset = clipshard.Dataset(ds_dir)
    ids = dset.ids
    mods = {m["name"]: m for m in dset.manifest["modalities"]}

    class Naive(base):
        def __len__(self):
            return len(samples)

        def __getitem__(self, i):
            clip, start, _ = (int(x) for x in samples[i])
            c = ids[clip]
            out = {}
            for name in ("whisper", "w2v", "emotion"):
                if name not in mods:
                    continue
                rate = int(mods[name].get("rate", 1))
                a = np.load("%s/%s/%s.npy" % (src, name, c)).astype(np.float32)
                out[name] = a[start * rate: (start + window) * rate]
            with open("%s/motion/%s.pkl" % (src, c), "rb") as f:
                d = pickle.load(f)
            out["motion"] = np.concatenate([d["exp"], d["pose"]], axis=1).astype(np.float32)[start: start + window]
            out["samples"] = samples[i]
            return out

    return Naive()


def regular_files(paths):
    """The regular files of paths (files, or folders walked), not through
    a symbolic link: a FIFO or a device in a work folder is left alone (an
    open of a FIFO would block)."""
    for top in paths:
        walk = [(os.path.dirname(top), [], [os.path.basename(top)])] if not os.path.isdir(top) else os.walk(top)
        for d, _, names in walk:
            for nm in names:
                p = os.path.join(d, nm)
                try:
                    if stat.S_ISREG(os.lstat(p).st_mode):
                        yield p
                except OSError:
                    continue


def drop(paths):
    """The page cache of paths (files, or folders walked) dropped."""
    os.sync()
    for p in regular_files(paths):
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def warm(paths):
    """Every file of paths (folders walked) read once: in the page cache."""
    buf = bytearray(1 << 20)
    for p in regular_files(paths):
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            while os.readv(fd, [buf]):
                pass
        finally:
            os.close(fd)


def which_epochs(edir, n):
    """The Loader's epochs argument for n passes over edir: an epoch of its
    own each pass where the folder has n of them (the bench scripts make
    them), else replays of the first. A pass then never reads the bytes
    the pass before left in the page cache (cold: a Loader reads the next
    epoch's first batches ahead as the one before ends, before that
    epoch's drop; a replay would find them cached)."""
    eps = [e["epoch"] for e in clipshard.load_epochs(edir)["epochs"]]
    return dict(epochs=eps[:n]) if len(eps) >= n else dict(epochs=list(range(eps[0], eps[0] + n)), replay_seed=1)


def passes(row, S, src, ds_dir, edir, limit):
    """A function running one pass of row over the epoch, and extras."""
    man, entry, files = epoch_files(edir)
    epoch, window = entry["epoch"], man["window"]
    which = which_epochs(edir, PASSES)  # (each pass its own epoch, where there are enough)
    eps = which["epochs"]
    distinct = "replay_seed" not in which
    extra = {"distinct_epochs": distinct}
    npass = [0]
    if row == "cat":
        per_pass = [epoch_files(edir, k)[2] for k in range(len(eps))] if distinct else [files]

        def one():
            t0, total, buf = time.perf_counter(), 0, bytearray(128 << 10)  # cat's buffer
            mine = per_pass[npass[0] % len(per_pass)]
            npass[0] += 1
            for p in mine:
                fd = os.open(p, os.O_RDONLY)
                while True:
                    k = os.readv(fd, [buf])
                    if not k:
                        break
                    total += k
                os.close(fd)
            return [], time.perf_counter() - t0, entry["samples"], total
        return one, extra
    if row in ("loader-f16", "loader", "loader-np"):
        pf = int(os.environ.get("BENCH_PREFETCH", "4"))
        if row == "loader-np":
            ld = clipshard.Loader(edir, batch_size=B, dtype=np.float32, prefetch=pf, **which)
        elif row == "loader":
            import torch
            from clipshard.torch import Loader
            ld = Loader(edir, batch_size=B, dtype=torch.float32, prefetch=pf, **which)
        else:
            ld = clipshard.Loader(edir, batch_size=B, prefetch=pf, **which)
        extra["host_MiB"], extra["prefetch"] = ld.host_bytes / 2**20, pf
        # Each pass after the first is the next epoch, which the thread
        # reads ahead into as the one before ends.
        return lambda: loop(ld, S, limit), extra
    if row.startswith("epochds"):
        import torch
        from clipshard.torch import EpochDataset
        w = int(row.split("-w")[1])
        f32 = lambda b: {k: (v.float() if v.is_floating_point() else v) for k, v in b.items()}  # noqa: E731
        n = [0]

        def one():  # the passes after the first: the next epochs (replays of this one if there are too few, as for the loader)
            if distinct:
                ds = EpochDataset(edir, eps[n[0]], batch_size=B)
            else:
                ds = EpochDataset(edir, epoch, batch_size=B, **({} if not n[0] else dict(replay_seed=1, virtual_epoch=epoch + n[0])))
            n[0] += 1
            return loop(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=w), S, limit, f32)
        return one, extra
    if row.startswith("reader"):
        # a copy of each batch (what a consumer does to keep it: pinning, torch.from_numpy of a copy)
        cp = lambda b: {k: np.array(v) for k, v in b.items()}  # noqa: E731

        def one():
            e = eps[npass[0]] if distinct else epoch
            npass[0] += 1
            return loop(clipshard.EpochReader(edir, e, batch_size=B, read=row.endswith("read")), S, limit, cp)
        return one, extra
    samples = np.concatenate([np.load(os.path.join(edir, s["files"]["samples"])) for s in
                              sorted(entry["shards"], key=lambda s: s["shard"])])
    if row == "naive-np":  # without torch: the same __getitem__, np.stack as the collate
        data = naive_dataset(src, ds_dir, samples, window)

        def batches():
            for g in range(len(samples) // B):
                items = [data[i] for i in range(g * B, (g + 1) * B)]
                yield {k: np.stack([it[k] for it in items]) for k in items[0]}
        return lambda: loop(batches(), S, limit), extra
    if row.startswith("naive"):
        import torch
        w = int(row.split("-w")[1])
        data = naive_dataset(src, ds_dir, samples, window)
        return lambda: loop(torch.utils.data.DataLoader(data, batch_size=B, num_workers=w, drop_last=True), S, limit), extra
    if row == "preload":
        state = {}

        def one():
            t0 = time.perf_counter()
            if not state:  # read into RAM once (the first pass's wall time has it)
                dset = clipshard.Dataset(ds_dir)
                state["blobs"] = {name: np.array(a) for name, a in dset.blobs.items()}
                state["index"], state["mods"] = dset.index, {m["name"]: m for m in dset.manifest["modalities"]}
                extra["preload_s"] = time.perf_counter() - t0
            blobs, index, mods = state["blobs"], state["index"], state["mods"]

            def gather():
                for g in range(len(samples) // B):
                    sm = samples[g * B:(g + 1) * B]
                    out = {}
                    for name, a in blobs.items():
                        m = mods[name]
                        if m.get("per_clip"):
                            out[name] = a[sm[:, 0]].astype(np.float32)
                            continue
                        rate = int(m.get("rate", 1))
                        rows = (index[sm[:, 0], 0] + sm[:, 1])[:, None] * rate + np.arange(window * rate)[None, :]
                        out[name] = a[rows].astype(np.float32)
                    out["samples"] = sm
                    yield out
            waits, _, n, nb = loop(gather(), S, limit)
            return waits, time.perf_counter() - t0, n, nb  # (the first pass's wall has the preload)
        return one, extra
    raise SystemExit("unknown row %s" % row)


def main():
    row, S, mode, src, ds_dir, edir = sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7]
    limit = int(sys.argv[8]) if len(sys.argv) > 8 and sys.argv[8] != "all" else None
    cold = mode != "warm"
    drops = [src, ds_dir, edir] + [p for p in os.environ.get("BENCH_DROP", "").split(":") if p]
    one, extra = passes(row, S, src, ds_dir, edir, limit)
    # PASSES epochs in one process: the first (with what a first epoch
    # sets up: buffers, workers, preload), then the steady state of a run
    # of many epochs, which is reported: the median epoch wall time of the
    # others and the waits of all their steps. Cold: caches dropped before
    # each epoch.
    if not cold:
        warm([src, ds_dir, edir])  # (every epoch a run reads, and what the other rows read)
    load0 = float(open("/proc/loadavg").read().split()[0])
    walls, waits, n, nbytes, wall1 = [], [], 0, 0, 0.0
    for p in range(PASSES):
        if cold:
            drop(drops)
        w_, wall_, n_, nb_ = one()
        if p == 0:
            wall1 = wall_
            if w_:  # the wait for the first batch (threads started, files opened, the first read), and the rest
                extra["first_batch_ms"], extra["first_rest_s"] = w_[0] * 1e3, wall_ - w_[0]
            continue
        walls.append(wall_)
        waits += w_
        n, nbytes = n_, nb_
    wall = float(np.median(walls))
    extra["walls_ms"] = [round(x * 1e3, 1) for x in walls]
    w = np.array(waits) * 1e3 if waits else np.zeros(1)
    extra["load"] = [load0, float(open("/proc/loadavg").read().split()[0])]
    extra["round"] = int(os.environ.get("BENCH_ROUND", "1"))
    print(json.dumps(dict(row=row, S=S, mode=mode, steps=len(waits), wait_med_ms=float(np.median(w)),
                          wait_p99_ms=float(np.percentile(w, 99)), wall_s=wall, first_wall_s=wall1, samples=n,
                          samples_per_s=n / wall if wall else 0, MBps=nbytes / wall / 1e6 if wall else 0, **extra)),
          flush=True)


def med(xs):
    return float(np.median(xs)) if xs else float("nan")


def table(path):
    """The runs of path (JSON lines) as markdown tables, with the goals:
    each cell the median (and range) of its rounds."""
    runs = [json.loads(line) for line in open(path) if line.startswith("{")]
    for mode in dict.fromkeys(r["mode"] for r in runs):
        mine = [r for r in runs if r["mode"] == mode]
        loads = [x for r in mine for x in r.get("load", [])]
        nr = len(dict.fromkeys(r.get("round", 1) for r in mine))
        print("\n%s: %d round(s), load average %s (each cell: the step's wait in ms, median / p99; "
              "samples/s, median (range) of the rounds)\n" % (mode, nr, span(loads, "%.2f") if loads else "?"))
        Ss = sorted(dict.fromkeys(r["S"] for r in mine))
        print("| row | " + " | ".join("S=%g ms" % S for S in Ss) + " |")
        print("|---|" + "---|" * len(Ss))
        for row in dict.fromkeys(r["row"] for r in mine):
            cells = []
            for S in Ss:
                rs = [r for r in mine if r["row"] == row and r["S"] == S]
                ok = [r for r in rs if not r.get("killed")]
                if not rs:
                    cells.append("")
                elif not ok:
                    cells.append("killed (%s)" % rs[0]["killed"])
                else:
                    rate = span([r["samples_per_s"] for r in ok], "%.0f")
                    if len(ok) < len(rs):
                        rate += ", %d of %d killed" % (len(rs) - len(ok), len(rs))
                    if row == "cat":
                        cells.append("-, %s" % rate)
                    else:
                        cells.append("%.2f / %.1f, %s" % (med([r["wait_med_ms"] for r in ok]),
                                                           med([r["wait_p99_ms"] for r in ok]), rate))
            print("| %s | %s |" % (row, " | ".join(cells)))

        def per_round(a, b, S):
            """a's samples/s over b's, round by round."""
            by = {}
            for r in mine:
                if r["S"] == S and r["row"] in (a, b) and not r.get("killed"):
                    by.setdefault(r.get("round", 1), {})[r["row"]] = r["samples_per_s"]
            return [v[a] / v[b] for v in by.values() if a in v and b in v and v[b]]
        goals = []
        x = per_round("loader-f16", "cat", 0.0)
        if x:
            goals.append("loader float16 / cat samples/s at S=0, round by round: %s (goal >= 0.8x)" % span(x, "%.2fx"))
        x = per_round("loader", "preload", 0.0)
        if x:
            goals.append("loader float32 / preload+gather samples/s at S=0, round by round: %s (goal >= 1.5x)" % span(x, "%.2fx"))
        x = [r["wait_med_ms"] for r in mine if r["row"] == "loader" and r["S"] == 20.0 and not r.get("killed")]
        if x:
            goals.append("loader float32 wait at S=20: median %s ms (goal <= 1 ms)" % span(x, "%.2f"))
        for row in ("loader-f16", "loader"):
            x = [r["wall_s"] / r["first_wall_s"] for r in mine if r["row"] == row and r["S"] == 0.0
                 and not r.get("killed") and r.get("first_wall_s")]
            if x:
                goals.append("%s: the first epoch's rate / the steady epochs' at S=0: %s (goal >= 1/1.1 = 0.91)"
                             % (row, span(x, "%.2f")))
            fb = [r for r in mine if r["row"] == row and r["S"] == 0.0 and not r.get("killed") and r.get("first_rest_s")]
            if fb:
                goals.append("%s: the first batch waited %s ms; the first epoch after it, against a steady one: %s"
                             % (row, span([r["first_batch_ms"] for r in fb], "%.1f"),
                                span([r["wall_s"] / r["first_rest_s"] for r in fb], "%.2f")))
        for g in goals:
            print("- " + g)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "one":
        main()
    elif len(sys.argv) > 2 and sys.argv[1] == "table":
        table(sys.argv[2])
    else:
        raise SystemExit(__doc__)
