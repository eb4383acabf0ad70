#!/usr/bin/env python3
"""clipshard against the loaders its users would pick instead (just
bench-peers; docs/BENCHMARKS.md): LitData, Mosaic Streaming, WebDataset.

    python3 docs/bench_peers.py prepare TOOL SRC WINDOWS OUT
    python3 docs/bench_peers.py read TOOL S MODE DATA [B]
    python3 docs/bench_peers.py resume TOOL DATA LOG SAMPLES
    python3 docs/bench_peers.py table RESULTS.jsonl

The windows are those of one clipshard epoch (W=15 frames, every modality,
float16 as clipshard stores them): WINDOWS is its epochs folder, whose
samples list (clip, start, valid) the peers' writers take, so that every
tool holds the same samples. The peers fix a window's offset when they
write it (a new set of offsets is a new prepare); clipshard draws them per
epoch. Each peer shuffles at read time its own way.

prepare: the tool's documented writer (litdata.optimize with a function
    yielding a clip's windows, num_workers=2; streaming.MDSWriter;
    webdataset.ShardWriter), sources -> files; prints the samples written.
read: one epoch into float32 torch tensors, B=256, each tool's
    recommended DataLoader (2 workers; clipshard: its Loader, a thread),
    a step of S ms slept after each batch; one JSON line: samples/s, the
    wait per step (median, p99), and a shuffle-quality figure of the order
    read (clipshard.quality: distinct clips per batch, Spearman).
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
from bench_train import drop  # noqa: E402  (the page cache of files and folders dropped)

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
    elif tool == "mosaic":
        from streaming import MDSWriter
        first = next(clip_windows(src, *todo[0], W))
        cols = {k: "ndarray:%s:%s" % (v.dtype.name, ",".join(map(str, v.shape))) for k, v in first.items()}
        with MDSWriter(out=out, columns=cols, size_limit="64mb", compression=None) as w:
            for item in todo:
                for s in clip_windows(src, *item, W):
                    w.write(s)
    elif tool == "webdataset":
        import webdataset as wds
        os.makedirs(out, exist_ok=True)
        k = 0
        with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxsize=64 << 20, verbose=0) as w:
            for item in todo:
                for s in clip_windows(src, *item, W):
                    w.write({"__key__": "%08d" % k, **{"%s.npy" % m: v for m, v in s.items()}})
                    k += 1
    else:
        raise SystemExit("prepare: unknown tool %s" % tool)
    print(json.dumps({"tool": tool, "samples": n}))


def _litdata_fn(item):
    src, W, cid, row, starts = item
    yield from clip_windows(src, cid, row, starts, W)


# -- read ------------------------------------------------------------------

def batches(tool, data, B, workers=2):
    import torch
    f32 = lambda b: {k: (v.float() if v.is_floating_point() else v) for k, v in b.items()}  # noqa: E731
    if tool == "clipshard":
        from clipshard.torch import Loader
        return Loader(data, 0, batch_size=B, dtype=torch.float32), None
    if tool == "clipshard-drawn":  # epochs drawn at read time from the dataset (no shuffle run, no epoch files)
        from clipshard.torch import Loader
        return Loader(dataset=data, epochs=[0], window=15, seed=3, batch_size=B, dtype=torch.float32), None
    if tool == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset
        ds = StreamingDataset(data, shuffle=True, drop_last=True, seed=1)
        return StreamingDataLoader(ds, batch_size=B, num_workers=workers, drop_last=True), f32
    if tool == "mosaic":
        from streaming import StreamingDataLoader, StreamingDataset
        ds = StreamingDataset(local=data, shuffle=True, batch_size=B, shuffle_seed=1)
        return StreamingDataLoader(ds, batch_size=B, num_workers=workers, drop_last=True), f32
    if tool == "webdataset":
        import glob
        import webdataset as wds
        urls = sorted(glob.glob(os.path.join(data, "shard-*.tar")))
        keys = ["%s.npy" % m for m in MODS] + ["samples.npy"]
        ds = (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, workersplitter=wds.split_by_worker,
                             empty_check=False)
              .shuffle(1000).decode().to_tuple(*keys).batched(B, partial=False))
        names = list(MODS) + ["samples"]
        loader = wds.WebLoader(ds, batch_size=None, num_workers=workers)
        return loader, lambda t: {n: (torch.as_tensor(x).float() if n != "samples" else torch.as_tensor(x)) for n, x in zip(names, t)}
    raise SystemExit("read: unknown tool %s" % tool)


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
    return waits, time.perf_counter() - t0, np.concatenate(order) if order else np.zeros((0, 3), np.int64)


def read(tool, S, mode, data, B=256):
    if mode != "warm":
        drop([data] + [p for p in os.environ.get("BENCH_DROP", "").split(":") if p])
    t0 = time.perf_counter()
    it, conv = batches(tool, data, B)
    setup = time.perf_counter() - t0
    waits, wall, order = loop(it, conv, S)
    w = np.array(waits) * 1e3 if waits else np.zeros(1)
    q = clipshard.quality.measure(order, B) if len(order) else {}
    print(json.dumps(dict(tool=tool, S=S, mode=mode, samples=len(order), wall_s=wall, setup_s=setup,
                          samples_per_s=len(order) / wall if wall else 0, wait_med_ms=float(np.median(w)),
                          wait_p99_ms=float(np.percentile(w, 99)), distinct_clips=q.get("distinct_clips_mean"),
                          spearman=q.get("spearman"), unique=int(len(np.unique(order, axis=0))) if len(order) else 0)),
          flush=True)


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
        it, _ = batches(tool, data, B)
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
        for line in open(os.path.join(log, "rank-%d-of-2.jsonl" % r)):
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


def table(path):
    rows = [json.loads(line) for line in open(path) if line.startswith("{")]
    tools = ["clipshard", "clipshard-drawn", "litdata", "mosaic", "webdataset"]
    med = lambda xs: float(np.median(xs)) if xs else float("nan")  # noqa: E731
    print("\n| prepare | wall s | peak RSS MB | MB on disk |\n|---|---|---|---|")
    size = {r["bytes"]: r["MB"] for r in rows if "bytes" in r}
    for t in tools:
        ps = [r for r in rows if r.get("prepare") and r["tool"] == t]
        if not ps:
            continue
        mb = size.get("ep" if t == "clipshard" else t)
        extra = " (+ %d the dataset)" % size["ds"] if t == "clipshard" and "ds" in size else ""
        print("| %s | %s | %s | %s%s |" % (t, " + ".join("%.2f" % r["wall_s"] for r in ps), " / ".join(str(r["rss_MB"]) for r in ps), mb, extra))
    print("\n| read (samples/s; wait ms at S=20, median) | warm S=0 | warm S=20 wait | cold S=0 | cold S=20 wait | sshfs cold S=0 | distinct clips / batch | Spearman |\n|---|---|---|---|---|---|---|---|")
    for t in tools:
        rs = [r for r in rows if r.get("tool") == t and "samples_per_s" in r]
        get = lambda mode, S, k: med([r[k] for r in rs if r["mode"] == mode and r["S"] == S])  # noqa: E731
        print("| %s | %.0f | %.2f | %.0f | %.2f | %.0f | %.1f | %.3f |" % (
            t, get("warm", 0, "samples_per_s"), get("warm", 20, "wait_med_ms"), get("cold", 0, "samples_per_s"),
            get("cold", 20, "wait_med_ms"), get("sshfs, cold", 0, "samples_per_s"), get("warm", 0, "distinct_clips"),
            get("warm", 0, "spearman")))
    capped = [r for r in rows if str(r.get("mode", "")).startswith("capped")]
    if capped:
        big = next((r["MB"] for r in rows if r.get("bytes") == "big epoch"), "?")
        print("\n| %s (an epoch of %s MB), S=20 | samples/s | wait ms median / p99 |\n|---|---|---|" % (capped[0]["mode"], big))
        for r in capped:
            if r.get("killed"):
                print("| %s | killed (out of memory) | |" % r["tool"])
            else:
                print("| %s | %.0f | %.2f / %.1f |" % (r["tool"], r["samples_per_s"], r["wait_med_ms"], r["wait_p99_ms"]))
    print("\n| resume (2 ranks killed at 40%, resumed on 1) | trained twice | never trained | of which the drop rule's tail |\n|---|---|---|---|")
    for r in rows:
        if "repeated" in r:
            print("| %s | %d | %d | < %d |" % (r["tool"], r["repeated"], r["never"], r["global_batch_after"]))


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "prepare":
        prepare(*sys.argv[2:6])
    elif cmd == "table":
        table(sys.argv[2])
    elif cmd == "resume":
        resume(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    elif cmd == "read":
        read(sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5], *(int(x) for x in sys.argv[6:7]))
    else:
        raise SystemExit(__doc__)
