"""Epochs in an S3-compatible bucket (clipshard push), read through a
bounded node-local cache.

The bucket holds the epochs folder's files under their own names. A
reader fetches epochs.json and SHA256SUMS, and then each shard file it
reaches (and the next ones, ahead of it) whole into the cache:

    cache_dir/CLIPSHARD-CACHE                 the mark of a cache folder
    cache_dir/<key>/epochs.json, SHA256SUMS   key: the bucket URL and the
    cache_dir/<key>/epoch-0003/shard-...npy     sha256 of its epochs.json

- One fetch per node: ranks and DataLoader workers sharing cache_dir
  share its entries. Whoever holds a file's lock (flock of NAME.lock in the
  cache) fetches it; the others wait for the final name (the rename is the
  signal); a fetcher that dies releases its lock and another takes over.
  No shared memory.
- Fetched safely: bounded ranged GETs (never an open-ended range) of the
  version listed (If-Match its ETag: an object replaced meanwhile raises,
  naming it) into NAME.tmp.PID, checked against SHA256SUMS, then renamed.
  Resets, short bodies and stalls are retried with jittered backoff,
  resuming by Range; 503 SlowDown too (botocore's adaptive retries).
- Bounded: the cache never holds more than cache_limit bytes (temporary
  files counted): before a fetch, entries no local reader is at or
  reading ahead to are evicted; a limit too small for the read-ahead is
  refused at the start. Nothing outside cache_dir is ever deleted, and a
  folder that holds anything but cache entries is refused. Entries are
  keyed by exact identity, so two jobs (or users) may share a cache and
  versions never mix; deleting the cache is always safe.

The client is boto3 (the clipshard[s3] extra), made per process (after
a fork), with adaptive retries and request checksums only where required
(a non-AWS server is not sent CRC headers it may refuse). Credentials and
endpoint the standard way (AWS_* variables, ~/.aws/credentials,
AWS_ENDPOINT_URL).
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import random
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional, Union

MARK = "CLIPSHARD-CACHE"
# Files a process fetches at once: CLIPSHARD_S3_FETCHERS, else one a core
# up to 4 (on this 2-core box, with the server on it too, 2 beat 4: 0.67x
# the floor against 0.56x; docs/BENCHMARKS.md).
FETCHERS = int(os.environ.get("CLIPSHARD_S3_FETCHERS", min(4, os.cpu_count() or 2)))
PIECE = int(os.environ.get("CLIPSHARD_S3_PIECE", 8 << 20))  # bytes of one ranged GET (the tests make it small)
MAX_MANIFEST = 256 << 20


def is_url(s: Any) -> bool:
    return isinstance(s, str) and s.startswith("s3://")


def parse_url(s: str) -> tuple[str, str]:
    """(bucket, prefix) of s3://BUCKET/PREFIX."""
    rest = s[len("s3://"):]
    b, _, p = rest.partition("/")
    p = p.strip("/")
    if not b or ".." in p.split("/") or "" in p.split("/")[:-1] and p:
        raise ValueError("%r: want s3://BUCKET/PREFIX" % s)
    return b, p


def size_of(s: Union[str, int]) -> int:
    """Bytes of "40GiB", "512MiB" or a number."""
    if isinstance(s, int):
        return s
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]i?B?|B)?\s*", str(s))
    if not m:
        raise ValueError("cache_limit %r: want bytes or a size such as 40GiB" % (s,))
    mult = {"": 1, "B": 1, "K": 1 << 10, "KiB": 1 << 10, "KB": 10**3, "M": 1 << 20, "MiB": 1 << 20, "MB": 10**6,
            "G": 1 << 30, "GiB": 1 << 30, "GB": 10**9, "T": 1 << 40, "TiB": 1 << 40, "TB": 10**12}.get(m.group(2) or "")
    if mult is None:
        raise ValueError("cache_limit %r: unknown unit" % (s,))
    return int(float(m.group(1)) * mult)


class _Client:
    """A boto3 S3 client, made again in a process other than the one
    that made it (a DataLoader worker after fork)."""

    def __init__(self) -> None:
        self._pid = -1
        self._c: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        with self._lock:
            if self._pid != os.getpid():
                try:
                    import boto3
                    from botocore.config import Config
                except ImportError:
                    raise ValueError("reading s3:// needs boto3: pip install 'clipshard[s3]' (or pip install boto3)") from None
                # A stalled body is given up after CLIPSHARD_S3_READ_TIMEOUT
                # seconds (default 30) and the range read again.
                timeout = float(os.environ.get("CLIPSHARD_S3_READ_TIMEOUT", "30"))
                kw: dict[str, Any] = dict(retries={"mode": "adaptive", "max_attempts": 10}, connect_timeout=10, read_timeout=timeout,
                                          s3={"addressing_style": "path"} if os.environ.get("AWS_ENDPOINT_URL") else {})
                try:
                    cfg = Config(request_checksum_calculation="when_required", response_checksum_validation="when_required", **kw)
                except TypeError:  # botocore before 1.36: it sends no checksum headers of its own
                    cfg = Config(**kw)
                ep = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
                self._c = boto3.session.Session().client("s3", endpoint_url=ep, config=cfg)
                self._pid = os.getpid()
            return self._c


def _code(e: Exception) -> str:
    r = getattr(e, "response", None)
    if isinstance(r, dict):
        return str(r.get("Error", {}).get("Code", "")) or str(r.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return ""


class Bucket:
    """Reads of one bucket folder; errors name the objects (s3://...)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.bucket, self.prefix = parse_url(url)
        self._client = _Client()
        self.gets = 0  # ranged GETs made
        self.bytes = 0  # bytes received

    def name(self, rel: str) -> str:
        return "%s/%s" % (self.url, rel)

    def key(self, rel: str) -> str:
        return "%s/%s" % (self.prefix, rel) if self.prefix else rel

    def list(self, rel_prefix: str) -> dict[str, tuple[int, str]]:
        """The objects under rel_prefix (a folder of the epochs folder),
        by their path relative to it: (size, ETag), one listing request a
        thousand of them rather than a HEAD each."""
        out: dict[str, tuple[int, str]] = {}
        prefix = self.key(rel_prefix)
        token: Optional[str] = None
        while True:
            kw: dict[str, Any] = dict(Bucket=self.bucket, Prefix=prefix)
            if token:
                kw["ContinuationToken"] = token
            try:
                r = self._client.get().list_objects_v2(**kw)
            except Exception as e:
                raise ValueError("%s: listing: %s" % (self.name(rel_prefix), e)) from None
            for o in r.get("Contents", []):
                key = str(o["Key"])
                rel = key[len(self.prefix) + 1:] if self.prefix else key
                out[rel] = (int(o["Size"]), str(o["ETag"]).strip('"'))
            if not r.get("IsTruncated"):
                return out
            token = r.get("NextContinuationToken")

    def head(self, rel: str) -> tuple[int, str]:
        try:
            r = self._client.get().head_object(Bucket=self.bucket, Key=self.key(rel))
        except Exception as e:
            if _code(e) in ("404", "NoSuchKey", "NotFound"):
                raise FileNotFoundError("%s: no such object" % self.name(rel)) from None
            raise ValueError("%s: %s" % (self.name(rel), e)) from None
        return int(r["ContentLength"]), str(r["ETag"]).strip('"')

    def read_all(self, rel: str, limit: int = MAX_MANIFEST) -> tuple[bytes, str]:
        """A small object whole (a manifest), with its ETag."""
        size, etag = self.head(rel)
        if size > limit:
            raise ValueError("%s: %d bytes, more than a manifest may have (%d)" % (self.name(rel), size, limit))
        return self.range(rel, 0, size, etag), etag

    def range(self, rel: str, off: int, n: int, etag: str, tries: int = 8) -> bytes:
        """Bytes [off, off+n) of the version etag of rel, by bounded ranged
        GETs of at most PIECE bytes; a reset, a short body or a stall is
        retried from where it stopped (jittered backoff); a replaced
        object (412) raises, naming it."""
        out = bytearray()
        fails = 0
        while len(out) < n:
            a = off + len(out)
            b = min(off + n, a + PIECE) - 1
            try:
                self.gets += 1
                r = self._client.get().get_object(Bucket=self.bucket, Key=self.key(rel), Range="bytes=%d-%d" % (a, b), IfMatch='"%s"' % etag)
                body = r["Body"]
                try:
                    while True:
                        chunk = body.read(1 << 20)
                        if not chunk:
                            break
                        out += chunk
                        self.bytes += len(chunk)
                        if len(out) > n:
                            raise ValueError("%s: the server sent more than bytes %d..%d" % (self.name(rel), a, b))
                finally:
                    body.close()
                if len(out) < b + 1 - off:
                    raise ConnectionError("short body: %d of %d bytes" % (len(out) - (a - off), b + 1 - a))
                fails = 0
            except Exception as e:
                code = _code(e)
                if code in ("412", "PreconditionFailed"):
                    raise ValueError("%s: replaced while it was being read (its ETag is no longer %s): refusing to mix two versions"
                                     % (self.name(rel), etag)) from None
                if code in ("404", "NoSuchKey"):
                    raise ValueError("%s: gone while it was being read" % self.name(rel)) from None
                if isinstance(e, ValueError) and not isinstance(e, ConnectionError):
                    raise
                fails += 1
                if fails > tries:
                    raise ValueError("%s: bytes %d..%d: %d tries failed, the last: %s" % (self.name(rel), a, b, fails, e)) from None
                time.sleep(min(2.0, 0.05 * 2 ** fails) * (0.5 + random.random()))
        return bytes(out)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Cache:
    """A node-local cache folder of bucket folders' files (see the module
    doc). Safe for several processes (ranks, workers) at once."""

    def __init__(self, path: str, limit: Union[str, int]) -> None:
        self.path = os.path.abspath(path)
        self.limit = size_of(limit)
        if self.limit <= 0:
            raise ValueError("cache_limit %r: want a size > 0" % (limit,))
        os.makedirs(self.path, exist_ok=True)
        mark = os.path.join(self.path, MARK)
        if not os.path.exists(mark):
            others = [n for n in os.listdir(self.path)]
            if others:
                raise ValueError("%s: not a clipshard cache (it holds %s, and no %s): give an empty or new folder, "
                                 "never a folder of your own files (a cache deletes what it evicts)" % (self.path, sorted(others)[:5], MARK))
            with open(mark, "w") as f:
                f.write("clipshard cache: every file here may be deleted at any time\n")
        for n in os.listdir(self.path):
            if n != MARK and not re.fullmatch(r"[0-9a-f]{32}", n):
                raise ValueError("%s: holds %r, which is not a cache entry: refusing to use it as a cache" % (self.path, n))

    def usage(self) -> int:
        """The bytes the cache takes on disk, as du counts them (at least
        each file's size rounded up to a 4 KiB block)."""
        total = 0
        for root, _, names in os.walk(self.path):
            for n in names:
                try:
                    total += disk_bytes(os.lstat(os.path.join(root, n)))
                except FileNotFoundError:
                    pass
        return total


def blocks(n: int) -> int:
    """What a file of n bytes may take on disk: n rounded up to whole 4
    KiB blocks, and one more (ext4 may allocate one past the end)."""
    return -(-n // 4096) * 4096 + 4096


def disk_bytes(st: os.stat_result) -> int:
    """What a file takes on disk, or may once written: its allocated
    blocks, or its size in whole blocks if more."""
    return max(blocks(st.st_size) if st.st_size else 0, st.st_blocks * 512)


class Remote:
    """One bucket epochs folder seen through a Cache: root is the local
    folder of its entries (epochs.json, SHA256SUMS, and the shard files as
    they are fetched)."""

    def __init__(self, url: str, cache_dir: Optional[str], cache_limit: Union[str, int, None]) -> None:
        if cache_dir is None or cache_limit is None:
            raise ValueError("%s: reading a bucket needs cache_dir= and cache_limit= (a node-local folder, and its bound, "
                             "e.g. cache_limit='40GiB')" % url)
        self.bucket = Bucket(url)
        self.cache = Cache(cache_dir, cache_limit)
        man, self.etag = self.bucket.read_all("epochs.json")
        self.key = hashlib.sha256(self.bucket.url.encode() + b"\0" + man).hexdigest()[:32]
        self.root = os.path.join(self.cache.path, self.key)
        os.makedirs(self.root, exist_ok=True)
        self._put("epochs.json", man)
        sums, _ = self.bucket.read_all("SHA256SUMS")
        self.sums = {}
        for line in sums.decode("utf-8", "replace").splitlines():
            h, _, n = line.partition("  ")
            if len(h) == 64 and n:
                self.sums[n] = h
        self._put("SHA256SUMS", sums)
        self.manifest_bytes = blocks(len(man)) + blocks(len(sums)) + 4 * 4096  # with the mark's and positions' files
        self.objects: dict[str, tuple[int, str]] = {}  # rel -> (size, etag), as first seen
        self.fetched = 0  # bytes of shard files this process fetched into the cache
        self._listed: set[str] = set()  # folders whose objects were listed
        self._lock = threading.Lock()
        self._ahead: dict[str, Future[None]] = {}
        self._pool_pid = -1
        self._executor: Optional[ThreadPoolExecutor] = None
        self.window: list[list[str]] = []  # this reader's shard groups, from where it is on
        self._pos_file = os.path.join(self.root, ".pos-%d-%d" % (os.getpid(), id(self)))

    def _put(self, rel: str, b: bytes) -> None:
        p = os.path.join(self.root, rel)
        if os.path.exists(p):
            with open(p, "rb") as f:
                if f.read() == b:
                    return
        tmp = "%s.tmp.%d.%d" % (p, os.getpid(), random.getrandbits(32))
        with open(tmp, "wb") as f:
            f.write(b)
        os.replace(tmp, p)

    def check_current(self) -> bytes:
        """epochs.json as the bucket holds it now."""
        b, _ = self.bucket.read_all("epochs.json")
        return b

    # -- fetching ------------------------------------------------------------

    def local(self, rel: str) -> str:
        return os.path.join(self.root, *rel.split("/"))

    def ensure(self, rel: str) -> str:
        """The local path of shard file rel, fetched (once per node) and
        checked against SHA256SUMS if it is not in the cache."""
        p = self.local(rel)
        if os.path.exists(p):
            return p
        t = self._ahead.get(rel)
        if t is not None and self._pool_pid == os.getpid():
            t.result()
            if os.path.exists(p):
                return p
        self._fetch(rel)
        return p

    def _fetch(self, rel: str) -> None:
        p = self.local(rel)
        want = self.sums.get(rel)
        if want is None:
            raise ValueError("%s: SHA256SUMS does not list it: its bytes cannot be checked" % self.bucket.name(rel))
        os.makedirs(os.path.dirname(p), exist_ok=True)
        lock = os.open(p + ".lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process fetching it: wait for its rename (or its death)
            if os.path.exists(p):
                return
            # The lock is ours: what a fetcher of it left when it died goes.
            d, base = os.path.split(p)
            for n in os.listdir(d):
                if n.startswith(base + ".tmp."):
                    pid = n[len(base) + 5:].split(".")[0]
                    if pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))):
                        try:
                            os.unlink(os.path.join(d, n))
                        except FileNotFoundError:
                            pass
            with self._lock:
                obj = self.objects.get(rel)
                folder = rel.rsplit("/", 1)[0] + "/" if "/" in rel else ""
                listed = folder in self._listed
            if obj is None and not listed:
                got = self.bucket.list(folder)  # the epoch folder's objects at once
                with self._lock:
                    self._listed.add(folder)
                    for k, v in got.items():
                        self.objects.setdefault(k, v)
                    obj = self.objects.get(rel)
            if obj is None:
                obj = self.bucket.head(rel)
                with self._lock:
                    self.objects[rel] = obj
            size, etag = obj
            tmp = "%s.tmp.%d.%d" % (p, os.getpid(), random.getrandbits(32))
            # Room is made, and taken (the temporary file at its full size),
            # under the cache's lock: fetchers of other processes at once
            # stay under the limit together.
            room = os.open(os.path.join(self.cache.path, MARK), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                fcntl.flock(room, fcntl.LOCK_EX)
                self._make_room(blocks(size))
                with open(tmp, "wb") as f:
                    f.truncate(size)
            finally:
                fcntl.flock(room, fcntl.LOCK_UN)
                os.close(room)
            try:
                h = hashlib.sha256()
                with open(tmp, "r+b") as f:
                    off = 0
                    while off < size:
                        b = self.bucket.range(rel, off, min(PIECE, size - off), etag)
                        f.write(b)
                        h.update(b)
                        off += len(b)
                if h.hexdigest() != want:
                    raise ValueError("%s: its bytes (sha256 %s) are not those SHA256SUMS records (%s): refusing them"
                                     % (self.bucket.name(rel), h.hexdigest(), want))
                os.replace(tmp, p)
                self.fetched += size
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            os.close(lock)

    def read_ahead(self, groups: list[list[str]]) -> None:
        """Fetch these shard groups (the next ones the reader reaches) in
        the background, FETCHERS files at once, in order."""
        todo = [rel for g in groups for rel in g if not os.path.exists(self.local(rel)) and rel not in self._ahead]
        if not todo:
            return
        pool = self._pool()
        for rel in todo:
            self._ahead[rel] = pool.submit(self._quiet_fetch, rel)

    def _quiet_fetch(self, rel: str) -> None:
        try:
            self._fetch(rel)
        except Exception:
            pass  # the reader fetches it itself, and raises

    def _pool(self) -> ThreadPoolExecutor:
        """The fetch threads of this process (made again after a fork)."""
        if self._executor is None or self._pool_pid != os.getpid():
            self._executor = ThreadPoolExecutor(FETCHERS, thread_name_prefix="clipshard-fetch")
            self._pool_pid = os.getpid()
            self._ahead = {}
        return self._executor

    # -- the bound -------------------------------------------------------------

    def at(self, reading: list[str], ahead: list[str]) -> None:
        """This reader is at these files (its current shard group) and
        reads ahead to those: published for the other local readers'
        eviction (what one reads is never evicted; what it reads ahead to
        only when nothing else can go)."""
        body = json.dumps({"pid": os.getpid(), "reading": reading, "ahead": ahead})
        tmp = self._pos_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(body)
        os.replace(tmp, self._pos_file)

    def kept(self) -> tuple[set[str], set[str]]:
        """The files live local readers are at, and those they read ahead
        to (of every version in the cache)."""
        keep: set[str] = set()
        ahead: set[str] = set()
        for key in os.listdir(self.cache.path):
            d = os.path.join(self.cache.path, key)
            if not os.path.isdir(d):
                continue
            for n in os.listdir(d):
                if not n.startswith(".pos-") or n.endswith(".tmp"):
                    continue
                try:
                    pid = int(n.split("-")[1])
                    with open(os.path.join(d, n)) as f:
                        v = json.load(f)
                except (ValueError, OSError):
                    continue
                if not _alive(pid):
                    try:
                        os.unlink(os.path.join(d, n))
                    except OSError:
                        pass
                    continue
                keep.update(os.path.join(d, *r.split("/")) for r in v.get("reading", []))
                ahead.update(os.path.join(d, *r.split("/")) for r in v.get("ahead", []))
        return keep, ahead - keep

    def _make_room(self, need: int) -> None:
        """Evict shard files no live local reader keeps until need more
        bytes fit under the limit (temporary files counted); wait a while
        for readers to move on if they do not."""
        deadline = time.monotonic() + 60
        while True:
            used = self.cache.usage()
            if used + need <= self.cache.limit:
                return
            keep, ahead = self.kept()
            victims = []
            for root, _, names in os.walk(self.cache.path):
                for n in names:
                    p = os.path.join(root, n)
                    if n.endswith(".npy") and p not in keep:
                        try:
                            # What no reader needs first, oldest first; then
                            # what readers read ahead to, farthest first.
                            victims.append((p in ahead, -os.stat(p).st_mtime if p in ahead else os.stat(p).st_mtime, p))
                        except FileNotFoundError:
                            pass
                    elif ".tmp." in n:
                        pid = n.split(".tmp.")[1].split(".")[0]
                        if pid.isdigit() and not _alive(int(pid)):
                            os.unlink(p)  # a dead fetcher's
            victims.sort()
            for _, _, p in victims:
                if used + need <= self.cache.limit:
                    return
                try:
                    size = disk_bytes(os.stat(p))
                    os.unlink(p)
                    used -= size
                except FileNotFoundError:
                    pass
            if used + need <= self.cache.limit:
                return
            if time.monotonic() > deadline:
                raise ValueError("%s: %d bytes in use of cache_limit %d, and the local readers keep all of it: raise cache_limit"
                                 % (self.cache.path, used, self.cache.limit))
            time.sleep(0.05)

    def close(self) -> None:
        try:
            os.unlink(self._pos_file)
        except OSError:
            pass
