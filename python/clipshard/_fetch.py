"""The fetches of one cache entry's files from the bucket (Fetcher): a
shard file a block range at a time into a sparse file of its full size,
each block checked against BLOCKSUMS before its mark (NAME.have, a byte a
block) is set, under an open-file-description lock of that range of the
marks (one fetch per node); or whole (a folder without BLOCKSUMS), under
flock of NAME.lock, checked against SHA256SUMS before it is renamed in.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import random
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional

from ._bucket import HEAD, PIECE, BlockSums, Bucket
from ._cache import _cache_error, _is_file, _name_lock, _name_unlock, _open_file, _range_lock, _runs, _sweep, _write_new, blocks
from ._entry import Entry
from ._room import Room

if TYPE_CHECKING:
    from ._remote import Listing

__all__ = ["Fetcher"]


class Fetcher:
    """Fetches of entry's files (listing: what the bucket holds of them and
    their sums) within room's bound; share(work, fan_out) runs a list of
    calls, on the process's fetch threads too. dataset: a dataset read by
    blocks (its files that BLOCKSUMS does not list are fetched whole).

        f = Fetcher(bucket, entry, listing, room, share, dataset=False)
        f.ensure_range("epoch-0003/shard-000000.whisper.npy", 4096, 1 << 20)
    """

    def __init__(self, bucket: Bucket, entry: Entry, listing: "Listing", room: Room,
                 share: Callable[[list[Any], bool], None], dataset: bool) -> None:
        self.bucket, self.entry, self.listing, self.room, self.share, self.dataset = bucket, entry, listing, room, share, dataset
        self._lock = threading.Lock()
        self._fetched = 0
        self.whole = WholeFiles(bucket, entry, listing, room)

    @property
    def fetched(self) -> int:
        """Bytes of files this process fetched (received) into the cache."""
        return self._fetched + self.whole.fetched

    def __str__(self) -> str:
        return "Fetcher(%s into %s)" % (self.bucket.url, self.entry.root)

    def ensure(self, rel: str) -> str:
        """The local path of shard file rel, whole in the cache (fetched
        once per node and checked, if it is not there)."""
        sums = self.listing.block_sums(rel)
        if sums is not None and (rel in sums.files or not self.dataset):
            self.ensure_range(rel, 0, None)
            return self.entry.local(rel)
        p = self.entry.local(rel)
        if _is_file(*self.entry.place(rel), p):
            return p
        # (a fetch thread reading it ahead holds its lock: _fetch_whole
        # waits for that and finds it there)
        self.whole.fetch(rel)
        return p

    def ensure_range(self, rel: str, lo: int, hi: Optional[int], ino: Optional[int] = None, fan_out: bool = True) -> None:
        """Bytes [lo, hi) of shard file rel (hi None: to its end) fetched
        into its cache file and checked, block by block (BLOCKSUMS). With
        ino, the cache file must be that one (the one a reader has open:
        a reader's files are never evicted, this checks it)."""
        sums = self.listing.block_sums(rel)
        if sums is None or (rel not in sums.files and self.dataset):
            self.ensure(rel)
            return
        size, sha, _ = sums.files.get(rel, (-1, "", 0))
        if size < 0:
            raise ValueError("%s: BLOCKSUMS does not list it: its bytes cannot be checked" % self.bucket.name(rel))
        osize, etag = self.listing.object(rel)
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
                                     "holes" % self.entry.local(rel))
                marks = os.pread(have, i1 - i0, i0)
                if len(marks) != i1 - i0:
                    raise ValueError("%s: its marks are short" % self.entry.local(rel) + ".have")
                if all(marks):
                    return
                # The missing runs in pieces of up to PIECE bytes, fetched
                # by this thread and, with fan_out, this process's fetch
                # threads as they are free.
                step = max(1, PIECE // K)
                pieces = [(c, min(c + step, b)) for a, b in _runs(marks, i0) for c in range(a, b, step)]
                self.share([lambda a=a, b=b: self._fetch_piece(rel, fd, have, sums, size, etag, a, b) for a, b in pieces], fan_out)
                return
            finally:
                os.close(fd)
                os.close(have)
        raise ValueError("%s: evicted again and again while it was being fetched: raise cache_limit" % self.entry.local(rel))

    def ensure_head(self, rel: str) -> None:
        """The head of shard file rel (its first HEAD bytes: the .npy
        header, what opening it reads) fetched into its cache file and
        checked against BLOCKSUMS; its mark is the marks' last byte (a
        rank whose slices miss the first block fetches 4 KiB, not a
        block). A file of one block: that block. Without BLOCKSUMS: the
        file whole."""
        sums = self.listing.block_sums(rel)
        if sums is None or (rel not in sums.files and self.dataset):
            self.ensure(rel)
            return
        size, _, _ = sums.files.get(rel, (-1, "", 0))
        if size < 0:
            raise ValueError("%s: BLOCKSUMS does not list it: its bytes cannot be checked" % self.bucket.name(rel))
        if size <= sums.block:
            self.ensure_range(rel, 0, size)  # a file of one block: that block (a reader of any row needs it)
            return
        osize, etag = self.listing.object(rel)
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
                    self.room.reserve(4096 + 4096, lambda: os.posix_fallocate(fd, 0, k) if k else None)
                    b = self.bucket.range(rel, 0, k, etag)
                    with self._lock:
                        self._fetched += k
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
        raise ValueError("%s: evicted again and again while it was being fetched: raise cache_limit" % self.entry.local(rel))

    def _sparse(self, rel: str, size: int, n: int) -> tuple[int, int]:
        """fds of rel's cache file (its full size, holes where nothing was
        fetched) and of its marks (NAME.have: a byte a block, then one for
        the head), made if they are not there: the marks first, so that a
        data file is never without them."""
        dfd, name = self.entry.place(rel)
        p = self.entry.local(rel)
        try:
            return _open_pair(dfd, name, p)
        except FileNotFoundError:
            pass
        fd = _name_lock(dfd, name, p)
        try:
            try:
                return _open_pair(dfd, name, p)
            except FileNotFoundError:
                pass
            for q in (name, name + ".have"):
                if _is_file(dfd, q, os.path.join(os.path.dirname(p), q)):  # (anything else there: refused)
                    os.unlink(q, dir_fd=dfd)  # (one without the other: what an eviction or a death left)
            _sweep(dfd, name)

            def marks() -> None:
                _write_new(dfd, name + ".have", bytes(n + 1), p + ".have")
            self.room.reserve(blocks(n + 1), marks)
            tmp = "%s.tmp.%d.%d" % (name, os.getpid(), random.getrandbits(32))
            t = _open_file(dfd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, p)
            try:
                os.ftruncate(t, size)
            finally:
                os.close(t)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            return _open_pair(dfd, name, p)
        finally:
            _name_unlock(dfd, name, fd)

    def _fetch_piece(self, rel: str, data: int, have: int, sums: BlockSums, size: int, etag: str, a: int, b: int) -> None:
        """Blocks [a, b) of rel, if still unmarked once their range of the
        marks is locked: room taken (allocated) for them, fetched, written
        as they come, each block checked against BLOCKSUMS and then marked
        (only a checked block is ever marked)."""
        dfd, name = self.entry.place(rel)
        fd = _open_file(dfd, name, os.O_RDWR, self.entry.local(rel))
        try:
            mine = _open_file(dfd, name + ".have", os.O_RDWR, self.entry.local(rel) + ".have")  # (an open of its own: its lock is its own)
        except BaseException:
            os.close(fd)
            raise
        try:
            if os.fstat(mine).st_ino != os.fstat(have).st_ino or os.fstat(fd).st_ino != os.fstat(data).st_ino:
                raise ValueError("%s: replaced in the cache while it was being fetched (evicted?): raise cache_limit" % self.entry.local(rel))
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
        self.room.reserve(-(-(hi - lo) // 4096) * 4096 + 4096, lambda: os.posix_fallocate(fd, lo, hi - lo))
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
            self._fetched += hi - lo


class WholeFiles:
    """Files of a folder without BLOCKSUMS (or a dataset's files it does
    not list), fetched whole."""

    def __init__(self, bucket: Bucket, entry: Entry, listing: "Listing", room: Room) -> None:
        self.bucket, self.entry, self.listing, self.room = bucket, entry, listing, room
        self._lock = threading.Lock()
        self.fetched = 0  # bytes fetched (received) into the cache

    def fetch(self, rel: str) -> None:
        """A file of a folder without BLOCKSUMS: fetched whole by whoever
        holds NAME.lock, into NAME.tmp.PID.RAND, checked against
        SHA256SUMS, then renamed (the others wait for the name)."""
        p = self.entry.local(rel)
        want = self.listing.sums.get(rel)
        if want is None:
            raise ValueError("%s: SHA256SUMS does not list it: its bytes cannot be checked" % self.bucket.name(rel))
        dfd, name = self.entry.place(rel)
        lock = _name_lock(dfd, name, p)  # another process fetching it: wait for its rename (or its death)
        try:
            if _is_file(dfd, name, p):
                return
            _sweep(dfd, name)  # the lock is ours: what a fetcher of it left when it died goes
            size, etag = self.listing.object(rel)
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
            self.room.reserve(blocks(size), allocate)
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
            _name_unlock(dfd, name, lock)


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
