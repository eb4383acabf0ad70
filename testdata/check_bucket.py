#!/usr/bin/env python3
"""Training from epochs pushed to a bucket (clipshard push) through the
node-local cache (issue #34, point 3).

    python3 testdata/check_bucket.py EDIR s3://BUCKET/PREFIX CACHE_ROOT [LIMIT]

EDIR is the epochs folder that was pushed. Checks, each reader (Loader,
EpochReader, and with torch clipshard.torch.Loader and EpochDataset
under 2 DataLoader workers) reading from the bucket:
- the same batches as from EDIR, in the same order, for several world
  sizes and batch sizes that do not divide (every sample once);
- resumed from a state after some batches with another world size and
  batch size: the rest of the epoch exactly;
- the cache's size (du, temporary files counted) sampled during the reads
  never above LIMIT (default: the smallest the readers accept, 5 shard
  groups);
- R ranks (processes) sharing one cache fetch each shard file once: the
  bytes received over all ranks are 1.0-1.1x the epoch's;
- a cache folder holding the user's files is refused and left as it was.
Prints "ok: bucket ..." at the end.
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402
from clipshard import _bucket, _cache, _remote  # noqa: E402

edir, url, root = sys.argv[1], sys.argv[2], sys.argv[3]
man = clipshard.load_epochs(edir)
epochs = [e["epoch"] for e in man["epochs"]]
_r = clipshard.EpochReader(edir, epochs[0])
group = clipshard._shards.group_disk_bytes(_r.shards, _r.expect)  # a shard group's files on disk, with their marks
n_cache = [0]


def cache_dir():
    n_cache[0] += 1
    return os.path.join(root, "cache-%d" % n_cache[0])


def least_limit(**kw):
    """The smallest cache_limit the reader takes (it says so when refusing
    a smaller one): the read-ahead's shard groups and the manifests."""
    try:
        clipshard.EpochReader(url, epochs[0], cache_dir=cache_dir(), cache_limit=1, **kw)
    except ValueError as err:
        # (#64.7: in words, with the rule and the way to a smaller cache)
        m = re.search(r"give cache_limit >= [0-9.]+ [KMGT]iB \((\d+) bytes\) per reader sharing it", str(err))
        assert m and "4 shard groups (the one read, 2 ahead, one more being fetched)" in str(err) and "--shard-samples" in str(err), err
        return int(m.group(1))
    raise SystemExit("a cache_limit of 1 byte was taken")


# A Loader refuses a cache too small when it is made, not at its first
# batch (after a model and DDP were set up: #64.7).
try:
    clipshard.Loader(url, epochs=[epochs[0]], batch_size=2, cache_dir=cache_dir(), cache_limit=least_limit() - 1)
except ValueError as err:
    assert "too small for this epoch's read-ahead" in str(err), err
else:
    raise SystemExit("a Loader took a cache_limit too small for its read-ahead")

# One shard group more than the least: eviction works, readers never wait.
limit = int(sys.argv[4]) if len(sys.argv) > 4 else least_limit() + group


class DuSampler:
    """The cache's disk use (allocated blocks, and apparent sizes) sampled
    every 2 ms while it runs."""

    def __init__(self, path):
        self.path, self.peak, self.stop = path, 0, threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop.is_set():
            total = 0
            for r, _, names in os.walk(self.path):
                for n in names:
                    try:
                        st = os.lstat(os.path.join(r, n))
                        total += st.st_blocks * 512  # du
                    except FileNotFoundError:
                        pass
            self.peak = max(self.peak, total)
            time.sleep(0.002)

    def done(self):
        self.stop.set()
        self.t.join()
        return self.peak


def rows(batches):
    return [np.asarray(b["samples"]).copy() for b in batches]


# Every epoch at every (R, B) with CLIPSHARD_EXHAUSTIVE=1 (CI); else the
# first epoch at each and the others at one rank.
EXHAUSTIVE = bool(os.environ.get("CLIPSHARD_EXHAUSTIVE"))
checks = 0
for e in epochs:
    for R, B in ((1, 7), (2, 5), (3, 4)) if EXHAUSTIVE or e == epochs[0] else ((1, 7),):
        for rank in range(R):
            want = rows(clipshard.EpochReader(edir, e, rank=rank, world_size=R, batch_size=B))
            c = cache_dir()
            du = DuSampler(c)
            got = rows(clipshard.EpochReader(url, e, rank=rank, world_size=R, batch_size=B, cache_dir=c, cache_limit=limit))
            peak = du.done()
            assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want)), ("EpochReader", e, R, B, rank)
            assert peak <= limit, ("the cache grew past its limit", peak, limit)
            checks += 1
        # The Loader, and its data: the same bytes as from the folder.
        c = cache_dir()
        du = DuSampler(c)
        local = clipshard.Loader(edir, e, rank=0, world_size=R, batch_size=B)
        remote = clipshard.Loader(url, e, rank=0, world_size=R, batch_size=B, cache_dir=c, cache_limit=limit)
        for a, b in zip(local, remote):
            for k in a:
                assert np.array_equal(np.asarray(a[k]), np.asarray(b[k]), equal_nan=a[k].dtype.kind == "f"), ("Loader", e, R, B, k)
        assert len(local) == len(remote)
        assert du.done() <= limit
        checks += 1

# Resume from a state after some batches, with another world size and
# batch size: the rest of the epoch exactly.
e = epochs[0]
c = cache_dir()
first = clipshard.Loader(url, e, rank=0, world_size=2, batch_size=5, cache_dir=c, cache_limit=limit)
it = iter(first)
for _ in range(3):
    next(it)
st = first.state_dict()
first.close()
order = np.concatenate(rows(clipshard.EpochReader(edir, e, batch_size=1)))
rest = []
for rank in range(3):
    ld = clipshard.Loader(url, e, rank=rank, world_size=3, batch_size=4, cache_dir=c, cache_limit=limit)
    ld.load_state_dict(st)
    rest.append(rows(ld))
got = np.concatenate([b for batches in zip(*rest) for b in batches])
lo = st["consumed"]
assert np.array_equal(got, order[lo: lo + len(got)]) and len(order) - lo - len(got) < 12, ("resume", lo, len(got), len(order))
checks += 1

# A server that checks If-Match on one version and sends the next (versitygw
# 1.8 when a PUT replaces the object between its ETag lookup and its open):
# each GET of race.json first writes the next version, and asks without
# If-Match. read_all reads again until its bytes are of the version whose
# ETag it returns; always so: a ValueError naming the object; bytes whose
# recorded sha256 is wrong for good (damaged where stored): returned.
rb = _bucket.Bucket(url + "-race")
real = rb._client.get()


def put_version(v, sha=None):
    real.put_object(Bucket=rb.bucket, Key=rb.key("race.json"), Body=v,
                    Metadata={"sha256": sha or hashlib.sha256(v).hexdigest()})


class Racing:
    def __init__(self):
        self.versions = []

    def __getattr__(self, k):
        return getattr(real, k)

    def get_object(self, **kw):
        if kw["Key"].endswith("race.json") and self.versions:
            put_version(self.versions.pop(0))
            kw.pop("IfMatch", None)
        return real.get_object(**kw)


racing = Racing()
rb._client._c = racing
version = lambda k: b'{"version": 1, "epochs": [0, %d]}' % k  # noqa: E731
put_version(version(1))
for name, versions, want in (("same size", [version(2), version(3)], version(3)),
                             ("longer", [b'{"version": 1, "epochs": [0, 1, 2, 3]}'], b'{"version": 1, "epochs": [0, 1, 2, 3]}')):
    racing.versions = list(versions)
    got, etag = rb.read_all("race.json")
    now = real.head_object(Bucket=rb.bucket, Key=rb.key("race.json"))
    assert got == want and etag == now["ETag"].strip('"') and not racing.versions, (name, got, etag, now["ETag"])
put_version(version(1))
racing.versions = [version(k % 10) for k in range(40)]
try:
    rb.read_all("race.json")
    raise AssertionError("read_all took bytes of another version than its ETag's, every time")
except ValueError as err:
    assert "race.json" in str(err) and "replaced while read" in str(err), err
racing.versions = []
put_version(version(4), sha="ab" * 32)
got, etag = rb.read_all("race.json")
assert got == version(4) and etag == real.head_object(Bucket=rb.bucket, Key=rb.key("race.json"))["ETag"].strip('"'), (got, etag)
checks += 1

try:
    import torch
    import torch.utils.data
    import clipshard.torch as ct
except ImportError:
    torch = None
if torch is not None:
    for workers in (0, 2):
        c = cache_dir()
        ds = ct.EpochDataset(url, e, batch_size=5, cache_dir=c, cache_limit=limit)
        got = [b["samples"].numpy().copy() for b in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)]
        want = rows(clipshard.EpochReader(edir, e, batch_size=5))
        assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want)), ("EpochDataset", workers)
        checks += 1
    # pickled into spawned workers: each opens the bucket and the cache again
    from spawned import spawned
    ds = ct.EpochDataset(url, e, batch_size=5, cache_dir=cache_dir(), cache_limit=limit)
    got, err = spawned(ds, 2)
    assert got is not None, err
    got = [b["samples"].numpy() for b in got]
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want)), "EpochDataset spawn"
    checks += 1
    c = cache_dir()
    a = [b for b in ct.Loader(edir, e, batch_size=6, dtype=torch.float32)]
    b = [b for b in ct.Loader(url, e, batch_size=6, dtype=torch.float32, cache_dir=c, cache_limit=limit)]
    assert len(a) == len(b) and all(torch.equal(x["samples"], y["samples"]) for x, y in zip(a, b))
    checks += 1

# R ranks (processes) on one node, one cache: each shard file fetched once.
epoch_bytes = sum(os.path.getsize(os.path.join(edir, f)) for s in man["epochs"][0]["shards"] for f in s["files"].values())
code = r'''
import sys, json
sys.path.insert(0, %r)
import clipshard
rank, R, url, c, limit = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
r = clipshard.EpochReader(url, %d, rank=rank, world_size=R, batch_size=3, cache_dir=c, cache_limit=limit)
for b in r:
    pass
print(json.dumps({"bytes": r.files.remote.fetched}))
''' % (os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"), e)
ratios = []
for R in (2, 4):
    c = cache_dir()
    big = max(limit, 64 * group)  # room for the whole epoch: egress, not eviction, is measured here
    ps = [subprocess.Popen([sys.executable, "-c", code, str(r), str(R), url, c, str(big)], stdout=subprocess.PIPE, text=True) for r in range(R)]
    got = 0
    for p in ps:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
        got += json.loads(out.strip().splitlines()[-1])["bytes"]
    ratios.append(got / epoch_bytes)
    assert 0.9 <= got / epoch_bytes <= 1.1, ("egress", R, got, epoch_bytes)  # (a dropped remainder may leave the last shard unread)
    checks += 1

# A cache folder of the user's own files: refused, untouched.
mine = os.path.join(root, "mine")
os.makedirs(mine, exist_ok=True)
with open(os.path.join(mine, "notes.txt"), "w") as f:
    f.write("the user's")
try:
    clipshard.EpochReader(url, e, cache_dir=mine, cache_limit=limit)
    raise SystemExit("a cache folder of the user's files was taken")
except ValueError as err:
    assert "not a clipshard cache" in str(err), err
assert os.listdir(mine) == ["notes.txt"]
try:
    clipshard.EpochReader(url, e, cache_dir=cache_dir(), cache_limit=group)
    raise SystemExit("a cache_limit below the read-ahead was taken")
except ValueError as err:
    assert "too small" in str(err), err
checks += 2

# Readers starting at once on an empty cache folder (ranks, workers) all
# take it as a cache, whoever made its mark (the old mark's race refused
# about 1 start in 160: CI runs 160; 16 by default).
for trial in range(20 if EXHAUSTIVE else 2):
    c = cache_dir()
    code = "import sys; sys.path.insert(0, %r); from clipshard import _cache; _cache.Cache(%r, 1 << 30)" % (
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"), c)
    ps = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True) for _ in range(8)]
    for p in ps:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, ("readers starting at once refused a new cache folder", err)
checks += 1

# A BLOCKSUMS that is not what push writes: refused, naming it.
b = _bucket.Bucket(url)
rel = "epoch-%04d/BLOCKSUMS" % e
size, etag = b.head(rel)
good = b.range(rel, 0, size, etag)
head, _, digests = good.partition(b"\n")
h = json.loads(head)


def variant(**kw):
    v = dict(h, **kw)
    return json.dumps(v).encode() + b"\n" + digests


bad_ones = {
    "not JSON": b"{" + good,
    "no header line": good.replace(b"\n", b" "),
    "another format": variant(format="x"),
    "a block not a power of two": variant(block=65537),
    "names unsorted": variant(files=list(reversed(h["files"]))) if len(h["files"]) > 1 else variant(files=[]),
    "a digest flipped": head + b"\n" + bytes([digests[0] ^ 1]) + digests[1:],
    "digests short": head + b"\n" + digests[:-1],
    "a size that is not an int": variant(files=[dict(h["files"][0], size="1")] + h["files"][1:]),
    "an extra key": variant(extra=1),
}
for what, blob in bad_ones.items():
    try:
        _bucket.BlockSums(blob, "s3://x/" + rel)
        raise SystemExit("a BLOCKSUMS with %s was taken" % what)
    except ValueError as err:
        assert ("s3://x/" + rel + ": ") in str(err), (what, err)
# Random damage (bytes changed, cut, doubled): parsed, or a ValueError
# naming it; nothing else.
rng = np.random.default_rng(7)
for _ in range(500):
    blob = bytearray(good)
    for _ in range(int(rng.integers(1, 4))):
        i = int(rng.integers(0, len(blob)))
        op = int(rng.integers(0, 3))
        if op == 0:
            blob[i] = int(rng.integers(0, 256))
        elif op == 1:
            del blob[i:]
        else:
            blob[i:i] = blob[i: i + int(rng.integers(1, 64))]
    try:
        _bucket.BlockSums(bytes(blob), "s3://x/" + rel)
    except ValueError as err:
        assert ("s3://x/" + rel + ": ") in str(err), err
# In the bucket: one that records another sha256 for a file than
# SHA256SUMS (a stale one: the folder pushed again another way) raises,
# naming it; restored after.
stale = variant(files=[dict(h["files"][0], sha256="0" * 64)] + h["files"][1:])
client = b._client.get()
client.put_object(Bucket=b.bucket, Key=b.key(rel), Body=stale)
try:
    list(clipshard.EpochReader(url, e, rank=0, world_size=2, batch_size=5, cache_dir=cache_dir(), cache_limit=limit))
    raise SystemExit("a stale BLOCKSUMS was taken")
except ValueError as err:
    assert rel + ": records sha256" in str(err) and "another version" in str(err), err
finally:
    client.put_object(Bucket=b.bucket, Key=b.key(rel), Body=good)
checks += len(bad_ones) + 1

# The read-ahead's pieces: a file's range cut on block bounds into pieces
# of at most PIECE bytes, in order, covering it once (the fetch threads
# take them as each is free); a head stays one request.
rm = _remote.Remote(url, cache_dir(), limit)
files0 = man["epochs"][0]["shards"][0]["files"]
sums = rm.block_sums(files0["samples"])
K = sums.block
step = max(1, _bucket.PIECE // K) * K
for rel in files0.values():
    size = sums.files[rel][0]
    for lo, hi in ((0, None), (5, max(6, size - 3)), (K + 1, None)):
        if lo >= size:
            continue
        got = list(rm.ahead._pieces([(rel, lo, hi)]))
        end = size if hi is None else min(hi, size)
        assert got[0][1] == lo and (got[-1][2] or size) == end, (rel, lo, hi, got)
        for (r1, a1, b1), (r2, a2, b2) in zip(got, got[1:]):
            assert r1 == r2 == rel and b1 == a2 and a2 % K == 0, got
        assert all((b or size) - a <= step and (b or size) > a for _, a, b in got), got
        checks += 1
    assert list(rm.ahead._pieces([(rel, 0, -1)])) == [(rel, 0, -1)]
# The ledger: written in place, a torn one is not trusted (a walk).
with open(os.path.join(rm.cache.path, _cache.LEDGER), "wb") as f:
    f.write(b"x" * 200)  # (torn, and longer than one: cut to its size)
rm.cache.record(12345, walk=False)
assert os.path.getsize(os.path.join(rm.cache.path, _cache.LEDGER)) == _cache.LEDGER_BYTES
assert rm.cache.counted() is None  # (walked 0: never)
rm.cache.record(12345)
assert rm.cache.counted() == 12345
with open(os.path.join(rm.cache.path, _cache.LEDGER), "r+b") as f:
    f.write(b'{"usage": 1\0\0')  # (damaged)
assert rm.cache.counted() is None
# A symlink or a FIFO planted as the ledger: never followed, opened for
# long or written; the cache refused, naming it.
led = os.path.join(rm.cache.path, _cache.LEDGER)
outside = os.path.join(root, "users-own-file")
with open(outside, "wb") as f:
    f.write(b"mine")
for plant in ("symlink", "fifo"):
    os.unlink(led)
    os.symlink(outside, led) if plant == "symlink" else os.mkfifo(led)
    assert rm.cache.counted() is None  # (and did not wait for a writer)
    try:
        rm.cache.record(1)
        raise SystemExit("a %s ledger was written" % plant)
    except ValueError as err:
        assert led in str(err) and "refusing to use this cache" in str(err), err
    with open(outside, "rb") as f:
        assert f.read() == b"mine", plant
os.unlink(led)
rm.close()
checks += 5
shutil.rmtree(root, ignore_errors=True)
print("ok: bucket %d checks; cache limit %d bytes (5 shard groups and the manifests, BLOCKSUMS); egress %s x the epoch's bytes for R = 2, 4 ranks sharing a cache%s"
      % (checks, limit, ", ".join("%.3f" % r for r in ratios), "" if torch is not None else " (no torch: its readers not checked)"))
