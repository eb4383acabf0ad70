#!/usr/bin/env python3
"""One row of just bench s3 (bench/bench_s3.sh), printed as a JSON line.

    bench_s3.py ROW EDIR URL CACHE [STEP_MS [PEER_BYTES]]

ROW:
  floor-T    plain boto3 ranged GETs (8 MiB, each body read whole, T
             threads) of the epoch's shard objects, to nothing (the
             sweep's best is the floor)
  checked-T  the same GETs, each 1 MiB of the body as it comes written
             into a local file (allocated first) and hashed (sha256 by
             1 MiB): what a script does that keeps and checks what it
             fetches, the work of a cold cache without its bookkeeping
             nor the reader's copy out of it (files in CACHE, a new
             folder: one that exists is refused)
  loader     clipshard.Loader over the bucket (cache CACHE: cold if it
             is empty, warm if a loader filled it), float16, B=256
  ranks-R    R ranks (processes) of the Loader over the bucket at once,
             each with a cache of its own (R nodes): wall, and the bytes
             they fetched against the epoch's (the cluster's egress)
  local      clipshard.Loader over the folder EDIR (the same epoch)
  mosaic-W, litdata-W
             Mosaic Streaming / LitData reading their own shards (put
             there from bench_peers.py prepare) from URL through a cold
             cache of their own at CACHE, W DataLoader workers, B=256,
             float16 as stored; PEER_BYTES their shards' bytes
  put        plain boto3 uploads of the folder EDIR's files to URL
  upload     a plain boto3 multipart upload (upload_file, 16 MiB parts,
             4 threads) of EDIR's files to URL
B is 256, or BENCH_BATCH (the tests' tiny epochs). With STEP_MS, the
loader rows sleep that long a batch (a simulated accelerator step) and
report the median and p90 wait for the next batch.
Every row's clock starts once its client or loader is made (setup_s);
cpu_s is the CPU the row's processes used meanwhile, server_cpu_s the
server's (BENCH_SERVER_PID).
"""
import json
import os
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402
from clipshard import _bucket  # noqa: E402

row, edir, url, cache = sys.argv[1:5]
step = float(sys.argv[5]) / 1000 if len(sys.argv) > 5 else 0.0
B = int(os.environ.get("BENCH_BATCH", 256))
if row == "put":
    # a folder's files to URL, plain boto3 uploads (a peer's shards)
    import boto3
    c = boto3.session.Session().client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    bucket, prefix = url[len("s3://"):].split("/", 1)
    for r, _, names in os.walk(edir):
        for n in names:
            c.upload_file(os.path.join(r, n), bucket, prefix + "/" + os.path.relpath(os.path.join(r, n), edir))
    raise SystemExit(0)
man = clipshard.load_epochs(edir)
e = man["epochs"][0]
files = [f for s in e["shards"] for f in s["files"].values()]
nbytes = sum(os.path.getsize(os.path.join(edir, f)) for f in files)
out = {"row": row, "step_ms": step * 1000, "epoch_bytes": nbytes}
server = os.environ.get("BENCH_SERVER_PID")


def _cpu():
    """CPU seconds of this process and of its children that ended."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def _server_cpu():
    with open("/proc/%s/stat" % server) as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


# Each row's clock starts once its client or loader is made (boto3's
# import and client, the manifests: out["setup_s"]), the same for all.
t0 = time.perf_counter()
cpu0, server0 = _cpu(), (_server_cpu() if server else 0.0)
if row.startswith(("floor", "checked")):
    # floor-T: T threads of plain boto3 ranged GETs (8 MiB, read whole) of
    # every object, to nothing; checked-T: written and hashed as they come
    import boto3
    from botocore.config import Config
    c = boto3.session.Session().client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], config=Config(
        max_pool_connections=16, s3={"addressing_style": "path"}))
    bucket, prefix = url[len("s3://"):].split("/", 1)
    sizes = {f: c.head_object(Bucket=bucket, Key=prefix + "/" + f)["ContentLength"] for f in files}
    out["setup_s"] = time.perf_counter() - t0
    t0, cpu0, server0 = time.perf_counter(), _cpu(), (_server_cpu() if server else 0.0)

    import hashlib
    fds = {}
    if row.startswith("checked"):
        os.makedirs(cache)  # (a new folder: never one holding anyone's files)
        for i, f in enumerate(files):
            fds[f] = os.open(os.path.join(cache, "%d" % i), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            os.posix_fallocate(fds[f], 0, sizes[f])

    def get(piece):
        f, a, b = piece
        body = c.get_object(Bucket=bucket, Key=prefix + "/" + f, Range="bytes=%d-%d" % (a, b - 1))["Body"]
        if not fds:
            body.read()
            return
        while a < b:
            chunk = body.read(min(1 << 20, b - a))
            os.pwrite(fds[f], chunk, a)
            hashlib.sha256(chunk).digest()
            a += len(chunk)
    pieces = [(f, a, min(a + (8 << 20), sizes[f])) for f in files for a in range(0, sizes[f], 8 << 20)]
    with ThreadPoolExecutor(int(row.split("-")[1])) as ex:
        list(ex.map(get, pieces))
    for fd in fds.values():
        os.close(fd)
elif row.startswith("ranks-"):
    R = int(row.split("-")[1])
    code = """
import json, resource, sys, time
sys.path.insert(0, %r)
import clipshard
rank, R, url, cache = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
ld = clipshard.Loader(url, %d, rank=rank, world_size=R, batch_size=%d, cache_dir=cache, cache_limit=%d)
print(json.dumps({"ready": time.time()}), flush=True)
sys.stdin.readline()
cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
c0 = cpu()
n = sum(len(b["samples"]) for b in ld)
print(json.dumps({"samples": n, "fetched": ld._remote.fetched, "cpu": cpu() - c0}))
""" % (os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"), e["epoch"], B, max(4 * nbytes, 1 << 30))
    import subprocess
    ps = [subprocess.Popen([sys.executable, "-c", code, str(r), str(R), url, "%s-%d" % (cache, r)], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True) for r in range(R)]
    for p in ps:
        p.stdout.readline()  # each made (its client, the manifests)
    out["setup_s"] = time.perf_counter() - t0
    t0, cpu0, server0 = time.perf_counter(), _cpu(), (_server_cpu() if server else 0.0)
    for p in ps:
        p.stdin.write("go\n")
        p.stdin.flush()
    res = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in ps]
    read = sum(r["samples"] for r in res)
    out.update(ranks=R, samples=read, fetched=sum(r["fetched"] for r in res),
               egress=sum(r["fetched"] for r in res) / (nbytes * read / e["samples"]), ranks_cpu_s=sum(r["cpu"] for r in res))
elif row in ("loader", "local"):
    kw = dict(cache_dir=cache, cache_limit=max(4 * nbytes, 1 << 30)) if row == "loader" else {}
    ld = clipshard.Loader(url if row == "loader" else edir, e["epoch"], batch_size=B, **kw)
    out["setup_s"] = time.perf_counter() - t0
    t0, cpu0, server0 = time.perf_counter(), _cpu(), (_server_cpu() if server else 0.0)
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
elif row.startswith(("mosaic-", "litdata-")):
    # A peer reading its own shards (bench_peers.py prepare, pushed to the
    # bucket with put) from URL through a cold cache of its own at CACHE,
    # with W DataLoader workers, B=256, float16 as stored.
    tool, workers = row.split("-")
    os.environ.setdefault("S3_ENDPOINT_URL", os.environ["AWS_ENDPOINT_URL"])  # (Mosaic's name for it)
    if tool == "mosaic":
        from streaming import StreamingDataLoader, StreamingDataset
        from streaming.base.util import clean_stale_shared_memory
        clean_stale_shared_memory()
        ds = StreamingDataset(remote=url, local=cache, shuffle=True, batch_size=B, shuffle_seed=1)
    else:
        from litdata import StreamingDataLoader, StreamingDataset
        import litdata.streaming.downloader as dl
        # Its fast path (obstore) refuses http:// endpoints; the server here
        # is http on loopback (on S3 it is https): allowed, as it would be.
        dl._OBSTORE_CLIENT_OPTIONS = dict(dl._OBSTORE_CLIENT_OPTIONS, allow_http="true")
        ds = StreamingDataset(url, cache_dir=cache, shuffle=True, drop_last=True, seed=1)
    ld = StreamingDataLoader(ds, batch_size=B, num_workers=int(workers), drop_last=True)
    out["setup_s"] = time.perf_counter() - t0
    t0, cpu0, server0 = time.perf_counter(), _cpu(), (_server_cpu() if server else 0.0)
    waits, n = [], 0
    t = time.perf_counter()
    for batch in ld:
        waits.append(time.perf_counter() - t)
        n += len(batch["samples"])
        if step:
            time.sleep(step)
        t = time.perf_counter()
    nbytes = int(sys.argv[6])  # the peer's shard bytes (its folder before the push)
    waits.sort()
    out.update(samples=n, epoch_bytes=nbytes, wait_median_ms=1000 * waits[len(waits) // 2], wait_p90_ms=1000 * waits[int(len(waits) * 0.9)])
elif row == "upload":
    from boto3.s3.transfer import TransferConfig
    b = _bucket.Bucket(url)
    cfg = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20, max_concurrency=4)
    for rel in files + ["epochs.json", "shards.parquet", "SHA256SUMS"]:
        b._client.get().upload_file(os.path.join(edir, rel), b.bucket, b.key(rel), Config=cfg)
    nbytes = sum(os.path.getsize(os.path.join(edir, f)) for f in files)
else:
    raise SystemExit("unknown row %r" % row)
out["seconds"] = time.perf_counter() - t0
out["MiB_per_s"] = nbytes / (1 << 20) / out["seconds"]
out["cpu_s"] = out.pop("ranks_cpu_s", None) or _cpu() - cpu0
if server:
    out["server_cpu_s"] = _server_cpu() - server0
print(json.dumps(out))
