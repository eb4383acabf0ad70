#!/usr/bin/env python3
"""numpy's astype(np.float16) on the same sizes as BenchmarkFromFloat32 and
BenchmarkFromFloat64, for comparison (input bytes per second, best of 5)."""
import os
import time

import numpy as np

rng = np.random.default_rng(1)
# (BENCH_STREAM_VALUES: fewer values for "stream", for the test that runs the script)
for name, n in (("L2", 16 << 10), ("stream", int(os.environ.get("BENCH_STREAM_VALUES", 64 << 20)))):
    for dt in (np.float32, np.float64):
        a = (rng.standard_normal(n) * 100).astype(dt)
        out = np.empty(n, dtype=np.float16)
        reps = max(1, (256 << 20) // a.nbytes)
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(reps):
                np.copyto(out, a, casting="unsafe")
            best = min(best, (time.perf_counter() - t) / reps)
        print("numpy astype %-6s %-7s %8.0f MB/s" % (name, np.dtype(dt).name, a.nbytes / best / 1e6))
