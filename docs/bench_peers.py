#!/usr/bin/env python3
"""clipshard against the loaders its users would pick instead (just
bench-peers; docs/BENCHMARKS.md): LitData, Mosaic Streaming, WebDataset.

    python3 docs/bench_peers.py prepare TOOL SRC WINDOWS OUT
    python3 docs/bench_peers.py read TOOL S MODE DATA [B]
    python3 docs/bench_peers.py resume TOOL DATA LOG
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
import clipshard  # noqa: E402

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


def drop(paths):
    os.sync()
    for top in paths:
        for d, _, names in os.walk(top):
            for nm in names:
                try:
                    fd = os.open(os.path.join(d, nm), os.O_RDONLY)
                except OSError:
                    continue
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)


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


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "prepare":
        prepare(*sys.argv[2:6])
    elif cmd == "read":
        read(sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5], *(int(x) for x in sys.argv[6:7]))
    else:
        raise SystemExit(__doc__)
