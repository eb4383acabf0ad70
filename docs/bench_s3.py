#!/usr/bin/env python3
"""One row of just bench-s3 (docs/bench_s3.sh), printed as a JSON line.

    bench_s3.py ROW EDIR URL CACHE [STEP_MS]

ROW:
  floor-T    plain boto3 ranged GETs (8 MiB, T threads) of the epoch's
             shard objects, to nothing (the sweep's best is the floor)
  loader     clipshard.Loader over the bucket (cache CACHE: cold if it
             is empty, warm if a loader filled it), float16, B=256
  local      clipshard.Loader over the folder EDIR (the same epoch)
  upload     a plain boto3 multipart upload (upload_file, 16 MiB parts,
             4 threads) of EDIR's files to URL
With STEP_MS, the loader rows sleep that long a batch (a simulated
accelerator step) and report the median and p90 wait for the next batch.
"""
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402
from clipshard import _remote  # noqa: E402

row, edir, url, cache = sys.argv[1:5]
step = float(sys.argv[5]) / 1000 if len(sys.argv) > 5 else 0.0
man = clipshard.load_epochs(edir)
e = man["epochs"][0]
files = [f for s in e["shards"] for f in s["files"].values()]
nbytes = sum(os.path.getsize(os.path.join(edir, f)) for f in files)
out = {"row": row, "step_ms": step * 1000, "epoch_bytes": nbytes}
t0 = time.perf_counter()
if row.startswith("floor"):
    # floor-T: T threads of plain ranged GETs (8 MiB) of every object, to nothing
    b = _remote.Bucket(url)

    def get(rel):
        size, etag = b.head(rel)
        b.range(rel, 0, size, etag)
    with ThreadPoolExecutor(int(row.split("-")[1])) as ex:
        list(ex.map(get, files))
elif row in ("loader", "local"):
    kw = dict(cache_dir=cache, cache_limit=max(4 * nbytes, 1 << 30)) if row == "loader" else {}
    ld = clipshard.Loader(url if row == "loader" else edir, e["epoch"], batch_size=256, **kw)
    waits = []
    n = 0
    t = time.perf_counter()
    for batch in ld:
        waits.append(time.perf_counter() - t)
        n += len(batch["samples"])
        if step:
            time.sleep(step)
        t = time.perf_counter()
    ld.close()
    waits.sort()
    out.update(samples=n, wait_median_ms=1000 * waits[len(waits) // 2], wait_p90_ms=1000 * waits[int(len(waits) * 0.9)])
elif row == "upload":
    from boto3.s3.transfer import TransferConfig
    b = _remote.Bucket(url)
    cfg = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20, max_concurrency=4)
    for rel in files + ["epochs.json", "shards.parquet", "SHA256SUMS"]:
        b._client.get().upload_file(os.path.join(edir, rel), b.bucket, b.key(rel), Config=cfg)
    nbytes = sum(os.path.getsize(os.path.join(edir, f)) for f in files)
else:
    raise SystemExit("unknown row %r" % row)
out["seconds"] = time.perf_counter() - t0
out["MiB_per_s"] = nbytes / (1 << 20) / out["seconds"]
print(json.dumps(out))
