"""The bucket side of reading from S3 (clipshard push's layout): bucket
URLs, the boto3 client (made per process), bounded ranged GETs of the
version listed with retries (Bucket), and the BLOCKSUMS a pushed epoch
folder carries (BlockSums). See _remote for the whole design.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import threading
import time
from typing import Any, Optional, Union

__all__ = ["Bucket", "BlockSums", "is_url", "parse_url", "size_of"]

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
                if ep:
                    _reachable(ep)
                self._c = boto3.session.Session().client("s3", endpoint_url=ep, config=cfg)
                self._pid = os.getpid()
            return self._c


def _reachable(ep: str, tries: int = 5) -> None:
    """AWS_ENDPOINT_URL's server accepts a connection (tried for about 5
    s), or a ValueError says what to check: boto3 retries a refused
    connection for 80 s (adaptive, 10 attempts) before saying so, without
    naming the variable."""
    import socket
    from urllib.parse import urlsplit
    try:
        u = urlsplit(ep)
        host, port = u.hostname, u.port or (443 if u.scheme == "https" else 80)
    except ValueError as e:
        raise ValueError("AWS_ENDPOINT_URL %r: %s: want http(s)://HOST[:PORT]" % (ep, e)) from None
    if u.scheme not in ("http", "https") or not host:
        raise ValueError("AWS_ENDPOINT_URL %r: want http(s)://HOST[:PORT]" % (ep,))
    for i in range(tries):
        try:
            socket.create_connection((host, port), timeout=5).close()
            return
        except OSError as e:
            if i == tries - 1:
                raise ValueError("cannot reach AWS_ENDPOINT_URL %s: %s (is the server up, and is this its address?)" % (
                    ep, e.strerror or e)) from None
            time.sleep(1)


DENIED = ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch")


def hint(e: BaseException) -> str:
    """What to set, for an error of the bucket's credentials or endpoint
    (boto3 names neither the variables nor the endpoint it used); "" for
    another error."""
    name = type(e).__name__
    ep = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return (" (no credentials were found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE: a profile of "
                "~/.aws/credentials or AWS_SHARED_CREDENTIALS_FILE)")
    if _code(e) in DENIED:
        src = ("AWS_ACCESS_KEY_ID" if os.environ.get("AWS_ACCESS_KEY_ID") else
               "AWS_PROFILE %s" % os.environ["AWS_PROFILE"] if os.environ.get("AWS_PROFILE") else
               "~/.aws/credentials' default profile, or an instance role")
        return (" (the credentials used, from %s, are refused at %s: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or "
                "AWS_PROFILE, and the key's rights)" % (src, ep or "AWS's own S3"))
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError") or isinstance(e, OSError):
        if ep:
            return " (cannot reach AWS_ENDPOINT_URL %s: is the server up, and is this its address?)" % ep
        return (" (AWS's own S3: no AWS_ENDPOINT_URL is set; for another S3 server, e.g. MinIO or Ceph, set "
                "AWS_ENDPOINT_URL=http(s)://HOST:PORT)")
    return ""


def fatal(e: BaseException) -> bool:
    """An error no retry mends: no credentials, or refused."""
    return type(e).__name__ in ("NoCredentialsError", "PartialCredentialsError") or _code(e) in DENIED


def _code(e: BaseException) -> str:
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
                raise ValueError("%s: listing: %s%s" % (self.name(rel_prefix), e, hint(e))) from None
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
            raise ValueError("%s: %s%s" % (self.name(rel), e, hint(e))) from None
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
                if fatal(e):
                    raise ValueError("%s: %s%s" % (self.name(rel), e, hint(e))) from None
                fails += 1
                if fails > tries:
                    raise ValueError("%s: bytes %d..%d: %d tries failed, the last: %s%s" % (self.name(rel), at, b, fails, e,
                                                                                              hint(e))) from None
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
