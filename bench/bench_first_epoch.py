#!/usr/bin/env python3
"""The first epoch of a process against the later ones (#35), on an epoch
long enough that a fixed start-up (threads, files opened, the first
batch's read) does not dominate it.

    python3 bench/bench_first_epoch.py EPOCHS_DIR [EPOCHS] [ROUNDS]

Each round runs two new processes in turn, one `clipshard.Loader`
(float16) and one `clipshard.torch.Loader(dtype=torch.float32)` (if torch
imports), prefetch 4, B=256, S=0, each reading EPOCHS (4) epochs (epoch 0
and its replays, which the loader reads ahead into); prints per row the
median (range) over the ROUNDS (3) rounds of the first epoch's time over
the median of the later ones', the first batch's wait in the first
epoch and in the later ones, and the load average. The page cache is
warmed first (every shard file read once).
"""
import json
import os
import subprocess
import sys
import time

import numpy as np

from bench_stats import span  # noqa: E402 (bench/bench_stats.py)

here = os.path.dirname(os.path.abspath(__file__))


def child(edir, n, f32):
    sys.path.insert(0, os.path.join(here, "..", "python"))
    import clipshard
    if f32:
        import torch
        from clipshard.torch import Loader
        ld = Loader(edir, list(range(n)), replay_seed=1, batch_size=256, prefetch=4, dtype=torch.float32)
    else:
        ld = clipshard.Loader(edir, list(range(n)), replay_seed=1, batch_size=256, prefetch=4)
    per, first, batches = [], [], 0
    for _ in range(n):
        t, k = time.perf_counter(), 0
        for _b in ld:
            if k == 0:
                first.append(time.perf_counter() - t)
            k += 1
        per.append(time.perf_counter() - t)
        batches = k
    print(json.dumps(dict(epochs_ms=[x * 1e3 for x in per], first_batch_ms=[x * 1e3 for x in first], batches=batches)))


def main():
    edir = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    for d, _, names in os.walk(edir):
        for nm in names:
            with open(os.path.join(d, nm), "rb") as f:
                while f.read(8 << 20):
                    pass
    rows = ["float16"]
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0:
        rows.append("float32 torch")
    load0 = open("/proc/loadavg").read().split()[0]
    got = {r: [] for r in rows}
    for _ in range(rounds):
        for r in rows:
            out = subprocess.run([sys.executable, __file__, "--child", edir, str(n), "1" if r != "float16" else ""],
                                 capture_output=True, text=True, check=True).stdout
            got[r].append(json.loads(out))
    load1 = open("/proc/loadavg").read().split()[0]
    b = got[rows[0]][0]["batches"]
    print("%s: %d batches an epoch, %d epochs a process, %d rounds, load average %s–%s" % (edir, b, n, rounds, load0, load1))
    for r in rows:
        ratio = [g["epochs_ms"][0] / float(np.median(g["epochs_ms"][1:])) for g in got[r]]
        print("  %-14s first epoch %s ms, later %s ms; first / later %s; first batch %s ms, later epochs' first batch %s ms"
              % (r, span([g["epochs_ms"][0] for g in got[r]], "%.0f"),
                 span([float(np.median(g["epochs_ms"][1:])) for g in got[r]], "%.0f"), span(ratio, "%.2f"),
                 span([g["first_batch_ms"][0] for g in got[r]], "%.1f"),
                 span([float(np.median(g["first_batch_ms"][1:])) for g in got[r]], "%.1f")))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), bool(sys.argv[4]) if len(sys.argv) > 4 else False)
    elif len(sys.argv) > 1:
        main()
    else:
        raise SystemExit(__doc__)
