"""Epochs in an S3-compatible bucket (clipshard push), read through a
bounded node-local cache.

The bucket holds the epochs folder's files under their own names, and
(written by push) each epoch folder's BLOCKSUMS: the sha256 of every
block (64 KiB or more) of its shard files. A reader fetches epochs.json
and SHA256SUMS, then what it reads of each shard file into the cache:

    cache_dir/CLIPSHARD-CACHE                  the mark of a cache folder
    cache_dir/<key>/epochs.json, SHA256SUMS    key: the bucket URL and the
    cache_dir/<key>/.boot                        sha256 of its epochs.json
    cache_dir/<key>/epoch-0003/BLOCKSUMS
    cache_dir/<key>/epoch-0003/shard-...npy    the file, at its full size
    cache_dir/<key>/epoch-0003/shard-...npy.have  a byte a block: 1 = fetched, checked

- Egress: with BLOCKSUMS, a file is fetched a block range at a time: a
  rank of several fetches only the blocks its own slices of each batch
  touch (its node's slices, with LOCAL_WORLD_SIZE: the ranks of a node
  take consecutive slices), so the ranks of a cluster fetch the epoch's
  bytes about once, plus a block at the ends of each slice. Whole files
  (the same blocks, in GETs of up to 8 MiB) when that is cheaper: one
  rank, every rank on this node, or mixing (mix_shards: a rank's samples
  lie all over each shard). Without BLOCKSUMS (a folder uploaded another
  way) whole files, checked against SHA256SUMS.
- One fetch per node: ranks and DataLoader workers sharing cache_dir
  share its entries. A block range is fetched by whoever holds its lock
  (an open-file-description lock on that range of NAME.have: per open
  file, so threads and processes alike; a holder that dies releases it);
  the others wait and find the blocks marked. A whole file without
  BLOCKSUMS: flock of NAME.lock, rename the signal. No shared memory.
- Fetched safely: bounded ranged GETs (never an open-ended range) of the
  version listed (If-Match its ETag: an object replaced meanwhile raises,
  naming it); every block checked against BLOCKSUMS before it is marked
  (a whole file against SHA256SUMS before it is renamed). Resets, short
  bodies and stalls are retried with jittered backoff, resuming by
  Range; 503 SlowDown too (botocore's adaptive retries). The marks are
  trusted within one boot of the machine (.boot): after a restart an
  entry's files are fetched again.
- Bounded: the cache never holds more than cache_limit bytes, as du
  counts them: room is made, and taken (posix_fallocate of the blocks to
  fetch), under flock of the mark, evicting files no local reader is at
  or reading ahead to (then what they read ahead to); a limit too small
  for the read-ahead is refused at the start. Nothing outside cache_dir
  is ever deleted, and a folder that holds anything but cache entries is
  refused. Entries are keyed by exact identity, so two jobs (or users)
  may share a cache and versions never mix; deleting the cache is always
  safe.

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
import stat
import struct
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterable, Iterator, Optional, Union

from ._files import kind_of

MARK = "CLIPSHARD-CACHE"
LEDGER = ".usage"  # the cache's usage as last counted (Cache.counted)
LEDGER_AGE = 2.0  # seconds a count is trusted before the cache is walked again
LEDGER_BYTES = 96  # the ledger's size: its JSON, padded with spaces
BLOCKSUMS = "BLOCKSUMS"
# Threads of a process that fetch at once (each a GET in flight, its
# blocks hashed and written as they come): CLIPSHARD_S3_FETCHERS, default
# 4, for a server elsewhere, whose GETs wait on the network (on the 2-core
# box of docs/BENCHMARKS.md, the server on the same cores and every fetch
# thread kept busy, 2 did best: 399 MiB/s cold against 376 with 4, 338
# with 6, less CPU a MiB; before the pieces were queued, 4 did: 804
# against 724).
FETCHERS = max(1, int(os.environ.get("CLIPSHARD_S3_FETCHERS", 4)))
PIECE = int(os.environ.get("CLIPSHARD_S3_PIECE", 8 << 20))  # bytes of one ranged GET at most (the tests make it small)
CHUNK = 1 << 20  # bytes of a body read at once
MAX_MANIFEST = 256 << 20
MAX_DIGESTS = 32 << 20  # bytes of digests a BLOCKSUMS may hold (as push bounds them)
HEAD = 4096  # a file's head (its .npy header), which BLOCKSUMS hashes apart
SLACK = 256 << 10  # kept free under the limit: readers' position files, the extent blocks of sparse files
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


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


MAX_LIMIT = 1 << 60  # bytes a cache_limit may say at most (an exbibyte)


def size_of(s: Union[str, int]) -> int:
    """Bytes of "40GiB", "512MiB", "1.5TB" or a number (ValueError, naming
    cache_limit, for anything else)."""
    if isinstance(s, bool) or not isinstance(s, (str, int)):
        raise ValueError("cache_limit %r: want bytes (an int) or a size such as '40GiB'" % (s,))
    if isinstance(s, int):
        n = s
    else:
        m = re.fullmatch(r"\s*([0-9]{1,19})(?:\.([0-9]{1,9}))?\s*([KMGT]i?B?|B)?\s*", s)
        if not m:
            raise ValueError("cache_limit %r: want bytes or a size such as '40GiB' (digits, an optional fraction, a unit "
                             "B, K, KiB, KB, M, MiB, MB, G, GiB, GB, T, TiB or TB)" % (s[:80],))
        mult = {"": 1, "B": 1, "K": 1 << 10, "KiB": 1 << 10, "KB": 10**3, "M": 1 << 20, "MiB": 1 << 20, "MB": 10**6,
                "G": 1 << 30, "GiB": 1 << 30, "GB": 10**9, "T": 1 << 40, "TiB": 1 << 40, "TB": 10**12}.get(m.group(3) or "")
        if mult is None:
            raise ValueError("cache_limit %r: unknown unit %r (want B, KiB, MiB, GiB, TiB or KB, MB, GB, TB)" % (s[:80], m.group(3)))
        frac = m.group(2) or ""
        n = (int(m.group(1)) * 10**len(frac) + int(frac or 0)) * mult // 10**len(frac)  # (exact: no float)
    if n > MAX_LIMIT:
        raise ValueError("cache_limit %r: more than %d bytes (an exbibyte): want the bytes the cache's disk may take" % (
            s if isinstance(s, int) else s[:80], MAX_LIMIT))
    return n


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
                                          max_pool_connections=max(10, 2 * FETCHERS),
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
        size, etag, _ = self._head(rel)
        return size, etag

    def _head(self, rel: str) -> tuple[int, str, Optional[str]]:
        """(size, ETag, the sha256 push recorded or None)."""
        try:
            r = self._client.get().head_object(Bucket=self.bucket, Key=self.key(rel))
        except Exception as e:
            if _code(e) in ("404", "NoSuchKey", "NotFound"):
                raise FileNotFoundError("%s: no such object" % self.name(rel)) from None
            raise ValueError("%s: %s" % (self.name(rel), e)) from None
        sha = (r.get("Metadata") or {}).get("sha256")
        return int(r["ContentLength"]), str(r["ETag"]).strip('"'), str(sha) if sha else None

    def read_all(self, rel: str, limit: int = MAX_MANIFEST) -> tuple[bytes, str]:
        """A small object whole (a manifest), with its ETag: the bytes of
        that version. A server may check If-Match on one version and send
        the next (versitygw 1.8 when a PUT replaces the object meanwhile):
        bytes whose sha256 is not the one push recorded are read again if
        the object is now another version; if it is not (damaged where it
        is stored), they are returned for the caller's checks."""
        for _ in range(8):
            size, etag, sha = self._head(rel)
            if size > limit:
                raise ValueError("%s: %d bytes, more than a manifest may have (%d)" % (self.name(rel), size, limit))
            b = self.range(rel, 0, size, etag)
            if sha is None or hashlib.sha256(b).hexdigest() == sha:
                return b, etag
            now = self._head(rel)
            if now[:2] == (size, etag):
                return b, etag
            time.sleep(0.01 + 0.05 * random.random())
        raise ValueError("%s: replaced while read, 8 times (its bytes were of another version than its ETag's)" % self.name(rel))

    def range(self, rel: str, off: int, n: int, etag: str) -> bytes:
        """Bytes [off, off+n) of the version etag of rel (see stream)."""
        out = bytearray(n)
        view = memoryview(out)

        def put(at: int, chunk: bytes) -> None:
            view[at - off: at - off + len(chunk)] = chunk
        self.stream(rel, off, off + n, etag, put)
        return bytes(out)

    def stream(self, rel: str, lo: int, hi: int, etag: str, sink: Any, tries: int = 8) -> None:
        """Bytes [lo, hi) of the version etag of rel, handed to sink(offset,
        chunk) in order, chunks of CHUNK bytes (the last of a GET fewer),
        by bounded ranged GETs of at most PIECE bytes; a reset, a short
        body or a stall is retried from the first byte not yet handed over
        (jittered backoff); a replaced object (412) raises, naming it."""
        at, fails = lo, 0
        while at < hi:
            b = min(hi, at + PIECE) - 1
            try:
                self.gets += 1
                r = self._client.get().get_object(Bucket=self.bucket, Key=self.key(rel), Range="bytes=%d-%d" % (at, b), IfMatch='"%s"' % etag)
                body = r["Body"]
                try:
                    while at <= b:
                        chunk = body.read(min(CHUNK, b + 1 - at))
                        if not chunk:
                            break
                        if at + len(chunk) > b + 1:
                            raise ValueError("%s: the server sent more than bytes %d..%d" % (self.name(rel), at, b))
                        sink(at, chunk)
                        at += len(chunk)
                        self.bytes += len(chunk)
                finally:
                    body.close()
                if at < b + 1:
                    raise ConnectionError("short body: bytes %d..%d missing" % (at, b))
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
                    raise ValueError("%s: bytes %d..%d: %d tries failed, the last: %s" % (self.name(rel), at, b, fails, e)) from None
                time.sleep(min(2.0, 0.05 * 2 ** fails) * (0.5 + random.random()))


class BlockSums:
    """A BLOCKSUMS file, checked: the block size, and per file its size,
    sha256 and the sha256 of each block (docs/FORMAT.md)."""

    def __init__(self, b: bytes, name: str) -> None:
        def bad(what: str) -> ValueError:
            return ValueError("%s: %s" % (name, what))
        line, nl, digests = b.partition(b"\n")
        if not nl:
            raise bad("no header line")
        try:
            h = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:  # (RecursionError: nested too deep)
            raise bad("header: not JSON: %s" % e) from None
        if not isinstance(h, dict) or set(h) != {"format", "version", "block", "digests_sha256", "files"}:
            raise bad("header: want the keys format, version, block, digests_sha256, files")
        if h["format"] != "clipshard.blocksums" or h["version"] not in (1, 2) or type(h["version"]) is not int:
            raise bad("format %r version %r, want 'clipshard.blocksums' version 1 or 2 (a newer clipshard wrote it? upgrade)"
                      % (h["format"], h["version"]))
        # (version 2: each file's etag, the object version its push proved)
        keys = {"name", "size", "sha256", "head"} | ({"etag"} if h["version"] == 2 else set())
        block = h["block"]
        if type(block) is not int or not (64 << 10) <= block <= (64 << 20) or block & (block - 1):
            raise bad("block %r: want a power of two from 64 KiB to 64 MiB" % (block,))
        if not isinstance(h["files"], list):
            raise bad("files: not a list")
        self.block = block
        self.files: dict[str, tuple[int, str, int]] = {}  # name -> (size, sha256, index of its first digest)
        self.heads: dict[str, bytes] = {}  # name -> the sha256 of its first HEAD bytes
        at, last = 0, ""
        for f in h["files"]:
            if not isinstance(f, dict) or set(f) != keys:
                raise bad("a file entry %r: want %s" % (f, ", ".join(sorted(keys))))
            if "etag" in f and (not isinstance(f["etag"], str) or not re.fullmatch(r"[0-9A-Za-z-]{1,128}", f["etag"])):
                raise bad("file %r: etag %r" % (f.get("name"), f["etag"]))
            n, size, sha = f["name"], f["size"], f["sha256"]
            if not isinstance(n, str) or not n or n <= last:
                raise bad("file %r: names not sorted and unique" % (n,))
            if not isinstance(f["head"], str) or not re.fullmatch(r"[0-9a-f]{64}", f["head"]):
                raise bad("file %r: head %r" % (n, f["head"]))
            self.heads[n] = bytes.fromhex(f["head"])
            if type(size) is not int or not 0 <= size <= 1 << 50:
                raise bad("file %r: size %r" % (n, size))
            if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
                raise bad("file %r: sha256 %r" % (n, sha))
            self.files[n] = (size, sha, at)
            at += -(-size // block)
            last = n
            if at * 32 > MAX_DIGESTS:
                raise bad("more than %d bytes of digests" % MAX_DIGESTS)
        if len(digests) != at * 32:
            raise bad("%d bytes of digests, the sizes make %d" % (len(digests), at * 32))
        if hashlib.sha256(digests).hexdigest() != h["digests_sha256"]:
            raise bad("its digests' sha256 is not the recorded %r (damaged)" % (h["digests_sha256"],))
        self.digests = digests
        self.size = len(b)  # bytes of the file

    def digest(self, rel: str, i: int) -> bytes:
        return self.digests[(self.files[rel][2] + i) * 32: (self.files[rel][2] + i + 1) * 32]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _range_lock(fd: int, start: int, length: int, kind: int) -> None:
    """An open-file-description lock (Linux) on bytes [start, start+length)
    of fd: F_WRLCK waits for it, F_UNLCK releases it. It belongs to this
    open of the file: another thread's open, or another process's,
    conflicts; it goes when the fd closes (a process that dies)."""
    fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, struct.pack("hhxxxxqqixxxx", kind, 0, start, length, 0))


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def _what_is(dfd: int, name: str) -> str:
    try:
        return kind_of(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
    except OSError as e:
        return e.strerror or "cannot be read"


def _cache_error(where: str, e: OSError) -> ValueError:
    """A ValueError of an OSError of the cache's own files: what went wrong
    there, and what to do."""
    fix = {errno.ENOSPC: "the cache's disk is full: free space on it, lower cache_limit to what it holds, or give another cache_dir",
           errno.EDQUOT: "the disk quota is spent: free some of it, lower cache_limit, or give another cache_dir",
           errno.EROFS: "a read-only file system: give a cache_dir on a writable, node-local disk",
           errno.EACCES: "permission denied: give a cache_dir this user may write",
           errno.EPERM: "not permitted: give a cache_dir this user may write"}.get(e.errno or 0, "")
    return ValueError("%s: %s%s" % (where, e.strerror or e, "; " + fix if fix else ""))


def _open_file(dfd: int, name: str, flags: int, where: str, mode: int = 0o666) -> int:
    """An fd of the regular file name in the open folder dfd: a symbolic
    link is never followed, a FIFO never waited on, a device never used
    (ValueError, naming where); FileNotFoundError if it is not there (and
    flags do not make it), FileExistsError if it is and flags have O_EXCL."""
    try:
        fd = os.open(name, flags | _O_NOFOLLOW | os.O_NONBLOCK | _O_CLOEXEC, mode, dir_fd=dfd)
    except (FileNotFoundError, FileExistsError):
        raise
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENOTDIR, errno.EWOULDBLOCK):
            raise ValueError("%s: %s, where the cache keeps a file of its own: refusing to use this cache (it never follows "
                             "a link out of its folder, nor opens a FIFO or device): remove it" % (where, _what_is(dfd, name))) from None
        raise _cache_error(where, e) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ValueError("%s: %s, where the cache keeps a file of its own: refusing to use this cache (it never opens a "
                         "FIFO or device): remove it" % (where, kind_of(st.st_mode)))
    return fd


def _read_file(dfd: int, name: str, where: str, limit: int = MAX_MANIFEST) -> bytes:
    """The bytes of the regular file name in dfd (see _open_file), at most
    limit of them."""
    fd = _open_file(dfd, name, os.O_RDONLY, where)
    try:
        n = os.fstat(fd).st_size
        if n > limit:
            raise ValueError("%s: %d bytes, more than the cache writes there (%d): remove it" % (where, n, limit))
        out = bytearray()
        while len(out) < n:
            got = os.pread(fd, n - len(out), len(out))
            if not got:
                break
            out += got
        return bytes(out)
    finally:
        os.close(fd)


def _open_dir(dfd: Optional[int], name: str, where: str, create: bool = False) -> int:
    """An fd of the folder name in the open folder dfd (made if create),
    never through a symbolic link: anything but a real folder there is
    refused (ValueError, naming where)."""
    if create:
        try:
            os.mkdir(name, 0o777, dir_fd=dfd)  # (less the umask, as makedirs made them)
        except FileExistsError:
            pass
        except OSError as e:
            raise _cache_error(where, e) from None
    try:
        return os.open(name, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | os.O_NONBLOCK | _O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ValueError("%s: %s, where the cache keeps a folder of its own: refusing to use this cache (it never follows "
                             "a link out of its folder): remove it" % (where, _what_is(dfd, name) if dfd is not None else "not a folder")) from None
        raise _cache_error(where, e) from None


def _write_new(dfd: int, name: str, b: bytes, where: str) -> None:
    """Write b to name in dfd by a temporary file of this process's
    (name.tmp.PID.RAND, made create-only) renamed over it."""
    tmp = "%s.tmp.%d.%d" % (name, os.getpid(), random.getrandbits(32))
    fd = _open_file(dfd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, where)
    try:
        try:
            view, done = memoryview(b), 0
            while done < len(view):
                done += os.write(fd, view[done:])
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException as e:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise _cache_error(where, e) from None
        raise


def _listdir(dfd: int) -> list[str]:
    """The names in the open folder dfd, read through an open of its own
    (os.listdir(fd) reads through a dup of fd, whose position the threads
    listing it at once would share: each would see part of it)."""
    fd = os.open(".", os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC, dir_fd=dfd)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def _regular(dfd: int, name: str) -> bool:
    """Whether name in dfd is a regular file (what the cache deletes: a
    link, a FIFO or a device is never its own)."""
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def _is_file(dfd: int, name: str, where: str) -> bool:
    """Whether name in dfd is there (a regular file: anything else there,
    a link followed by no one, is refused, naming where)."""
    try:
        mode = os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(mode):
        raise ValueError("%s: %s, where the cache keeps a file of its own: refusing to use this cache (it never follows "
                         "a link out of its folder, nor opens a FIFO or device): remove it" % (where, kind_of(mode)))
    return True


class Cache:
    """A node-local cache folder of bucket folders' files (see the module
    doc). Safe for several processes (ranks, workers) at once. Every open
    and walk inside it starts from its folder's fd and follows no link:
    nothing outside it is ever opened for writing or deleted."""

    def __init__(self, path: str, limit: Union[str, int]) -> None:
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise ValueError("cache_dir %r: want a folder's path" % (path,))
        self.path = os.path.abspath(path)
        self.limit = size_of(limit)
        if self.limit <= 0:
            raise ValueError("cache_limit %r: want a size > 0" % (limit,))
        try:
            os.makedirs(self.path, exist_ok=True)
        except FileExistsError:
            raise ValueError("cache_dir %s: not a folder (%s): give a folder of its own for the cache" % (
                self.path, kind_of(os.stat(self.path).st_mode))) from None
        except OSError as e:
            raise _cache_error("cache_dir " + self.path, e) from None
        self._fd: Optional[int] = None
        self._fd_pid = -1
        names = _listdir(self.fd)
        if MARK not in names:
            if names:
                raise ValueError("%s: not a clipshard cache (it holds %s, and no %s): give an empty or new folder, "
                                 "never a folder of your own files (a cache deletes what it evicts)" % (self.path, sorted(names)[:5], MARK))
            # Made create-only: readers starting at once on an empty folder
            # (ranks, workers) all find it a cache, whoever made the mark.
            try:
                fd = _open_file(self.fd, MARK, os.O_WRONLY | os.O_CREAT | os.O_EXCL, os.path.join(self.path, MARK), 0o644)
            except FileExistsError:
                pass
            else:
                try:
                    os.write(fd, b"clipshard cache: every file here may be deleted at any time\n")
                except OSError as e:
                    raise _cache_error(os.path.join(self.path, MARK), e) from None
                finally:
                    os.close(fd)
        os.close(_open_file(self.fd, MARK, os.O_RDONLY, os.path.join(self.path, MARK)))  # (a regular file: else refused)
        for n in _listdir(self.fd):
            where = os.path.join(self.path, n)
            if n in (MARK, LEDGER) or n.startswith(LEDGER + ".tmp."):
                continue
            if not re.fullmatch(r"[0-9a-f]{32}", n):
                raise ValueError("%s: holds %r, which is not a cache entry: refusing to use it as a cache" % (self.path, n))
            try:
                mode = os.stat(n, dir_fd=self.fd, follow_symlinks=False).st_mode
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(mode):
                raise ValueError("%s: %s, where the cache keeps an entry (a folder of its own): refusing to use this cache "
                                 "(a cache never follows a link out of its folder): remove it" % (where, kind_of(mode)))

    @property
    def fd(self) -> int:
        """An fd of the cache's folder (opened again in a process other than
        the one that opened it, and after close)."""
        if self._fd is None or self._fd_pid != os.getpid():
            try:
                self._fd = os.open(self.path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
            except OSError as e:
                raise _cache_error("cache_dir " + self.path, e) from None
            self._fd_pid = os.getpid()
        return self._fd

    def __del__(self) -> None:
        # (closed only when nothing can use it: a fetch thread still
        # running after a reader's close would otherwise use a number a
        # later open took)
        fd = getattr(self, "_fd", None)
        if fd is not None and self._fd_pid == os.getpid():
            os.close(fd)

    def _walk(self) -> Iterator[tuple[str, list[str], int]]:
        """(folder relative to the cache, its file names, its fd) of every
        folder of the cache, from its fd, following no link."""
        for root, _, names, rfd in os.fwalk(".", dir_fd=self.fd, follow_symlinks=False):
            yield os.path.normpath(root), names, rfd

    def usage(self) -> int:
        """The bytes the cache takes on disk, as du counts them (a walk of
        it; also recorded in the ledger, see counted)."""
        total = 0
        for _, names, rfd in self._walk():
            for n in names:
                try:
                    total += os.stat(n, dir_fd=rfd, follow_symlinks=False).st_blocks * 512
                except FileNotFoundError:
                    pass
        self.record(total)
        return total

    def counted(self) -> Optional[int]:
        """The usage the ledger (LEDGER: the last walk, plus what was
        reserved since, minus what was evicted) holds, if it was walked
        within the last LEDGER_AGE seconds; else None (walk). Under the
        lock: every reservation and eviction goes through it, and what
        grows outside it (position files, extent blocks) is within SLACK."""
        try:
            fd = self._ledger(create=False)
            try:
                v = json.loads(os.pread(fd, LEDGER_BYTES + 1, 0))
            finally:
                os.close(fd)
            if time.time() - float(v["walked"]) < LEDGER_AGE:
                return int(v["usage"])
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            pass
        return None

    def _ledger(self, create: bool) -> int:
        """An fd of the ledger, a regular file of this cache's: a symlink,
        a FIFO or a device planted under its name is never followed,
        opened for long or written (ValueError, naming it)."""
        return _open_file(self.fd, LEDGER, os.O_RDWR | (os.O_CREAT if create else 0), os.path.join(self.path, LEDGER), 0o644)

    def record(self, usage: int, walk: bool = True) -> None:
        """Write the ledger (under the lock): usage, as a walk found it
        now, or (walk False) as counted since the last walk."""
        # Written in place, one pwrite of LEDGER_BYTES (JSON padded with
        # spaces): under the lock no reader sees it half written, and one
        # that a death left torn is not JSON (counted: walk). (A temporary
        # file renamed over it cost a new inode a fetched piece.)
        fd = self._ledger(create=True)
        try:
            walked = time.time()
            if not walk:
                try:
                    walked = float(json.loads(os.pread(fd, LEDGER_BYTES, 0))["walked"])
                except (OSError, ValueError, KeyError, TypeError, RecursionError):
                    walked = 0.0
            body = json.dumps({"usage": usage, "walked": walked}).encode()
            os.pwrite(fd, body.ljust(LEDGER_BYTES), 0)
            if os.fstat(fd).st_size > LEDGER_BYTES:
                os.ftruncate(fd, LEDGER_BYTES)  # (an older version's, longer)
        except OSError as e:
            raise _cache_error(os.path.join(self.path, LEDGER), e) from None
        finally:
            os.close(fd)

    def locked(self) -> "_Flock":
        """The cache's own lock (flock of the mark): room is made and
        taken under it."""
        return _Flock(self.fd, MARK, os.path.join(self.path, MARK))


class _Flock:
    """flock of the regular file name in the open folder dfd (made if it is
    not there), while in the with block."""

    def __init__(self, dfd: int, name: str, where: str, exclusive: bool = True) -> None:
        self.dfd, self.name, self.where = dfd, name, where
        self.mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH

    def __enter__(self) -> "_Flock":
        self.fd = _open_file(self.dfd, self.name, os.O_RDONLY | os.O_CREAT, self.where)
        fcntl.flock(self.fd, self.mode)
        return self

    def __exit__(self, *exc: Any) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def blocks(n: int) -> int:
    """What a file of n bytes may take on disk: n rounded up to whole 4
    KiB blocks, and one more (an extent block, or ext4's one past the end)."""
    return -(-n // 4096) * 4096 + 4096


class Remote:
    """One bucket epochs folder seen through a Cache: root is the local
    folder of its entries (epochs.json, SHA256SUMS, and the shard files as
    they are fetched)."""

    def __init__(self, url: str, cache_dir: Optional[str], cache_limit: Union[str, int, None],
                 manifest: str = "epochs.json") -> None:
        # (manifest: "dataset.json" for a dataset read by blocks, clipshard.draw:
        # its files that BLOCKSUMS does not list, index.npy and the like,
        # are fetched whole, checked against SHA256SUMS)
        if cache_dir is None or cache_limit is None:
            raise ValueError("%s: reading a bucket needs cache_dir= and cache_limit= (a node-local folder, and its bound, "
                             "e.g. cache_limit='40GiB')" % url)
        self.bucket = Bucket(url)
        self.cache = Cache(cache_dir, cache_limit)
        self.manifest = manifest
        man, self.etag = self.bucket.read_all(manifest)
        self.key = hashlib.sha256(self.bucket.url.encode() + b"\0" + man).hexdigest()[:32]
        self.root = os.path.join(self.cache.path, self.key)
        self._lock = threading.Lock()
        self._dirs: dict[str, int] = {}  # folder of the entry ("" itself) -> its fd, of this process
        self._dirs_pid = -1
        self._dir("")  # (made, a real folder)
        self._fresh_boot()
        self._put(manifest, man)
        sums, _ = self.bucket.read_all("SHA256SUMS")
        self.sums = {}
        for line in sums.decode("utf-8", "replace").splitlines():
            h, _, n = line.partition("  ")
            if len(h) == 64 and n:
                self.sums[n] = h
        self._put("SHA256SUMS", sums)
        # The manifests, the mark, .boot, and room for the positions' files.
        self.manifest_bytes = blocks(len(man)) + blocks(len(sums)) + 2 * 4096 + SLACK
        self.objects: dict[str, tuple[int, str]] = {}  # rel -> (size, etag), as first seen
        self.fetched = 0  # bytes of shard files this process fetched (received) into the cache
        self._listed: set[str] = set()  # folders whose objects were listed
        self._sums: dict[str, Optional[BlockSums]] = {}  # epoch folder -> its BLOCKSUMS (None: none)
        self._ahead: dict[Any, Future[None]] = {}
        self._pool_pid = -1
        self._executor: Optional[ThreadPoolExecutor] = None
        self._pos_name = ".pos-%d-%d" % (os.getpid(), id(self))

    # -- the entry's folders, from the cache's fd --------------------------

    def _dir(self, folder: str) -> int:
        """An fd of the entry's folder (e.g. "epoch-0003"; "" the entry
        itself), made if it is not there, reached from the cache's fd one
        real folder at a time (a link is refused, never followed); kept
        open by this process."""
        with self._lock:
            if self._dirs_pid != os.getpid():
                self._dirs, self._dirs_pid = {}, os.getpid()  # (a fork's copies: the parent's to close)
            fd = self._dirs.get(folder)
        if fd is not None:
            return fd
        if folder == "":
            fd = _open_dir(self.cache.fd, self.key, self.root, create=True)
        else:
            parent, _, name = folder.rpartition("/")
            if name in ("", ".", "..") or "\0" in name:
                raise ValueError("%s: %r is not a folder of the entry" % (self.root, folder))
            fd = _open_dir(self._dir(parent), name, os.path.join(self.root, *folder.split("/")), create=True)
        with self._lock:
            old = self._dirs.setdefault(folder, fd)
        if old != fd:
            os.close(fd)
        return old

    def _at(self, rel: str) -> tuple[int, str]:
        """(the fd of rel's folder, rel's name) in the entry."""
        folder, _, name = rel.rpartition("/")
        if name in ("", ".", "..") or "\0" in name:
            raise ValueError("%s: %r is not a file of the entry" % (self.root, rel))
        return self._dir(folder), name

    def _fresh_boot(self) -> None:
        """Marks of fetched blocks are trusted within the boot that wrote
        them (after a crash, a page the disk never got may read as zeros):
        an entry of another boot has its shard files removed."""
        now = _boot_id()
        root = self._dir("")
        where = os.path.join(self.root, ".boot")

        def same() -> bool:
            try:
                return _read_file(root, ".boot", where, 4096).decode("utf-8", "replace") == now
            except FileNotFoundError:
                return False
        if same():
            return
        with self.cache.locked():
            if same():
                return
            try:
                for _, _, names, rfd in os.fwalk(".", dir_fd=root, follow_symlinks=False):
                    for n in names:
                        if (n.endswith((".npy", ".have")) or n == BLOCKSUMS or ".tmp." in n) and _regular(rfd, n):
                            try:
                                os.unlink(n, dir_fd=rfd)
                            except FileNotFoundError:
                                pass
            except OSError as e:
                raise _cache_error(self.root, e) from None
            _write_new(root, ".boot", now.encode(), where)

    def _put(self, rel: str, b: bytes) -> None:
        dfd, name = self._at(rel)
        try:
            if _read_file(dfd, name, self.local(rel), max(len(b), 1) * 2) == b:
                return
        except FileNotFoundError:
            pass
        _write_new(dfd, name, b, self.local(rel))

    def check_current(self) -> bytes:
        """epochs.json (the manifest) as the bucket holds it now."""
        b, _ = self.bucket.read_all(self.manifest)
        return b

    def local(self, rel: str) -> str:
        return os.path.join(self.root, *rel.split("/"))

    # -- what is in the bucket -----------------------------------------------

    def _object(self, rel: str) -> tuple[int, str]:
        """(size, ETag) of rel as first seen (its folder listed once)."""
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
            try:
                obj = self.bucket.head(rel)
            except FileNotFoundError as e:
                raise ValueError(str(e)) from None
            with self._lock:
                self.objects[rel] = obj
        return obj

    def block_sums_size(self, rel: str) -> int:
        """Bytes of the BLOCKSUMS of shard file rel's folder in the bucket
        (0: none)."""
        folder = rel.rsplit("/", 1)[0] if "/" in rel else ""
        self._object(rel)  # (lists the folder)
        with self._lock:
            listed = self.objects.get(folder + "/" + BLOCKSUMS if folder else BLOCKSUMS)
        return listed[0] if listed else 0

    def block_sums(self, rel: str) -> Optional[BlockSums]:
        """The BLOCKSUMS of shard file rel's folder (checked, and against
        SHA256SUMS), fetched into the cache once; None if the bucket has
        none (the folder's files are then fetched whole)."""
        folder = rel.rsplit("/", 1)[0] if "/" in rel else ""
        with self._lock:
            if folder in self._sums:
                return self._sums[folder]
        name = folder + "/" + BLOCKSUMS if folder else BLOCKSUMS
        self._object(rel)  # (lists the folder)
        with self._lock:
            listed = self.objects.get(name)
        sums: Optional[BlockSums] = None
        if listed is not None:
            b = None
            dfd, base = self._at(name)
            try:
                b = _read_file(dfd, base, self.local(name), MAX_MANIFEST + MAX_DIGESTS)
            except FileNotFoundError:
                pass
            if b is None or len(b) != listed[0]:
                if listed[0] > MAX_MANIFEST + MAX_DIGESTS:
                    raise ValueError("%s: %d bytes, more than a BLOCKSUMS may have" % (self.bucket.name(name), listed[0]))
                b = self.bucket.range(name, 0, listed[0], listed[1])
            sums = BlockSums(b, self.bucket.name(name))
            for n, (size, sha, _) in sums.files.items():
                if self.sums.get(n, sha) != sha:
                    raise ValueError("%s: records sha256 %s for %s, SHA256SUMS %s: it describes another version of the file "
                                     "(push again)" % (self.bucket.name(name), sha, n, self.sums.get(n)))
            self._reserve(blocks(len(b)), lambda: self._put(name, b))
        with self._lock:
            self._sums[folder] = sums
        return sums

    # -- fetching ------------------------------------------------------------

    def ensure(self, rel: str) -> str:
        """The local path of shard file rel, whole in the cache (fetched
        once per node and checked, if it is not there)."""
        sums = self.block_sums(rel)
        if sums is not None and (rel in sums.files or self.manifest != "dataset.json"):
            self.ensure_range(rel, 0, None)
            return self.local(rel)
        p = self.local(rel)
        if _is_file(*self._at(rel), p):
            return p
        # (a fetch thread reading it ahead holds its lock: _fetch_whole
        # waits for that and finds it there)
        self._fetch_whole(rel)
        return p

    def ensure_range(self, rel: str, lo: int, hi: Optional[int], ino: Optional[int] = None, fan_out: bool = True) -> None:
        """Bytes [lo, hi) of shard file rel (hi None: to its end) fetched
        into its cache file and checked, block by block (BLOCKSUMS). With
        ino, the cache file must be that one (the one a reader has open:
        a reader's files are never evicted, this checks it)."""
        sums = self.block_sums(rel)
        if sums is None or (rel not in sums.files and self.manifest == "dataset.json"):
            self.ensure(rel)
            return
        size, sha, _ = sums.files.get(rel, (-1, "", 0))
        if size < 0:
            raise ValueError("%s: BLOCKSUMS does not list it: its bytes cannot be checked" % self.bucket.name(rel))
        osize, etag = self._object(rel)
        if osize != size:
            raise ValueError("%s: %d bytes in the bucket, BLOCKSUMS says %d (replaced?)" % (self.bucket.name(rel), osize, size))
        K = sums.block
        hi = size if hi is None else min(hi, size)
        if hi <= lo:
            return
        i0, i1 = lo // K, -(-hi // K)
        for attempt in range(4):
            try:
                fd, have = self._sparse(rel, size, -(-size // K))
            except FileNotFoundError:
                continue  # evicted meanwhile: made again
            try:
                if ino is not None and os.fstat(fd).st_ino != ino:
                    raise ValueError("%s: replaced in the cache while it was open for reading (evicted?): refusing to read "
                                     "holes" % self.local(rel))
                marks = os.pread(have, i1 - i0, i0)
                if len(marks) != i1 - i0:
                    raise ValueError("%s: its marks are short" % self.local(rel) + ".have")
                if all(marks):
                    return
                # The missing runs in pieces of up to PIECE bytes, fetched
                # by this thread and, with fan_out, this process's fetch
                # threads as they are free.
                step = max(1, PIECE // K)
                pieces = [(c, min(c + step, b)) for a, b in _runs(marks, i0) for c in range(a, b, step)]
                self._share([lambda a=a, b=b: self._fetch_piece(rel, fd, have, sums, size, etag, a, b) for a, b in pieces], fan_out)
                return
            finally:
                os.close(fd)
                os.close(have)
        raise ValueError("%s: evicted again and again while it was being fetched: raise cache_limit" % self.local(rel))

    def ensure_head(self, rel: str) -> None:
        """The head of shard file rel (its first HEAD bytes: the .npy
        header, what opening it reads) fetched into its cache file and
        checked against BLOCKSUMS; its mark is the marks' last byte (a
        rank whose slices miss the first block fetches 4 KiB, not a
        block). A file of one block: that block. Without BLOCKSUMS: the
        file whole."""
        sums = self.block_sums(rel)
        if sums is None or (rel not in sums.files and self.manifest == "dataset.json"):
            self.ensure(rel)
            return
        size, _, _ = sums.files.get(rel, (-1, "", 0))
        if size < 0:
            raise ValueError("%s: BLOCKSUMS does not list it: its bytes cannot be checked" % self.bucket.name(rel))
        if size <= sums.block:
            self.ensure_range(rel, 0, size)  # a file of one block: that block (a reader of any row needs it)
            return
        osize, etag = self._object(rel)
        if osize != size:
            raise ValueError("%s: %d bytes in the bucket, BLOCKSUMS says %d (replaced?)" % (self.bucket.name(rel), osize, size))
        n = -(-size // sums.block)
        for attempt in range(4):
            try:
                fd, have = self._sparse(rel, size, n)
            except FileNotFoundError:
                continue
            try:
                if os.pread(have, 1, n) == b"\1" or all(os.pread(have, 1, 0)):
                    return  # (the head, or the first block, which holds it)
                _range_lock(have, n, 1, fcntl.F_WRLCK)
                try:
                    if os.pread(have, 1, n) == b"\1":
                        return
                    k = min(HEAD, size)
                    self._reserve(4096 + 4096, lambda: os.posix_fallocate(fd, 0, k) if k else None)
                    b = self.bucket.range(rel, 0, k, etag)
                    with self._lock:
                        self.fetched += k
                    if hashlib.sha256(b).digest() != sums.heads[rel]:
                        raise ValueError("%s: its head (bytes 0..%d) is not what BLOCKSUMS records: refusing it" % (self.bucket.name(rel), k))
                    os.pwrite(fd, b, 0)
                    os.pwrite(have, b"\1", n)
                finally:
                    _range_lock(have, n, 1, fcntl.F_UNLCK)
                return
            finally:
                os.close(fd)
                os.close(have)
        raise ValueError("%s: evicted again and again while it was being fetched: raise cache_limit" % self.local(rel))

    def _sparse(self, rel: str, size: int, n: int) -> tuple[int, int]:
        """fds of rel's cache file (its full size, holes where nothing was
        fetched) and of its marks (NAME.have: a byte a block, then one for
        the head), made if they are not there: the marks first, so that a
        data file is never without them."""
        dfd, name = self._at(rel)
        p = self.local(rel)
        try:
            return self._open_pair(dfd, name, p)
        except FileNotFoundError:
            pass
        fd = _open_file(dfd, name + ".lock", os.O_RDWR | os.O_CREAT, p + ".lock", 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                return self._open_pair(dfd, name, p)
            except FileNotFoundError:
                pass
            for q in (name, name + ".have"):
                if _is_file(dfd, q, os.path.join(os.path.dirname(p), q)):  # (anything else there: refused)
                    os.unlink(q, dir_fd=dfd)  # (one without the other: what an eviction or a death left)
            _sweep(dfd, name)

            def marks() -> None:
                _write_new(dfd, name + ".have", bytes(n + 1), p + ".have")
            self._reserve(blocks(n + 1), marks)
            tmp = "%s.tmp.%d.%d" % (name, os.getpid(), random.getrandbits(32))
            t = _open_file(dfd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, p)
            try:
                os.ftruncate(t, size)
            finally:
                os.close(t)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            return self._open_pair(dfd, name, p)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    @staticmethod
    def _open_pair(dfd: int, name: str, p: str) -> tuple[int, int]:
        """fds of name (in dfd) and of its marks, of one making: marks made
        again between the two opens (an eviction and a new fetch) are not
        paired with the data file (FileNotFoundError: try again)."""
        have = _open_file(dfd, name + ".have", os.O_RDWR, p + ".have")
        try:
            fd = _open_file(dfd, name, os.O_RDWR, p)
            try:
                if os.stat(name + ".have", dir_fd=dfd, follow_symlinks=False).st_ino != os.fstat(have).st_ino:
                    raise FileNotFoundError(p + ".have")
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            os.close(have)
            raise
        return fd, have

    def _share(self, work: list[Any], fan_out: bool) -> None:
        """Run the calls of work, this thread taking them in order and, with
        fan_out, the fetch threads taking the rest as they are free (none
        is waited for before it starts: a fetch thread's own call runs
        its work alone); the first error raised."""
        todo = list(reversed(work))
        lock = threading.Condition()
        state = {"running": 0}
        errors: list[BaseException] = []

        def take() -> None:
            while True:
                with lock:
                    if not todo or errors:
                        return
                    job = todo.pop()
                    state["running"] += 1
                try:
                    job()
                except BaseException as e:
                    errors.append(e)
                finally:
                    with lock:
                        state["running"] -= 1
                        lock.notify_all()
        if fan_out and len(work) > 1 and FETCHERS > 1:
            pool = self._pool()
            for _ in range(min(FETCHERS, len(work) - 1)):
                pool.submit(take)
        take()
        with lock:
            while state["running"]:
                lock.wait()
        if errors:
            raise errors[0]

    def _fetch_piece(self, rel: str, data: int, have: int, sums: BlockSums, size: int, etag: str, a: int, b: int) -> None:
        """Blocks [a, b) of rel, if still unmarked once their range of the
        marks is locked: room taken (allocated) for them, fetched, written
        as they come, each block checked against BLOCKSUMS and then marked
        (only a checked block is ever marked)."""
        dfd, name = self._at(rel)
        fd = _open_file(dfd, name, os.O_RDWR, self.local(rel))
        try:
            mine = _open_file(dfd, name + ".have", os.O_RDWR, self.local(rel) + ".have")  # (an open of its own: its lock is its own)
        except BaseException:
            os.close(fd)
            raise
        try:
            if os.fstat(mine).st_ino != os.fstat(have).st_ino or os.fstat(fd).st_ino != os.fstat(data).st_ino:
                raise ValueError("%s: replaced in the cache while it was being fetched (evicted?): raise cache_limit" % self.local(rel))
            _range_lock(mine, a, b - a, fcntl.F_WRLCK)
            try:
                for c, d in _runs(os.pread(mine, b - a, a), a):
                    self._fetch_blocks(rel, fd, mine, sums, size, etag, c, d)
            finally:
                _range_lock(mine, a, b - a, fcntl.F_UNLCK)
        finally:
            os.close(fd)
            os.close(mine)

    def _fetch_blocks(self, rel: str, fd: int, have: int, sums: BlockSums, size: int, etag: str, a: int, b: int) -> None:
        K = sums.block
        lo, hi = a * K, min(b * K, size)
        self._reserve(-(-(hi - lo) // 4096) * 4096 + 4096, lambda: os.posix_fallocate(fd, lo, hi - lo))
        state: dict[str, Any] = {"block": a, "filled": 0, "h": hashlib.sha256()}  # the block being hashed, its bytes so far

        def sink(off: int, chunk: bytes) -> None:
            view, done = memoryview(chunk), 0
            while done < len(view):
                done += os.pwrite(fd, view[done:], off + done)
            first = state["block"]
            j = 0
            while j < len(view):
                i = state["block"]
                end = min(K, size - i * K)
                k = min(len(view) - j, end - state["filled"])
                state["h"].update(view[j: j + k])
                j += k
                state["filled"] += k
                if state["filled"] == end:
                    if state["h"].digest() != sums.digest(rel, i):
                        raise ValueError("%s: block %d (bytes %d..%d) is not what BLOCKSUMS records: refusing it"
                                         % (self.bucket.name(rel), i, i * K, i * K + end))
                    state["block"], state["filled"], state["h"] = i + 1, 0, hashlib.sha256()
            if state["block"] > first:
                os.pwrite(have, b"\1" * (state["block"] - first), first)
        self.bucket.stream(rel, lo, hi, etag, sink)
        with self._lock:
            self.fetched += hi - lo

    def _fetch_whole(self, rel: str) -> None:
        """A file of a folder without BLOCKSUMS: fetched whole by whoever
        holds NAME.lock, into NAME.tmp.PID.RAND, checked against
        SHA256SUMS, then renamed (the others wait for the name)."""
        p = self.local(rel)
        want = self.sums.get(rel)
        if want is None:
            raise ValueError("%s: SHA256SUMS does not list it: its bytes cannot be checked" % self.bucket.name(rel))
        dfd, name = self._at(rel)
        lock = _open_file(dfd, name + ".lock", os.O_RDWR | os.O_CREAT, p + ".lock", 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process fetching it: wait for its rename (or its death)
            if _is_file(dfd, name, p):
                return
            _sweep(dfd, name)  # the lock is ours: what a fetcher of it left when it died goes
            size, etag = self._object(rel)
            tmp = "%s.tmp.%d.%d" % (name, os.getpid(), random.getrandbits(32))
            # Room is made, and taken (the temporary file allocated at its
            # full size), under the cache's lock: fetchers of other
            # processes at once stay under the limit together.
            fds: list[int] = []

            def allocate() -> None:
                fds.append(_open_file(dfd, tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, p))
                try:
                    if size:
                        os.posix_fallocate(fds[0], 0, size)
                except BaseException:
                    os.close(fds.pop())
                    os.unlink(tmp, dir_fd=dfd)
                    raise
            self._reserve(blocks(size), allocate)
            fd = fds[0]
            try:
                h = hashlib.sha256()

                def sink(off: int, chunk: bytes) -> None:
                    view, done = memoryview(chunk), 0
                    while done < len(view):
                        done += os.pwrite(fd, view[done:], off + done)
                    h.update(view)
                self.bucket.stream(rel, 0, size, etag, sink)
                with self._lock:
                    self.fetched += size
                if h.hexdigest() != want:
                    raise ValueError("%s: its bytes (sha256 %s) are not those SHA256SUMS records (%s): refusing them"
                                     % (self.bucket.name(rel), h.hexdigest(), want))
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except OSError as e:
                raise _cache_error(p, e) from None
            finally:
                os.close(fd)
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except FileNotFoundError:
                    pass
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            os.close(lock)

    # -- reading ahead ---------------------------------------------------------

    def read_ahead(self, groups: list[list[str]]) -> None:
        """Fetch these shard groups (the next ones the reader reaches) whole
        in the background, FETCHERS requests at once, in order."""
        self.read_ahead_ranges([(rel, 0, None) for g in groups for rel in g])

    def read_ahead_ranges(self, ranges: Iterable[tuple[str, int, Optional[int]]]) -> None:
        """Fetch these byte ranges of shard files in the background ((rel,
        0, None): the file whole; (rel, 0, -1): its head)."""
        pool = None
        for r in self._pieces(ranges):
            if r in self._ahead and self._pool_pid == os.getpid():
                continue
            if r[1] == 0 and r[2] is None and self._sums.get(r[0].rsplit("/", 1)[0]) is None and _is_file(*self._at(r[0]), self.local(r[0])):
                continue  # (a whole file there)
            pool = pool or self._pool()
            self._ahead[r] = pool.submit(self._quiet_fetch, *r)
        if len(self._ahead) > 4096:
            self._ahead = {k: v for k, v in self._ahead.items() if not v.done()}

    def _pieces(self, ranges: Iterable[tuple[str, int, Optional[int]]]) -> Iterator[tuple[str, int, Optional[int]]]:
        """The ranges, those of a file whose folder's BLOCKSUMS is at hand cut
        into pieces of PIECE bytes on block bounds, in order: the fetch
        threads then take the next piece as each is free, and keep
        FETCHERS GETs in flight in the order the reader needs them (a file
        a thread fetched whole made a group wait for its largest file,
        fetched by one thread)."""
        for rel, lo, hi in ranges:
            with self._lock:
                sums = self._sums.get(rel.rsplit("/", 1)[0] if "/" in rel else "")
            got = sums.files.get(rel) if sums is not None and hi != -1 else None
            if sums is None or got is None:
                yield rel, lo, hi
                continue
            size, K = got[0], sums.block
            end = size if hi is None else min(hi, size)
            step = max(1, PIECE // K) * K
            a = lo // K * K
            while a < end:
                b = min(end, (a // step + 1) * step)
                yield rel, max(a, lo), (None if b >= size else b)
                a = b

    def _quiet_fetch(self, rel: str, lo: int, hi: Optional[int]) -> None:
        try:
            if hi == -1:
                self.ensure_head(rel)
            elif lo == 0 and hi is None and self.block_sums(rel) is None:
                self.ensure(rel)
            else:
                self.ensure_range(rel, lo, hi, fan_out=False)  # (a fetch thread: the others are busy reading ahead too)
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
        _write_new(self._dir(""), self._pos_name, body.encode(), os.path.join(self.root, self._pos_name))

    def kept(self) -> tuple[set[str], set[str]]:
        """The files live local readers are at, and those they read ahead
        to (of every version in the cache), as paths relative to the
        cache's folder."""
        keep: set[str] = set()
        ahead: set[str] = set()
        top = self.cache.fd
        for key in _listdir(top):
            if not re.fullmatch(r"[0-9a-f]{32}", key):
                continue
            try:
                d = _open_dir(top, key, os.path.join(self.cache.path, key))
            except (OSError, ValueError):
                continue  # (gone, or not a folder: the cache refuses it when next opened)
            try:
                for n in _listdir(d):
                    if not n.startswith(".pos-") or n.endswith(".tmp") or ".tmp." in n:
                        continue
                    try:
                        pid = int(n.split("-")[1])
                        v = json.loads(_read_file(d, n, os.path.join(self.cache.path, key, n), 1 << 24))
                    except (ValueError, OSError, RecursionError, IndexError):
                        continue
                    if not _alive(pid):
                        try:
                            os.unlink(n, dir_fd=d)
                        except OSError:
                            pass
                        continue
                    if not isinstance(v, dict):
                        continue
                    for into, what in ((keep, v.get("reading")), (ahead, v.get("ahead"))):
                        if isinstance(what, list):  # (a reader's, or anything: each a name inside the entry)
                            into.update(os.path.join(key, *r.split("/")) for r in what if isinstance(r, str) and ".." not in r.split("/"))
            finally:
                os.close(d)
        return keep, ahead - keep

    def _reserve(self, need: int, allocate: Any) -> None:
        """Make room for need more bytes under the limit (less SLACK) and
        take it (allocate(): the blocks allocated, a file made), under the
        cache's lock, so that fetchers of every process together stay
        under the limit. While the local readers keep all of it, wait for
        them to move on (without the lock) for a minute, then raise."""
        limit = self.cache.limit - SLACK
        if need > limit:
            raise ValueError("%s: cache_limit %d cannot hold %d bytes more: raise cache_limit" % (self.cache.path, self.cache.limit, need + SLACK))
        deadline = time.monotonic() + 60
        while True:
            with self.cache.locked():
                used = self._make_room(need, limit)
                if used + need <= limit:
                    try:
                        allocate()
                    except OSError as e:
                        raise _cache_error("cache_dir %s (taking %d bytes of cache_limit %d)" % (self.cache.path, need, self.cache.limit), e) from None
                    self.cache.record(used + need, walk=False)
                    return
            if time.monotonic() > deadline:
                raise ValueError("%s: %d bytes in use of cache_limit %d, and the local readers keep all of it: raise cache_limit"
                                 % (self.cache.path, used, self.cache.limit))
            time.sleep(0.05)

    def _make_room(self, need: int, limit: int) -> int:
        """Evict shard files (and BLOCKSUMS) no live local reader keeps
        until need more bytes fit under limit, if they can; the usage
        then. Under the cache's lock."""
        used = self.cache.counted()
        if used is not None and used + need <= limit:
            return used
        used = self.cache.usage()  # (walked: exact)
        if used + need <= limit:
            return used
        keep, ahead = self.kept()
        victims = []
        for root, names, rfd in self.cache._walk():
            if root == ".":
                continue  # (the mark and the ledger)
            for n in names:
                p = os.path.join(root, n)
                if not _regular(rfd, n):
                    continue  # (not the cache's: a reader refuses it, naming it)
                if (n.endswith(".npy") or n == BLOCKSUMS) and p not in keep:
                    try:
                        # What no reader needs first, oldest first; then
                        # what readers read ahead to, farthest first.
                        t = os.stat(n, dir_fd=rfd, follow_symlinks=False).st_mtime
                        victims.append((p in ahead, -t if p in ahead else t, p))
                    except FileNotFoundError:
                        pass
                elif ".tmp." in n:
                    pid = n.split(".tmp.")[1].split(".")[0]
                    if pid.isdigit() and not _alive(int(pid)):
                        try:
                            used -= os.stat(n, dir_fd=rfd, follow_symlinks=False).st_blocks * 512
                            os.unlink(n, dir_fd=rfd)  # a dead fetcher's
                        except FileNotFoundError:
                            pass
        victims.sort()
        for _, _, p in victims:
            if used + need <= limit:
                break
            used -= self._evict(p)
        return used

    def _evict(self, p: str) -> int:
        """Remove cache file p (relative to the cache's folder) and its
        marks, unless it is being made (its NAME.lock held); the bytes
        freed."""
        folder, name = os.path.split(p)
        try:
            dfd = self.cache.fd
            opened = []
            for part in folder.split(os.sep):
                dfd = _open_dir(dfd, part, os.path.join(self.cache.path, folder))
                opened.append(dfd)
        except (OSError, ValueError):
            for d in opened:
                os.close(d)
            return 0
        freed = 0
        lock = None
        try:
            if name.endswith(".npy"):
                try:
                    lock = _open_file(dfd, name + ".lock", os.O_RDONLY, os.path.join(self.cache.path, p) + ".lock")
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(lock) if lock is not None else None
                    return 0
                except FileNotFoundError:
                    lock = None
            try:
                for q in (name, name + ".have"):  # the data first: a file is never without its marks
                    try:
                        st = os.stat(q, dir_fd=dfd, follow_symlinks=False)
                        if stat.S_ISREG(st.st_mode):
                            os.unlink(q, dir_fd=dfd)
                            freed += st.st_blocks * 512
                    except FileNotFoundError:
                        pass
            finally:
                if lock is not None:
                    fcntl.flock(lock, fcntl.LOCK_UN)
                    os.close(lock)
        finally:
            for d in opened:
                os.close(d)
        return freed

    def close(self) -> None:
        try:
            os.unlink(self._pos_name, dir_fd=self._dir(""))
        except (OSError, ValueError):
            pass

    def __del__(self) -> None:
        # (the folders' fds closed only when nothing can use them: a fetch
        # thread still running after close would otherwise use a number a
        # later open took, writing into another folder)
        if getattr(self, "_dirs_pid", None) == os.getpid():
            for fd in self._dirs.values():
                os.close(fd)


def _sweep(dfd: int, base: str) -> None:
    """Remove the temporary files of cache file base in the open folder
    dfd (base.tmp.PID.*, base.have.tmp.PID.*) that dead processes, or this
    one, left. Called holding base's lock."""
    for n in _listdir(dfd):
        for head in (base + ".tmp.", base + ".have.tmp."):
            if n.startswith(head):
                pid = n[len(head):].split(".")[0]
                if pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))) and _regular(dfd, n):
                    try:
                        os.unlink(n, dir_fd=dfd)
                    except FileNotFoundError:
                        pass


def _runs(marks: bytes, first: int) -> list[tuple[int, int]]:
    """The runs [a, b) of unmarked blocks (a zero byte) in marks, whose
    first byte is block first's."""
    out, i, n = [], 0, len(marks)
    while i < n:
        if marks[i]:
            i += 1
            continue
        j = i
        while j < n and not marks[j]:
            j += 1
        out.append((first + i, first + j))
        i = j
    return out
