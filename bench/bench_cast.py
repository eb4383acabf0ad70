#!/usr/bin/env python3
"""Where a float32 batch's time goes on this box (docs/BENCHMARKS-HISTORY.md,
"Against the peers": #35's float32 goal), warm, 2 threads:

    python3 bench/bench_cast.py EPOCHS_DIR [ROUNDS]

Rows, interleaved in ROUNDS rounds (3), over epoch 0's shard bytes of
EPOCHS_DIR, each the samples/s the epoch's bytes are worth:

  read          the raw floor's setting (bench_peers.py floor): every
                shard read whole with preadv, 1 MiB pieces into a buffer
                of each thread's own (the CPU cache holds it)
  f16 ring      the same reads into a ring of 6 batch-sized buffers
  f32 ring      1 MiB read into each thread's scratch, cast by torch into a
                float32 ring (bench_peers.py floor's "float32 into
                batches"; each thread's cast on that thread alone)
  cast alone    the f32 ring's casts without its reads: each thread casts
                the same count of 1 MiB pieces from its own scratch (in
                its cache) into the float32 ring
  copy alone    the f16 ring's writes without the kernel: numpy copies 4 MiB
                pieces of a thread's scratch into the float16 ring
  write alone   the float32 ring's bytes written and nothing read (memset
                of 2 MiB pieces: what any cast must at least do)

and, per round, the float32 bound that reads at the raw floor and casts
at the cast-alone rate would reach on these 2 cores, 1 / (1/read +
1/cast alone), against the raw floor, and the bound of any cast, which
writes float32 no faster than "write alone": 1 / (1/read + 1/write
alone). One JSON line a round; a summary (median, range) at the end.
"""
import json
import os
import sys

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "python"))
sys.path.insert(0, here)
import clipshard  # noqa: E402
import clipshard.loader  # noqa: E402
from bench_peers import floor_pass, in_turn, serial_casts  # noqa: E402

MiB = 1 << 20


def alone(total, ring, f32, fill=False):
    """Seconds for 2 threads to write total bytes of float16 (f32: as
    float32, cast by torch in 1 MiB pieces; else copied by numpy in 4 MiB
    pieces) from a scratch of their own into ring, piece after piece, as
    floor_pass lays them out; fill: the float32 pieces' bytes set to 0
    instead (memset), nothing read."""
    import torch
    piece = MiB if f32 else 4 * MiB
    R = clipshard.loader.buffer(ring * (2 if f32 else 1) // 4 * 4)
    scratch = [clipshard.loader.buffer(piece) for _ in range(2)]  # (made before the clock starts)
    for s in scratch:
        s.view(np.float16)[:] = np.random.default_rng(0).standard_normal(piece // 2)  # (features' kind of values)

    def worker(s):
        def make():
            s16 = torch.from_numpy(s.view(np.float16))
            if f32:
                serial_casts()

            def one(k):
                if f32:
                    at = (k * piece * 2) % (len(R) - 2 * piece)
                    if fill:
                        R[at: at + 2 * piece].fill(0)  # (memset: numpy's fastest write)
                    else:
                        torch.from_numpy(R[at: at + 2 * piece].view(np.float32)).copy_(s16)
                else:
                    at = (k * piece) % (len(R) - piece)
                    np.copyto(R[at: at + piece], s)
            return one
        return make
    return in_turn(-(-total // piece), [worker(s) for s in scratch])


def main():
    edir = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    man = clipshard.load_epochs(edir)
    e = man["epochs"][0]
    files = [os.path.join(edir, f) for s in e["shards"] for f in s["files"].values()]
    total = sum(os.path.getsize(f) for f in files)
    ring = 6 * 256 * total // e["samples"]
    floor_pass(files, os.O_RDONLY, 1, MiB)  # (warm: read once first)
    rows = {"read": lambda: floor_pass(files, os.O_RDONLY, 2, MiB),
            "f16 ring": lambda: floor_pass(files, os.O_RDONLY, 2, 4 * MiB, ring=ring),
            "f32 ring": lambda: floor_pass(files, os.O_RDONLY, 2, 4 * MiB, ring=ring, f32=True),
            "cast alone": lambda: alone(total, ring, True),
            "copy alone": lambda: alone(total, ring, False),
            "write alone": lambda: alone(total, ring, True, fill=True)}
    got = {k: [] for k in list(rows) + ["f32 bound", "f32 bound / read", "any cast's bound / read", "f32 ring / read"]}
    for r in range(rounds):
        load = os.getloadavg()[0]
        line = {}
        for k, f in rows.items():
            line[k] = e["samples"] / float(np.median([f() for _ in range(3)]))  # (the median of 3 passes, as the floor)
        line["f32 bound"] = 1 / (1 / line["read"] + 1 / line["cast alone"])
        line["f32 bound / read"] = line["f32 bound"] / line["read"]
        line["any cast's bound / read"] = 1 / (1 / line["read"] + 1 / line["write alone"]) / line["read"]
        line["f32 ring / read"] = line["f32 ring"] / line["read"]
        for k, v in line.items():
            got[k].append(v)
        print(json.dumps(dict(round=r, load=load, samples=e["samples"], epoch_bytes=total,
                              **{k: round(v, 3 if "/" in k else 0) for k, v in line.items()})), flush=True)
    print("summary, %d rounds, samples/s (ratios: x), median (range); %d samples of %.1f KiB (float16):" % (
        rounds, e["samples"], total / e["samples"] / 1024))
    for k, v in got.items():
        f = "%.2f" if "/" in k else "%.0f"
        print(("  %-23s " + f + " (" + f + "-" + f + ")") % (k, float(np.median(v)), min(v), max(v)))


if __name__ == "__main__":
    main()
