#!/usr/bin/env python3
"""clipshard against the loaders its users would pick instead (just
bench-peers; docs/BENCHMARKS.md): LitData, Mosaic Streaming, WebDataset.

    python3 bench/bench_peers.py prepare TOOL SRC WINDOWS OUT
    python3 bench/bench_peers.py read TOOL CONFIG S MODE DATA [B]
    python3 bench/bench_peers.py floor warm|cold|"sshfs, cold" EPOCHS_DIR
    python3 bench/bench_peers.py resume TOOL DATA LOG SAMPLES
    python3 bench/bench_peers.py best RESULTS.jsonl [--best-only]
    python3 bench/bench_peers.py table RESULTS.jsonl

The windows are those of one clipshard epoch (W=15 frames, every modality,
float16 as clipshard stores them): WINDOWS is its epochs folder, whose
samples list (clip, start, valid) the peers' writers take, so that every
tool holds the same samples. The peers fix a window's offset when they
write it (a new set of offsets is a new prepare); clipshard draws them per
epoch. Each peer shuffles at read time its own way.

prepare: the tool's documented writer with its parallel option where it
    has one (litdata.optimize with a function yielding a clip's windows,
    num_workers=2; streaming.MDSWriter in 2 processes, one part each, and
    merge_index; webdataset.ShardWriter: 5 .npy members a sample, and
    webdataset-1: one pickled member a sample, mtime=0), sources -> files.
read: BENCH_EPOCHS (3) epochs into float32 torch tensors (clipshard-f16:
    the shards' float16 as numpy arrays), B=256, the tool in CONFIG (see
    CONFIGS: w0/w1/w2 DataLoader workers, p persistent), a step of S ms
    slept after each batch; one JSON line: the first epoch's samples/s
    and the steady state's (the median epoch after it), CPU ms per batch
    (the process and its workers), the wait per step (median, p99), the
    load average, and a shuffle-quality figure of the order read
    (clipshard.quality: distinct clips per batch, Spearman).
floor: the best raw read of an epoch's shard bytes (threads x buffer
    size swept; warm from the page cache, cold with O_DIRECT).
best: the main table's rows from the sweep's results.
resume: a run of 2 simulated ranks (torch.distributed, gloo, 2 processes)
    killed with SIGKILL at 40% of the epoch, resumed on 1 rank from its
    saved state (each tool's documented way); counts the samples trained
    twice and those never trained (the drop rule's tail excepted).
"""
import json
import os
import pickle
import sys
import time

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "python"))
sys.path.insert(0, here)
import clipshard  # noqa: E402
from bench_train import drop, which_epochs  # noqa: E402  (the page cache of files and folders dropped; the epochs a Loader reads)

MODS = ("whisper", "w2v", "emotion", "motion")
RATE = {"whisper": 2, "w2v": 1, "emotion": 1, "motion": 1}


def windows(edir):
    """The epoch's samples (clip id, start, valid), grouped by clip, and W."""
    man = clipshard.load_epochs(edir)
    e = man["epochs"][0]
    samples = np.concatenate([np.load(os.path.join(edir, s["files"]["samples"]))
                              for s in sorted(e["shards"], key=lambda s: s["shard"])])
    ids = [c for c in open(os.path.join(man["dataset"]["dir"], "clips.txt")).read().split() if c]
    by_clip = {}
    for clip, start, valid in samples.tolist():
        by_clip.setdefault(clip, []).append((start, valid))
    return ids, by_clip, int(man["window"])


def clip_windows(src, cid, row, starts, W):
    """The windows of one clip, read from its sources as a user's writer
    would (np.load, unpickle), float16 like clipshard's shards."""
    arrs = {}
    for m in ("whisper", "w2v", "emotion"):
        arrs[m] = np.load("%s/%s/%s.npy" % (src, m, cid))
    with open("%s/motion/%s.pkl" % (src, cid), "rb") as f:
        d = pickle.load(f)
    arrs["motion"] = np.concatenate([d["exp"], d["pose"]], axis=1)
    for start, valid in sorted(starts):
        out = {m: np.ascontiguousarray(arrs[m][start * RATE[m]:(start + W) * RATE[m]].astype(np.float16)) for m in MODS}
        out["samples"] = np.array([row, start, valid], dtype=np.int64)
        yield out


# -- prepare ---------------------------------------------------------------

def prepare(tool, src, edir, out):
    ids, by_clip, W = windows(edir)
    todo = [(ids[row], row, by_clip[row]) for row in sorted(by_clip)]
    n = sum(len(s) for _, _, s in todo)
    if tool == "litdata":
        import litdata
        litdata.optimize(fn=_litdata_fn, inputs=[(src, W) + t for t in todo], output_dir=out, chunk_bytes="64MB",
                         num_workers=2, mode="overwrite")
    elif tool == "mosaic":  # its parallel recipe: 2 processes each writing a part, then merge_index
        import multiprocessing
        from streaming.base.util import merge_index
        first = next(clip_windows(src, *todo[0], W))
        cols = {k: "ndarray:%s:%s" % (v.dtype.name, ",".join(map(str, v.shape))) for k, v in first.items()}
        parts = [(src, W, os.path.join(out, str(i)), cols, todo[i::2]) for i in range(2)]
        with multiprocessing.get_context("fork").Pool(2) as pool:
            pool.map(_mosaic_part, parts)
        merge_index(out, keep_local=True)
    elif tool in ("webdataset", "webdataset-1"):  # (no parallel writer of its own)
        import webdataset as wds
        os.makedirs(out, exist_ok=True)
        k = 0
        one = tool == "webdataset-1"  # one pickled member a sample, mtime=0 (no PAX header per member)
        with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxsize=64 << 20, verbose=0,
                             **(dict(mtime=0) if one else {})) as w:
            for item in todo:
                for s in clip_windows(src, *item, W):
                    if one:
                        w.write({"__key__": "%08d" % k, "pyd": s})
                    else:
                        w.write({"__key__": "%08d" % k, **{"%s.npy" % m: v for m, v in s.items()}})
                    k += 1
    else:
        raise SystemExit("prepare: unknown tool %s" % tool)
    print(json.dumps({"tool": tool, "samples": n}))


def _mosaic_part(part):
    from streaming import MDSWriter
    src, W, out, cols, todo = part
    with MDSWriter(out=out, columns=cols, size_limit="64mb", compression=None) as w:
        for item in todo:
            for s in clip_windows(src, *item, W):
                w.write(s)


def _litdata_fn(item):
    src, W, cid, row, starts = item
    yield from clip_windows(src, cid, row, starts, W)


# -- read ------------------------------------------------------------------

# Each peer's documented knobs for the read, swept by `sweep`: workers 0/1/2,
# persistent workers (they only matter from the second epoch of a process:
# every run reads EPOCHS epochs), and for WebDataset the writer's layout
# (webdataset: 5 .npy members a sample and the writer's float mtime, read
# through the generic .decode(); webdataset-1: one pickled member a sample,
# mtime=0, unpickled by a .map: its documented fast layout). Batching is in
# the workers in every peer configuration (the DataLoader's collate, or
# WebDataset's .batched before the WebLoader).
CONFIGS = {"litdata": ["w0", "w1", "w2", "w1p", "w2p"], "mosaic": ["w0", "w1", "w2", "w1p", "w2p"],
           "webdataset": ["w0", "w2", "w2p"], "webdataset-1": ["w0", "w1", "w2", "w1p", "w2p"],
           "clipshard": ["threads2"], "clipshard-f16": ["threads2"], "clipshard-drawn": ["threads2"]}
# The setting the first table (#27) ran every peer in.
DEFAULT = {"litdata": "w2", "mosaic": "w2", "webdataset": "w2", "webdataset-1": "w2"}


def _knobs(config):
    workers = int(config[1]) if config.startswith("w") else 0
    return workers, config.endswith("p")


def batches(tool, config, data, B, epochs):
    """An iterable whose every iter() is the next epoch, and the cast to
    float32 torch tensors the loop applies (None: delivered so)."""
    import torch
    f32 = lambda b: {k: (v.float() if v.is_floating_point() else v) for k, v in b.items()}  # noqa: E731
    workers, persistent = _knobs(config)
    dl = dict(num_workers=workers, persistent_workers=persistent and workers > 0)
    if tool in ("clipshard", "clipshard-f16"):
        which = which_epochs(data, epochs)  # (the cold rows': an epoch of their own a pass, bench_peers.sh makes them)
        if tool == "clipshard":  # float32 torch tensors, cast in the read threads
            from clipshard.torch import Loader
            return Loader(data, batch_size=B, dtype=torch.float32, **which), None
        return clipshard.Loader(data, batch_size=B, **which), None  # the shards' float16 as numpy arrays (for the floor: the same bytes)
    if tool == "clipshard-drawn":  # epochs drawn at read time from the dataset (no shuffle run, no epoch files)
        from clipshard.torch import Loader
        return Loader(dataset=data, epochs=list(range(epochs)), window=15, seed=3, batch_size=B, dtype=torch.float32), None
    if tool == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset
        ds = StreamingDataset(data, shuffle=True, drop_last=True, seed=1)
        return StreamingDataLoader(ds, batch_size=B, drop_last=True, **dl), f32
    if tool == "mosaic":
        from streaming import StreamingDataLoader, StreamingDataset
        ds = StreamingDataset(local=data, shuffle=True, batch_size=B, shuffle_seed=1)
        return StreamingDataLoader(ds, batch_size=B, drop_last=True, **dl), f32
    if tool in ("webdataset", "webdataset-1"):
        import glob
        import webdataset as wds
        urls = sorted(glob.glob(os.path.join(data, "shard-*.tar")))
        names = list(MODS) + ["samples"]
        ds = wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, workersplitter=wds.split_by_worker,
                            empty_check=False)
        if tool == "webdataset":
            ds = ds.shuffle(1000).decode().to_tuple(*["%s.npy" % m for m in names]).batched(B, partial=False)
            conv = lambda t: {n: (torch.as_tensor(x).float() if n != "samples" else torch.as_tensor(x)) for n, x in zip(names, t)}  # noqa: E731
        else:
            ds = ds.shuffle(1000).map(lambda s: pickle.loads(s["pyd"])).batched(B, partial=False, collation_fn=_stack)
            conv = f32
        return wds.WebLoader(ds, batch_size=None, **dl), conv
    raise SystemExit("read: unknown tool %s" % tool)


def _stack(samples):
    import torch
    return {k: torch.from_numpy(np.stack([s[k] for s in samples])) for k in samples[0] if not k.startswith("__")}


def _cpu():
    """CPU seconds of this process, its reaped children and its live
    descendants (DataLoader workers, persistent or not)."""
    import resource
    t = sum(getattr(resource.getrusage(w), f) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
            for f in ("ru_utime", "ru_stime"))
    kids, me, hz = {}, os.getpid(), os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                st = open("/proc/%s/stat" % pid).read()
            except OSError:
                continue
            f = st[st.rindex(")") + 2:].split()
            kids[int(pid)] = (int(f[1]), sum(int(x) for x in f[11:15]))  # ppid; utime stime cutime cstime
    for pid, (ppid, ticks) in kids.items():
        p = ppid
        while p > 1 and p != me and p in kids:
            p = kids[p][0]
        if p == me and pid != me:
            t += ticks / hz
    return t


def loop(it, conv, S):
    waits, order = [], []
    t0 = time.perf_counter()
    it = iter(it)
    while True:
        a = time.perf_counter()
        try:
            b = next(it)
        except StopIteration:
            break
        if conv is not None:
            b = conv(b)
        waits.append(time.perf_counter() - a)
        order.append(np.asarray(b["samples"]).reshape(-1, 3))
        if S:
            time.sleep(S / 1000)
    del it
    return waits, time.perf_counter() - t0, np.concatenate(order) if order else np.zeros((0, 3), np.int64)


def read(tool, config, S, mode, data, B=256, epochs=None):
    """EPOCHS (BENCH_EPOCHS, 3) epochs of one tool in one configuration in
    this process; one JSON line: the first epoch (start-up included) and the
    steady state (the median epoch after it: samples/s, CPU ms per batch of
    the process and its workers, the waits of its steps; with one epoch,
    that epoch, its first batch's wait left out)."""
    epochs = epochs or int(os.environ.get("BENCH_EPOCHS", "3"))
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    it, conv = batches(tool, config, data, B, epochs)
    setup = time.perf_counter() - t0
    per, waits, order = [], [], None
    for e in range(epochs):
        if mode != "warm":
            drop([data] + [p for p in os.environ.get("BENCH_DROP", "").split(":") if p])
        c0 = _cpu()
        w, wall, o = loop(it, conv, S)
        per.append(dict(samples=len(o), wall_s=wall, cpu_ms_per_batch=(_cpu() - c0) * 1e3 / max(len(w), 1),
                        samples_per_s=len(o) / wall if wall else 0))
        if e:
            waits += w
        elif epochs == 1:
            waits += w[1:]  # (one epoch a process: its steps after the first batch; none would read as 0 ms)
        if order is None:
            order = o
    steady = per[1:] or per
    w = np.array(waits or [0.0]) * 1e3
    q = clipshard.quality.measure(order, B) if len(order) else {}
    med = lambda k: float(np.median([p[k] for p in steady]))  # noqa: E731
    print(json.dumps(dict(tool=tool, config=config, S=S, mode=mode, data=data, samples=per[0]["samples"], setup_s=setup,
                          first_samples_per_s=per[0]["samples_per_s"], samples_per_s=med("samples_per_s"),
                          cpu_ms_per_batch=med("cpu_ms_per_batch"), wait_med_ms=float(np.median(w)),
                          wait_p99_ms=float(np.percentile(w, 99)), epochs=per, load=load,
                          load_end=os.getloadavg()[0], distinct_clips=q.get("distinct_clips_mean"),
                          spearman=q.get("spearman"), unique=int(len(np.unique(order, axis=0))) if len(order) else 0)),
          flush=True)


# -- the floor ----------------------------------------------------------------

def floor(mode, edir, reps=3):
    """The best raw read of the epoch's shard bytes this box can do: every
    shard file read whole with preadv into reused buffers, threads x buffer
    size swept (each setting the median of reps reads); warm: the page
    cache holds them (read once first); cold: O_DIRECT (the disk, no page
    cache; page-aligned buffers). One JSON line: the best setting's bytes/s
    and the samples/s it is worth (the epoch's bytes per sample)."""
    man = clipshard.load_epochs(edir)
    e = man["epochs"][0]
    files = [os.path.join(edir, f) for s in e["shards"] for f in s["files"].values()]
    total = sum(os.path.getsize(f) for f in files)
    load = os.getloadavg()[0]
    flags = os.O_RDONLY
    if mode == "warm":
        floor_pass(files, flags, 1, 1 << 20)
    results = []
    # cold: O_DIRECT (no page cache), and buffered reads after the cache is
    # dropped (the kernel's readahead)
    # (over a network file system, "sshfs, cold": buffered reads of a fresh
    # mount, each pass's page cache dropped)
    net = mode.startswith("sshfs")
    for direct in ((False,) if mode == "warm" or net else (True, False)):
        for threads in (1, 2, 4):
            for buf in ((128 << 10, 1 << 20, 4 << 20) if mode == "warm" else (1 << 20, 4 << 20)):
                ts = [floor_pass(files, flags | (os.O_DIRECT if direct else 0), threads, buf, cold=mode != "warm") for _ in range(reps)]
                results.append(dict(threads=threads, buffer_KiB=buf >> 10, direct=direct, s=float(np.median(ts)), range_s=[min(ts), max(ts)]))
    best = min(results, key=lambda r: r["s"])
    # What a loader that hands out batches must do besides: write them into
    # memory the CPU cache does not hold (2 threads, 4 MiB pieces into a
    # ring of 6 batch buffers, as the Loader's prefetch 4 holds), and for
    # float32 also cast (1 MiB read into a thread's scratch, cast by torch
    # into the ring): the same bytes, delivered.
    deliver = {}
    if mode == "warm":
        for kind in ("float16 into batches", "float32 into batches"):
            ts = [floor_pass(files, flags, 2, 4 << 20, ring=6 * 256 * total // e["samples"], f32=kind.startswith("float32"))
                  for _ in range(reps)]
            deliver[kind] = e["samples"] / float(np.median(ts))
    print(json.dumps(dict(tool="floor", config="%d threads, %d KiB%s" % (best["threads"], best["buffer_KiB"], ", O_DIRECT" if best["direct"] else ""), mode=mode,
                          S=0, epoch_bytes=total, samples=e["samples"], GBps=total / best["s"] / 1e9,
                          samples_per_s=e["samples"] / best["s"], range_samples_per_s=[e["samples"] / best["range_s"][1],
                                                                                      e["samples"] / best["range_s"][0]],
                          sweep=results, deliver=deliver, load=load, load_end=os.getloadavg()[0])), flush=True)


def floor_pass(files, flags, threads, buf, ring=0, f32=False, cold=False):
    """Seconds to read files whole: threads take buf-sized pieces in turn,
    into a buffer of their own each (ring: into a ring of that many bytes,
    piece after piece; f32: read 1 MiB at a time and cast into the ring;
    cold: the page cache of files dropped first)."""
    import mmap
    pieces = [(i, off) for i, f in enumerate(files) for off in range(0, os.path.getsize(f), buf)]
    if flags & os.O_DIRECT or cold:
        drop(files + [p for p in os.environ.get("BENCH_DROP", "").split(":") if p])  # (over a mount: the server's files too)
    fds = [os.open(f, flags) for f in files]
    R = None
    if ring:  # the Loader's own buffer memory, faulted in before the clock starts
        R = clipshard.loader.buffer(ring * (2 if f32 else 1) // 4 * 4)
    if f32:
        import torch

    def worker():
        b = mmap.mmap(-1, buf if not f32 else 1 << 20)  # page-aligned (O_DIRECT)
        s16 = np.frombuffer(b, np.float16)
        if f32:
            serial_casts()

        def piece(k):
            i, off = pieces[k]
            if R is None:
                os.preadv(fds[i], [b], off)
            elif not f32:
                at = (k * buf) % (len(R) - buf)
                os.preadv(fds[i], [R.data[at: at + buf]], off)
            else:
                at = (k * buf * 2) % (len(R) - 2 * buf)
                dst = torch.from_numpy(R[at: at + 2 * buf].view(np.float32))
                for o in range(0, buf, 1 << 20):
                    n = os.preadv(fds[i], [b], off + o)
                    if n < 2:
                        break
                    dst[o // 2: o // 2 + n // 2].copy_(torch.from_numpy(s16[:n // 2]))
        return piece
    dt = in_turn(len(pieces), [worker] * threads)
    for fd in fds:
        os.close(fd)
    return dt


def in_turn(n, workers):
    """Seconds for a thread per item of workers to do pieces 0..n-1, each
    taking the next piece in turn: a worker, called in its thread (on the
    clock), returns the function that does piece k."""
    import threading
    nxt, lock = [0], threading.Lock()

    def run(worker):
        piece = worker()
        while True:
            with lock:
                k = nxt[0]
                nxt[0] += 1
            if k >= n:
                return
            piece(k)
    t0 = time.perf_counter()
    ts = [threading.Thread(target=run, args=(w,)) for w in workers]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def serial_casts():
    """This thread's torch casts on this thread alone, as the Loader's read
    threads cast (torch's OpenMP count is per thread: clipshard.torch)."""
    from clipshard.torch import _one_thread
    _one_thread()


# -- resume ------------------------------------------------------------------

def _rank(rank, world, tool, data, log, init, B):
    """One rank of a training run: logs each step's samples and saves the
    loader's state after every step (the tool's documented way)."""
    import torch
    import torch.distributed as dist
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      NODE_RANK="0", MASTER_ADDR="127.0.0.1")
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    state = os.path.join(log, "state.pt")
    resume = torch.load(state, weights_only=False) if os.path.exists(state) else None
    if tool == "clipshard":
        from clipshard.torch import Loader
        it = Loader(data, 0, batch_size=B, dtype=torch.float32)
    elif tool == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset
        it = StreamingDataLoader(StreamingDataset(data, shuffle=True, drop_last=True, seed=1), batch_size=B,
                                 num_workers=2, drop_last=True)
    elif tool == "mosaic":
        from streaming import StreamingDataLoader, StreamingDataset
        it = StreamingDataLoader(StreamingDataset(local=data, shuffle=True, batch_size=B, shuffle_seed=1),
                                 batch_size=B, num_workers=2, drop_last=True)
    else:  # webdataset: no state to save; a restart reads the epoch again
        it, _ = batches(tool, DEFAULT[tool], data, B, 1)
    if resume is not None and resume["data"] is not None:
        it.load_state_dict(resume["data"])
    step = resume["step"] if resume is not None else 0
    with open(os.path.join(log, "rank-%d-of-%d.jsonl" % (rank, world)), "a") as f:
        for b in it:
            samples = b["samples"] if isinstance(b, dict) else b[-1]
            step += 1
            f.write(json.dumps([step, np.asarray(samples).reshape(-1, 3).tolist()]) + "\n")
            f.flush()
            dist.barrier()  # every rank trained this step
            if rank == 0:  # (the model's checkpoint; the loader's state where it has one)
                torch.save({"step": step, "data": it.state_dict() if hasattr(it, "state_dict") else None}, state + ".tmp")
                os.replace(state + ".tmp", state)
            dist.barrier()
            time.sleep(0.02)  # a step
    dist.destroy_process_group()


def resume(tool, data, log, total, B=128):
    """Kill a 2-rank run at 40% of the epoch, resume on 1 rank; JSON line:
    samples trained twice and never trained."""
    import signal
    import subprocess
    import tempfile
    import torch
    os.makedirs(log, exist_ok=True)
    if tool == "mosaic":
        from streaming.base.util import clean_stale_shared_memory
        clean_stale_shared_memory()

    def launch(world):
        rdv = tempfile.mktemp(prefix="clipshard-peers-")
        code = ("import sys; sys.path.insert(0, %r); import bench_peers as b, torch.multiprocessing as mp; "
                "mp.spawn(b._rank, args=(%d, %r, %r, %r, %r, %d), nprocs=%d)") % (here, world, tool, data, log, "file://" + rdv, B, world)
        return subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=open(os.path.join(log, "stderr-%d.txt" % world), "w"))
    p = launch(2)
    target = int(0.4 * total / (2 * B))
    deadline = time.monotonic() + 600
    while True:
        lines = 0
        try:
            lines = sum(1 for _ in open(os.path.join(log, "rank-0-of-2.jsonl")))
        except OSError:
            pass
        if lines >= target or p.poll() is not None or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    state = os.path.join(log, "state.pt")
    saved = torch.load(state, weights_only=False)["step"] if os.path.exists(state) else 0
    trained = []
    for r in range(2):
        f = os.path.join(log, "rank-%d-of-2.jsonl" % r)
        for line in open(f) if os.path.exists(f) else []:  # (none: killed before its first step)
            step, ss = json.loads(line)
            if step <= saved:  # steps after the last state are trained again after the resume
                trained += [tuple(x) for x in ss]
    q = launch(1)
    q.wait(timeout=900)
    ok = q.returncode == 0
    for line in open(os.path.join(log, "rank-0-of-1.jsonl")) if os.path.exists(os.path.join(log, "rank-0-of-1.jsonl")) else []:
        trained += [tuple(x) for x in json.loads(line)[1]]
    uniq = len(set(trained))
    print(json.dumps(dict(tool=tool, killed_at_step=saved, trained=len(trained), repeated=len(trained) - uniq,
                          never=total - uniq, resumed_ok=ok, global_batch_after=B)), flush=True)


PEER = {"litdata": "litdata", "mosaic": "mosaic", "webdataset": "webdataset", "webdataset-1": "webdataset"}
OURS = ["clipshard:threads2", "clipshard-f16:threads2", "clipshard-drawn:threads2"]


def _runs(path):
    return [json.loads(line) for line in open(path) if line.startswith("{")]


def best(path, only=False):
    """The main table's rows (TOOL:CONFIG): clipshard's, then each peer's
    default and its best configuration in the sweep (highest median
    samples/s); with only, clipshard's and each peer's best."""
    runs = [r for r in _runs(path) if r.get("mode") == "sweep, warm" and "samples_per_s" in r]
    rows = list(OURS)
    for peer in dict.fromkeys(PEER.values()):
        cands = {}
        for r in runs:
            if PEER.get(r["tool"]) == peer:
                cands.setdefault("%s:%s" % (r["tool"], r["config"]), []).append(r["samples_per_s"])
        dflt = "%s:%s" % (peer, DEFAULT[peer])
        top = max(cands, key=lambda k: np.median(cands[k])) if cands else dflt
        rows += ([top] if only else [dflt, top])
    return " ".join(dict.fromkeys(rows))


def _fmt(xs, f="%.0f"):
    """median (min-max) of xs."""
    if not xs:
        return "-"
    if len(xs) == 1:
        return f % xs[0]
    return (f + " (" + f + "–" + f + ")") % (np.median(xs), min(xs), max(xs))


def _ratio(a, b):
    """a / b round by round (the k-th run of every row is round k; a run
    without a rate left out): median (range)."""
    return _fmt([x / y for x, y in zip(a, b) if x and y], "%.2f")


def table(path):
    rows = _runs(path)
    print("\n| prepare | wall s | peak RSS MB | MB on disk |\n|---|---|---|---|")
    size = {r["bytes"]: r["MB"] for r in rows if "bytes" in r}
    for t in ["clipshard"] + list(PEER):
        ps = [r for r in rows if r.get("prepare") and r["tool"] == t]
        if not ps:
            continue
        mb = size.get("ep" if t == "clipshard" else t)
        extra = " (+ %d the dataset)" % size["ds"] if t == "clipshard" and "ds" in size else ""
        print("| %s | %s | %s | %s%s |" % (t, " + ".join("%.2f" % r["wall_s"] for r in ps), " / ".join(str(r["rss_MB"]) for r in ps), mb, extra))
    reads = [r for r in rows if "samples_per_s" in r and r.get("tool") != "floor"]
    sweep = [r for r in reads if r["mode"] == "sweep, warm"]
    top = set(best(path, only=True).split())
    if sweep:
        loads = [r["load"] for r in sweep]
        print("\n| sweep, warm, S=0 (load average %.2f–%.2f) | samples/s, median (range) | first epoch samples/s | CPU ms / batch | |"
              "\n|---|---|---|---|---|" % (min(loads), max(loads)))
        for key in dict.fromkeys((r["tool"], r["config"]) for r in sweep):
            rs = [r for r in sweep if (r["tool"], r["config"]) == key]
            mark = ", ".join(m for m, ok in (("default", key[1] == DEFAULT.get(key[0]) and key[0] == PEER.get(key[0])),
                                             ("best", "%s:%s" % key in top)) if ok)
            print("| %s %s | %s | %s | %s | %s |" % (key[0], key[1], _fmt([r["samples_per_s"] for r in rs]),
                                                 _fmt([r["first_samples_per_s"] for r in rs]),
                                                 _fmt([r["cpu_ms_per_batch"] for r in rs], "%.1f"), mark))
    floors = [r for r in rows if r.get("tool") == "floor"]
    main = [r for r in reads if r["mode"] in ("warm", "cold")]
    for mode in ("warm", "cold"):
        ms = [r for r in main if r["mode"] == mode]
        if not ms:
            continue
        loads = [r["load"] for r in ms]
        Ss = sorted(dict.fromkeys(r["S"] for r in ms))
        print("\n| %s (load average %.2f–%.2f) | S=0: samples/s, median (range) | first epoch | CPU ms / batch | %s |\n|---|---|---|---|%s"
              % (mode, min(loads), max(loads), " | ".join("wait at S=%g, ms (p99)" % S for S in Ss if S), "---|" * len([S for S in Ss if S])))
        fl = [r for r in floors if r["mode"] == mode]
        if fl:
            print("| floor: %s | %s | | | %s |" % (", ".join(sorted(set(r["config"] for r in fl))), _fmt([r["samples_per_s"] for r in fl]),
                                                  " | ".join("" for S in Ss if S)))
            for kind in ("float16 into batches", "float32 into batches"):
                xs = [r["deliver"][kind] for r in fl if kind in r.get("deliver", {})]
                if xs:
                    print("| floor, %s | %s | | | %s |" % (kind, _fmt(xs), " | ".join("" for S in Ss if S)))
        for key in dict.fromkeys((r["tool"], r["config"]) for r in ms):
            rs = [r for r in ms if (r["tool"], r["config"]) == key]
            at = lambda S, k: [r[k] for r in rs if r["S"] == S and k in r]  # noqa: E731
            label = "%s %s%s" % (key[0], key[1], " (best)" if "%s:%s" % key in top and key[0] in PEER else
                                 " (default)" if key[0] in PEER else "")
            print("| %s | %s | %s | %s | %s |" % (label, _fmt(at(0, "samples_per_s")), _fmt(at(0, "first_samples_per_s")),
                                                  _fmt(at(0, "cpu_ms_per_batch"), "%.1f"),
                                                  " | ".join("%s (%s)" % (_fmt(at(S, "wait_med_ms"), "%.2f"), _fmt(at(S, "wait_p99_ms"), "%.1f"))
                                                             for S in Ss if S)))
        # Ratios: clipshard's rows against the floor and each peer's best
        # (median of the rounds' ratios, and their range).
        def per_round(tool, config):
            return [r["samples_per_s"] for r in ms if r["tool"] == tool and r["config"] == config and r["S"] == 0]
        lines = []
        for ours, name in (("clipshard-f16", "float16 (numpy)"), ("clipshard", "float32 torch"), ("clipshard-drawn", "drawn, float32 torch")):
            a = per_round(ours, "threads2")
            if a and fl:
                lines.append("%s / floor %s" % (name, _ratio(a, [r["samples_per_s"] for r in fl])))
            kind = "float16 into batches" if ours == "clipshard-f16" else "float32 into batches"
            dv = [r["deliver"][kind] for r in fl if kind in r.get("deliver", {})]
            if a and dv:
                lines.append("%s / floor %s %s" % (name, kind, _fmt([x / np.median(dv) for x in a], "%.2f")))
            firsts = [r["first_samples_per_s"] / r["samples_per_s"] for r in ms if r["tool"] == ours and r["S"] == 0]
            if firsts:
                lines.append("%s first epoch / steady %s" % (name, _fmt(firsts, "%.2f")))
        a = per_round("clipshard", "threads2")
        for key in sorted(k for k in (tuple(x.split(":")) for x in top) if k[0] in PEER):
            b = per_round(*key)
            if a and b:
                lines.append("clipshard / %s %s %s" % (key[0], key[1], _ratio(a, b)))
        if lines:
            print("\n%s ratios at S=0 (median of the rounds, range): %s" % (mode, "; ".join(lines)))
    def by_row(runs):
        """(tool, config) -> its runs in the order they ran (the k-th of each
        row is round k: every row runs once a round)."""
        out = {}
        for r in runs:
            out.setdefault((r["tool"], r.get("config", "")), []).append(r)
        return out

    def loads(runs):
        ls = [r["load"] for r in runs if "load" in r]
        return " (load average %.2f–%.2f)" % (min(ls), max(ls)) if ls else ""

    def vs_peers(groups, what):
        """clipshard's rate over each peer's, round by round."""
        ours = [r.get("samples_per_s") for r in groups.get(("clipshard", "threads2"), [])]
        out = []
        for key, rs in groups.items():
            theirs = [r.get("samples_per_s") for r in rs]
            if key[0] in PEER and any(a and b for a, b in zip(ours, theirs)):
                out.append("%s %s %s" % (key[0], key[1], _ratio(ours, theirs)))
        if out:
            print("\n%s: clipshard (float32 torch) / each peer's best, round by round: %s" % (what, "; ".join(out)))

    net = [r for r in reads if r["mode"] == "sshfs, cold"]
    if net:
        print("\n| sshfs, cold, S=0%s | samples/s, median (range) | rounds |\n|---|---|---|" % loads(net))
        fl = [r for r in floors if r["mode"] == "sshfs, cold"]
        if fl:
            print("| floor: %s | %s | %d |" % (", ".join(sorted(set(r["config"] for r in fl))), _fmt([r["samples_per_s"] for r in fl]), len(fl)))
        groups = by_row(net)
        for (tool, config), rs in groups.items():
            print("| %s %s | %s | %d |" % (tool, config, _fmt([r["samples_per_s"] for r in rs]), len(rs)))
        vs_peers(groups, "sshfs")
        if fl:
            out = []
            for (tool, config), rs in groups.items():
                if tool.startswith("clipshard"):
                    out.append("%s %s %s" % (tool, config, _ratio([r["samples_per_s"] for r in rs], [f["samples_per_s"] for f in fl])))
            print("\nsshfs: clipshard / the floor, round by round: %s" % "; ".join(out))
    capped = [r for r in rows if str(r.get("mode", "")).startswith("capped")]
    if capped:
        big = next((r["MB"] for r in rows if r.get("bytes") == "big epoch"), "?")
        print("\n| %s (an epoch of %s MB), S=20%s | samples/s, median (range) | wait ms: median; p99 (medians of the rounds) | rounds |"
              "\n|---|---|---|---|" % (capped[0]["mode"], big, loads(capped)))
        groups = by_row(capped)
        for (tool, config), rs in groups.items():
            ok = [r for r in rs if not r.get("killed")]
            killed = len(rs) - len(ok)
            if not ok:
                print("| %s %s | killed (out of memory) | | %d |" % (tool, config, len(rs)))
                continue
            print("| %s %s | %s%s | %.2f; %.1f | %d |" % (
                tool, config, _fmt([r["samples_per_s"] for r in ok]), " (%d killed)" % killed if killed else "",
                float(np.median([r["wait_med_ms"] for r in ok])), float(np.median([r["wait_p99_ms"] for r in ok])), len(rs)))
        vs_peers(groups, "capped")
    res = [r for r in rows if "repeated" in r]
    if res:
        print("\n| resume (2 ranks killed at 40%, resumed on 1) | trained twice | never trained | of which the drop rule's tail |\n|---|---|---|---|")
        for r in res:
            print("| %s | %d | %d | < %d |" % (r["tool"], r["repeated"], r["never"], r["global_batch_after"]))
    bad = [r for r in rows if r.get("failed") or r.get("killed")]
    if bad:
        print("\nfailed runs: %s" % ", ".join("%s %s %s S=%s" % (r["tool"], r.get("config"), r["mode"], r["S"]) for r in bad))


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "prepare":
        prepare(*sys.argv[2:6])
    elif cmd == "table":
        table(sys.argv[2])
    elif cmd == "resume":
        resume(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    elif cmd == "read":
        read(sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5], sys.argv[6], *(int(x) for x in sys.argv[7:8]))
    elif cmd == "floor":
        floor(sys.argv[2], sys.argv[3])
    elif cmd == "best":
        print(best(sys.argv[2], only="--best-only" in sys.argv[3:]))
    else:
        raise SystemExit(__doc__)
