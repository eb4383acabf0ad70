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

import hashlib
import json
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, Optional, Union

from ._bucket import BLOCKSUMS, FETCHERS, MAX_DIGESTS, MAX_MANIFEST, PIECE, BlockSums, Bucket, is_url
from ._cache import SLACK, Cache, _is_file, _read_file, blocks
from ._entry import Entry
from ._fetch import Fetcher
from ._room import Room

__all__ = ["Remote", "is_url", "blocks", "BLOCKSUMS"]


class Remote:
    """One bucket folder (epochs, or a dataset read by blocks) seen through
    a Cache: root is the local folder of its entry (the manifest,
    SHA256SUMS, and the files as they are fetched). It composes the
    entry's folder (Entry), what the bucket lists of it (Listing), the
    cache's bound (Room), the fetches (Fetcher) and the read-ahead
    (ReadAhead).

        r = Remote("s3://bkt/epochs", "/scratch/cache", "40GiB")
        r.ensure_range("epoch-0003/shard-000000.whisper.npy", 4096, 1 << 20)
        open(os.path.join(r.root, "epoch-0003/shard-000000.whisper.npy"), "rb")
    """

    def __init__(self, url: str, cache_dir: Optional[str], cache_limit: Union[str, int, None],
                 manifest: str = "epochs.json", version: Optional[int] = None) -> None:
        # (manifest: "dataset.json" for a dataset read by blocks, clipshard.draw:
        # its files that BLOCKSUMS does not list, index.npy and the like,
        # are fetched whole, checked against SHA256SUMS; version: a kept
        # version of a dataset in segments, read from versions/N/)
        if cache_dir is None or cache_limit is None:
            raise ValueError("%s: reading a bucket needs cache_dir= and cache_limit= (a node-local folder, and its bound, "
                             "e.g. cache_limit='40GiB')" % url)
        self.bucket = Bucket(url)
        self.cache = Cache(cache_dir, cache_limit)
        self.manifest = manifest
        man, self.etag = self.bucket.read_all(manifest)
        self.segmented, sums_rel = False, "SHA256SUMS"
        if manifest == "dataset.json":
            top = _segments_of(self.bucket, man)
            if top is not None and version is not None and version != top.get("dataset_version"):
                self.manifest = "versions/%d/dataset.json" % version
                try:
                    man, self.etag = self.bucket.read_all(self.manifest)
                except FileNotFoundError:
                    raise ValueError("%s: version %d is not kept there (its dataset.json is version %r): read a version "
                                     "the bucket keeps" % (self.bucket.url, version, top.get("dataset_version"))) from None
                top = _segments_of(self.bucket, man)
            if top is not None:
                self.segmented, sums_rel = True, top["files"]["sha256sums"]
        self.man_sha = hashlib.sha256(man).hexdigest()
        self.sums_rel = sums_rel
        self.by_content = manifest == "dataset.json"
        if self.by_content:
            # One entry for every version of a dataset (format 1 is version
            # 1), its files named by their content (a name the bucket reuses
            # for other bytes, e.g. after a push --force, is another file
            # here): a node that holds version N fetches only what N+1 adds.
            self.key = hashlib.sha256(self.bucket.url.encode() + b"\0clipshard dataset by content").hexdigest()[:32]
        else:
            self.key = hashlib.sha256(self.bucket.url.encode() + b"\0" + man).hexdigest()[:32]
        self.entry = Entry(self.cache, self.key)
        self.root = self.entry.root
        self.entry.fresh_boot()
        sums, _ = self.bucket.read_all(sums_rel)
        self.room = Room(self.cache)
        self.listing = Listing(self.bucket, self.entry, self.room, sums)
        if self.by_content:
            self.entry.mapping = self._name
        self.entry.put(self.manifest, man)
        self.entry.put(sums_rel, sums)
        # The manifests, the mark, .boot, and room for the positions' files.
        self.manifest_bytes = blocks(len(man)) + blocks(len(sums)) + 2 * 4096 + SLACK
        self.ahead = ReadAhead(self.listing, self.entry, self._quiet_fetch)
        self.fetcher = Fetcher(self.bucket, self.entry, self.listing, self.room, self.ahead.share, manifest == "dataset.json")

    def __str__(self) -> str:
        return "Remote(%s, cached in %s)" % (self.bucket.url, self.root)

    def _name(self, rel: str) -> str:
        """The entry's name of bucket file rel of a dataset: by content. A file the version's SHA256SUMS lists: f/<its sha256>/<name>;
        the version's manifest and SHA256SUMS: m/<the manifest's sha256>/; a
        BLOCKSUMS: b/<sha256 of its name, size and ETag>/BLOCKSUMS."""
        base = rel.rpartition("/")[2]
        if rel == self.manifest or rel == self.sums_rel:
            return "m/%s/%s" % (self.man_sha[:32], base)
        sha = self.listing.sums.get(rel)
        if sha is not None:
            if len(sha) != 64 or sha.strip("0123456789abcdef"):
                raise ValueError("%s: SHA256SUMS records %r for it, not a sha256" % (self.bucket.name(rel), sha))
            return "f/%s/%s" % (sha[:32], base)
        if base == BLOCKSUMS:
            size, etag = self.listing.object(rel)
            return "b/%s/%s" % (hashlib.sha256(("%s\0%d\0%s" % (rel, size, etag)).encode()).hexdigest()[:32], BLOCKSUMS)
        raise ValueError("%s: not a file of %s (its SHA256SUMS does not list it)" % (self.bucket.name(rel), self.manifest))

    @property
    def fetched(self) -> int:
        """Bytes of files this process fetched (received) into the cache."""
        return self.fetcher.fetched

    def check_current(self) -> bytes:
        """The manifest (epochs.json, dataset.json) as the bucket holds it now."""
        b, _ = self.bucket.read_all(self.manifest)
        return b

    def kept_manifest(self, version: int) -> Optional[bytes]:
        """Version's dataset.json as the bucket keeps it (versions/N/), None
        if it is not there: a reader of the current version reads on after
        a push of a later one, while the bucket keeps its version."""
        rel = "versions/%d/dataset.json" % version
        try:
            b, _ = self.bucket.read_all(rel)
        except FileNotFoundError:
            return None
        if hashlib.sha256(b).hexdigest() == self.man_sha:
            self.manifest = rel
        return b

    def local(self, rel: str) -> str:
        return self.entry.local(rel)

    def block_sums_size(self, rel: str) -> int:
        return self.listing.block_sums_size(rel)

    def block_sums(self, rel: str) -> Optional[BlockSums]:
        return self.listing.block_sums(rel)

    def ensure(self, rel: str) -> str:
        return self.fetcher.ensure(rel)

    def ensure_range(self, rel: str, lo: int, hi: Optional[int], ino: Optional[int] = None, fan_out: bool = True) -> None:
        self.fetcher.ensure_range(rel, lo, hi, ino, fan_out)

    def ensure_head(self, rel: str) -> None:
        self.fetcher.ensure_head(rel)

    def read_ahead(self, groups: list[list[str]]) -> None:
        self.ahead.read_ahead(groups)

    def read_ahead_ranges(self, ranges: Iterable[tuple[str, int, Optional[int]]]) -> None:
        self.ahead.read_ahead_ranges(ranges)

    def at(self, reading: list[str], ahead: list[str]) -> None:
        """This reader is at these files and reads ahead to those (Entry.publish)."""
        self.entry.publish(reading, ahead)

    def close(self) -> None:
        self.entry.close()

    def _quiet_fetch(self, rel: str, lo: int, hi: Optional[int]) -> None:
        try:
            if hi == -1:
                self.fetcher.ensure_head(rel)
            elif lo == 0 and hi is None and self.listing.block_sums(rel) is None:
                self.fetcher.ensure(rel)
            else:
                self.fetcher.ensure_range(rel, lo, hi, fan_out=False)  # (a fetch thread: the others are busy reading ahead too)
        except Exception:
            pass  # the reader fetches it itself, and raises


def _segments_of(bucket: Bucket, man: bytes) -> Optional[dict[str, Any]]:
    """The manifest man if it is a dataset in segments' (format 2), with
    its sha256sums path checked; None if it is of format 1 (or not JSON:
    the reader refuses it, naming it)."""
    try:
        d = json.loads(man.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(d, dict) or d.get("version") != 2:
        return None
    files = d.get("files")
    rel = files.get("sha256sums") if isinstance(files, dict) else None
    if not isinstance(rel, str) or not rel or rel.startswith("/") or ".." in rel.split("/") or "\0" in rel:
        raise ValueError("%s: files.sha256sums %r: want a path inside the dataset" % (bucket.name("dataset.json"), rel))
    return d


class Listing:
    """What the bucket holds of an entry's files: each object's size and
    ETag as first seen (a folder listed once), SHA256SUMS (sums), and each
    folder's BLOCKSUMS, fetched into the entry once and checked."""

    def __init__(self, bucket: Bucket, entry: Entry, room: Room, sums: bytes) -> None:
        self.bucket, self.entry, self.room = bucket, entry, room
        self.sums: dict[str, str] = {}
        for line in sums.decode("utf-8", "replace").splitlines():
            h, _, n = line.partition("  ")
            if len(h) == 64 and n:
                self.sums[n] = h
        self._lock = threading.Lock()
        self.objects: dict[str, tuple[int, str]] = {}  # rel -> (size, etag), as first seen
        self._listed: set[str] = set()  # folders whose objects were listed
        self._sums: dict[str, Optional[BlockSums]] = {}  # epoch folder -> its BLOCKSUMS (None: none)

    def known(self, folder: str) -> Optional[BlockSums]:
        """folder's BLOCKSUMS if it was fetched (None: none, or not yet)."""
        with self._lock:
            return self._sums.get(folder)

    def object(self, rel: str) -> tuple[int, str]:
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
        self.object(rel)  # (lists the folder)
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
        self.object(rel)  # (lists the folder)
        with self._lock:
            listed = self.objects.get(name)
        sums: Optional[BlockSums] = None
        if listed is not None:
            b = None
            dfd, base = self.entry.place(name)
            try:
                b = _read_file(dfd, base, self.entry.local(name), MAX_MANIFEST + MAX_DIGESTS)
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
            self.room.reserve(blocks(len(b)), lambda: self.entry.put(name, b))
        with self._lock:
            self._sums[folder] = sums
        return sums


class ReadAhead:
    """The fetch threads of this process (FETCHERS, made again after a
    fork) and what they fetch ahead of the reader: fetch(rel, lo, hi) of
    each piece of the ranges asked for, in order, once."""

    def __init__(self, listing: Listing, entry: Entry, fetch: Callable[[str, int, Optional[int]], None]) -> None:
        self.listing, self.entry, self.fetch = listing, entry, fetch
        self._ahead: dict[Any, Future[None]] = {}
        self._pool_pid = -1
        self._executor: Optional[ThreadPoolExecutor] = None

    def share(self, work: list[Any], fan_out: bool) -> None:
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
            if r[1] == 0 and r[2] is None and self.listing.known(r[0].rsplit("/", 1)[0]) is None and _is_file(*self.entry.place(r[0]), self.entry.local(r[0])):
                continue  # (a whole file there)
            pool = pool or self._pool()
            self._ahead[r] = pool.submit(self.fetch, *r)
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
            sums = self.listing.known(rel.rsplit("/", 1)[0] if "/" in rel else "")
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

    def _pool(self) -> ThreadPoolExecutor:
        """The fetch threads of this process (made again after a fork)."""
        if self._executor is None or self._pool_pid != os.getpid():
            self._executor = ThreadPoolExecutor(FETCHERS, thread_name_prefix="clipshard-fetch")
            self._pool_pid = os.getpid()
            self._ahead = {}
        return self._executor
