"""The source stage of a materialised epoch: its shard files, on disk
(ShardFiles) or in a bucket read through the node-local cache
(BucketShards: the same files, fetched before they are opened).

Every file is opened inside the epoch's folder as it was when reading
began (pinned), checked against epochs.json before a byte is read (the
header's dtype and shape, every row of the samples file), and asked of
the kernel ahead of the reads (advise). The order stage (_order) says
which rows; the assembly (EpochReader's gather, Loader's read threads)
reads them from the files this stage hands out.
"""
from __future__ import annotations

import json
import mmap
import os
import stat
from typing import Any, Iterable, Mapping, Optional, Union

import numpy as np

from . import _remote
from ._files import Npy, cached, confined, human
from ._manifest import epoch_identity, load_epochs, row_bytes, row_checks
from ._order import ShardOrder

__all__ = ["BucketShards", "ShardFiles", "group_disk_bytes", "open_epochs"]

PIECE = 256 << 10  # bytes asked of the kernel per posix_fadvise call
PROBE_BACKOFF = 64  # ranges asked for without a probe after a probe found one not cached
DATA_AT = 4096  # where a shard file's data starts (docs/FORMAT.md; each file's header is checked when it is opened)


def open_epochs(edir: str, cache_dir: Optional[str] = None, cache_limit: Union[str, int, None] = None) -> tuple[str, Any]:
    """The local folder to read an epochs folder from: edir itself, or, for
    a bucket folder (s3://BUCKET/PREFIX, clipshard push), its entry in the
    node-local cache (a _remote.Remote, returned too; None for a folder)."""
    if _remote.is_url(edir):
        r = _remote.Remote(edir, cache_dir, cache_limit)
        return r.root, r
    if cache_dir is not None or cache_limit is not None:
        raise ValueError("%s: cache_dir and cache_limit are for a bucket (s3://...); a folder is read as it is" % edir)
    return edir, None


class ShardFiles:
    """An epoch's shard files in its folder edir/<entry dir>, as order
    names them (shard position k, file of each name), opened and checked
    on first use and closed once the reader is well past them.

    The folder is pinned when the first file is opened (pinned():
    epochs.json must still describe the epoch as it did when it was
    loaded, and every file is then opened inside that very folder, which
    a rewrite of the epoch replaces: a reader never mixes two versions).

        files = ShardFiles(edir, edir, man, 3, entry, order, expect, mix=1, read=False, prefetch=2)
        files.shard(0)["whisper"]          # an open, checked Npy
    """

    ranged = False  # the rows of a modality fetched as they are read (a bucket's, see BucketShards)
    fetch_batches = 0  # ranged: the rank's batches whose rows are fetched ahead

    def __init__(self, edir: str, url: str, man: Mapping[str, Any], epoch: int, entry: Mapping[str, Any], order: ShardOrder,
                 expect: Mapping[str, tuple[Any, list[int]]], *, mix: int, read: bool, prefetch: int,
                 pin: Optional[tuple[int, int]] = None) -> None:
        self.dir, self.url, self.manifest, self.epoch, self.order = edir, url, man, epoch, order
        self.expect, self.names = expect, list(expect)
        self.mix, self.read, self.prefetch = mix, read, prefetch
        self.identity = epoch_identity(man, epoch)
        self.epoch_dir = confined(edir, entry.get("dir"), "epoch dir")
        self.pin = pin
        self.check_rows = row_checks(edir, man)
        self._shards: dict[int, dict[str, Npy]] = {}  # shard position -> {name: Npy}, checked
        self._files: dict[int, dict[str, Any]] = {}  # shard position -> {name: array-like}
        self._hold: Optional[int] = None  # no shard from this one on is closed (a batch spanning shards: hold)
        self._asked: set[int] = set()  # positions whose batch was asked of the kernel
        self._probe_skip = 0
        if prefetch > 0 and hasattr(os, "posix_fadvise"):
            order.entered = self.advise_block

    def __str__(self) -> str:
        return "ShardFiles(%s, epoch %d, %d shards)" % (self.epoch_dir, self.epoch, len(self.order.shards))

    # -- the hooks a bucket's source fills in ------------------------------

    def fetch(self, k: int) -> None:
        """Make shard position k's files (and those read next) readable
        locally: on disk they are."""

    def refetch(self, k: int, name: str) -> bool:
        """Whether a file found gone was fetched again (a cache's entry
        evicted meanwhile); on disk a file gone is gone."""
        return False

    def check_source(self) -> None:
        """Before pinning: the source still holds the epoch begun."""

    def rows_ready(self, lo: int, hi: int, ahead: Iterable[int] = ()) -> None:
        """The rows of positions [lo, hi) readable locally (and those of
        the positions ahead on their way): on disk they are."""

    # -- opening and checking -------------------------------------------------

    def pinned(self) -> tuple[int, int]:
        """The epoch folder's (st_dev, st_ino), pinned when reading starts:
        epochs.json must then still describe the epoch as it did when it
        was loaded (its epoch_identity), else the folder is being
        rewritten and nothing is read."""
        if self.pin is None:
            self.check_source()
            try:
                st = os.stat(self.epoch_dir)
            except OSError as e:
                raise ValueError("%s: cannot open the epoch's folder: %s" % (self.epoch_dir, e.strerror)) from None
            if not stat.S_ISDIR(st.st_mode):
                raise ValueError("%s: not a folder" % self.epoch_dir)
            try:
                now = epoch_identity(load_epochs(self.dir), self.epoch)
            except ValueError as e:
                raise ValueError("%s: epochs.json cannot be read again as epoch %d starts (a shuffle rewriting the folder?): %s"
                                 % (self.dir, self.epoch, e)) from None
            if now != self.identity:
                raise ValueError("%s: epochs.json no longer describes epoch %d as it did when it was loaded: the folder "
                                 "was rewritten (shuffle --force with other options?); refusing to read a version of "
                                 "the epoch other than the one begun: load the epochs again" % (self.dir, self.epoch))
            self.pin = (st.st_dev, st.st_ino)
        return self.pin

    def hold(self, segs: Iterable[tuple[int, int, int]]) -> None:
        """Keep open every shard of these segments (a batch's, which may
        span many shards) while they are opened and read."""
        self._hold = min((k for k, _, _ in segs), default=None)

    def shard(self, k: int) -> dict[str, Npy]:
        """Shard position k's files, opened inside the epoch folder pinned
        (a folder replaced since is refused, naming the shard) and checked
        against the manifest, the samples' every column too (the files of
        shards well behind, and behind the batch held, are closed)."""
        files = self._shards.get(k)
        if files is not None:
            return files
        floor = k - self.mix if self._hold is None else min(k - self.mix, self._hold)
        for old in [x for x in self._shards if x < floor]:
            self._files.pop(old, None)
            for f in self._shards.pop(old).values():
                f.close()
        self.fetch(k)
        pin = self.pinned()
        try:
            dfd = os.open(self.epoch_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise ValueError("%s: the epoch's folder is gone since epoch %d began (%s): refusing to read another version "
                             "of it" % (self.path(k, "samples"), self.epoch, e.strerror)) from None
        files = {}
        try:
            st = os.fstat(dfd)
            if (st.st_dev, st.st_ino) != pin:
                raise ValueError("%s: the epoch's folder was replaced since epoch %d began (shuffle --force?): refusing "
                                 "to mix two versions of the epoch" % (self.path(k, "samples"), self.epoch))
            for name in self.names:
                files[name] = self._checked(k, name, dfd)
            self.check_rows(files["samples"])
        except BaseException:
            for f in files.values():
                f.close()
            raise
        finally:
            os.close(dfd)
        self._shards[k] = files
        return files

    def _checked(self, k: int, name: str, dfd: int) -> Npy:
        """Shard position k's file of name, opened in the folder dfd and its
        header checked against the manifest."""
        path = self.path(k, name)
        for attempt in range(4):
            try:
                f = Npy(path, dir_fd=dfd)
                break
            except ValueError as e:
                gone = not os.path.lexists(path) or "No such file" in str(e)
                if gone and attempt < 3 and self.refetch(k, name):
                    continue
                if gone:
                    raise ValueError("%s: gone since epoch %d began (the folder is being rewritten?): refusing "
                                     "to read another version of the epoch" % (path, self.epoch)) from None
                raise
        dtype, shape = self.expect[name]
        try:
            f.expect(dtype, [self.order.shards[k]["samples"]] + shape)
        except BaseException:
            f.close()
            raise
        return f

    def open(self, k: int) -> dict[str, Any]:
        """Shard position k's arrays: memory maps of the checked files, or
        with read=True arrays whose slices are read with one preadv."""
        files = self._files.get(k)
        if files is not None:
            return files
        for old in [x for x in self._files if x != k and (self.mix == 1 or x // self.mix != k // self.mix)]:
            del self._files[old]
        checked = self.shard(k)
        files = {}
        for name in self.names:
            f = checked[name]
            files[name] = ReadArray(f) if self.read else f.memmap()
            m = getattr(files[name], "_mmap", None)
            if m is not None and self.prefetch > 0 and hasattr(m, "madvise"):
                # The read-ahead asks for exactly this rank's bytes; the
                # kernel's own read-around on a page fault would also
                # read the other ranks' batches in between (1.15x the
                # time of per-rank files at R=2 and 8; 0.99-1.01x so).
                m.madvise(mmap.MADV_RANDOM)
        self._files[k] = files
        return files

    def path(self, k: int, name: str) -> str:
        rel = self.order.shards[k]["files"][name]
        path = confined(self.dir, rel, "shard file")
        if os.path.dirname(path) != self.epoch_dir:
            raise ValueError("%s: shard file %r is not in the epoch's folder %r" % (self.dir, rel, os.path.basename(self.epoch_dir)))
        return path

    def close(self) -> None:
        """Close every file (they are opened again as they are needed)."""
        self._files = {}
        for files in self._shards.values():
            for f in files.values():
                f.close()
        self._shards = {}

    # -- read-ahead ------------------------------------------------------

    def fds(self, k: int) -> list[tuple[int, int, int]]:
        return [(f.fd, f.offset, f.row) for f in self.shard(k).values()]

    def advise(self, lo: int, hi: int, probe: bool = False) -> None:
        """Ask the kernel for the bytes of positions [lo, hi), once (probe:
        not for bytes the page cache holds; for readers that read with
        preadv, the Loader's, never for memory-mapped batches: see
        advise_one)."""
        if self.mix > 1 or lo in self._asked:
            return  # (a mixed block is asked for whole when it is first entered)
        self._asked.add(lo)
        for k, a, b in self.order.segments(lo, hi):
            for fd, off, row in self.fds(k):
                self.advise_one(fd, off + a * row, off + b * row, probe)

    def advise_block(self, first: int, last: int) -> None:
        """Ask the kernel for shard positions [first, last) whole (a mixed
        block as it is entered)."""
        for k in range(first, last):
            for fd, off, row in self.fds(k):
                self.advise_one(fd, off, off + self.order.shards[k]["samples"] * row)

    def advise_one(self, fd: int, a: int, b: int, probe: bool = False) -> None:
        """Ask the kernel for bytes [a, b) of fd; with probe, unless the
        page cache holds them (asking for cached pages walks them all: a
        fifth of a warm epoch's time). The probe (_files.cached: 1-byte
        RWF_NOWAIT reads) runs while probes find the bytes there; after a
        miss the next PROBE_BACKOFF ranges are asked for unprobed (a probe of a
        page the cache lacks starts a read of it, out of order). Never
        for memory-mapped batches: their maps are MADV_RANDOM, and a
        range whose ends are cached but not its middle would be faulted
        in a page at a time (a cold epoch read per rank took 1.5x as
        long, at times 4x, probing: docs/BENCHMARKS-HISTORY.md, "The trainer's
        read"); a preadv of such a range reads what is missing at once."""
        if probe:
            if self._probe_skip:
                self._probe_skip -= 1
            elif cached(fd, a, b - a):
                return
            else:
                self._probe_skip = PROBE_BACKOFF
        for p in range(a, b, PIECE):
            os.posix_fadvise(fd, p, min(PIECE, b - p), os.POSIX_FADV_WILLNEED)


class BucketShards(ShardFiles):
    """ShardFiles of an epochs folder in a bucket (clipshard push), read
    through its entry in the node-local cache (remote, a _remote.Remote):
    each shard group is fetched before its files are opened, the groups
    after it in the background. Whole files, or ranged (rows as they are
    read: rows_ready) when other nodes' ranks read the rest of each
    shard."""

    def __init__(self, remote: Any, *args: Any, rank: int, world_size: int, batch_size: int, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.remote = remote
        self.batch_size = batch_size
        shards = self.order.shards
        # The read-ahead of a bucket's shards: this many groups past the
        # one being read are fetched in the background; the cache must
        # hold them and the one being read, and one more.
        self.fetch_ahead = max(2, self.mix)
        self.fetch_batches = 4  # ranged: this rank's batches whose rows are fetched ahead
        first_file = shards[0]["files"]["samples"] if shards else None
        sums_size = remote.block_sums_size(first_file) if first_file else 0
        per = group_disk_bytes(shards, self.expect)
        extra = remote.manifest_bytes + (_remote.blocks(sums_size) if sums_size else 0)
        need = (self.fetch_ahead + 2) * per + extra
        if remote.cache.limit < need:
            raise ValueError("cache_limit %s is too small for this epoch's read-ahead: it holds, per reader, %d shard groups "
                             "(the one read, %d ahead, one more being fetched) of up to %s each, and the manifests' %s: give "
                             "cache_limit >= %s (%d bytes) per reader sharing it (ranks x DataLoader workers), or cut smaller "
                             "shards (shuffle --shard-samples: a group is --shard-samples samples of every modality)" % (
                                 human(remote.cache.limit), self.fetch_ahead + 2, self.fetch_ahead, human(per), human(extra),
                                 human(need, up=True), need))
        sums = remote.block_sums(first_file) if first_file else None
        self.node = node_ranks(rank, world_size)
        # Ranged when the ranks of other nodes read the rest of each
        # shard: whole files when this node reads all of it anyway (one
        # rank, or all of them here) or mixing scatters a rank's samples
        # over whole shards.
        self.ranged = sums is not None and self.mix == 1 and self.node[0] < world_size

    def fetch(self, k: int) -> None:
        """Shard group k (and the groups after it, in the background) into
        the cache, first saying which this reader keeps (every group it
        has open, and the epoch's BLOCKSUMS): whole files, or, ranged, the
        samples files and the modalities' headers (their rows come as
        they are read: rows_ready)."""
        r, shards = self.remote, self.order.shards
        ahead = range(k, min(len(shards), k + 1 + self.fetch_ahead))
        groups = [[shards[j]["files"][n] for n in self.names] for j in ahead]
        keep = [shards[j]["files"][n] for j in sorted(set(self._shards) | {k}) for n in self.names]
        r.at(keep + [shards[k]["files"]["samples"].rsplit("/", 1)[0] + "/" + _remote.BLOCKSUMS],
             [rel for g in groups[1:] for rel in g])
        if not self.ranged:
            # Every piece of these groups queued for the fetch threads in
            # the order they are read, this one's first; this thread then
            # takes what none has taken yet, or waits for it.
            r.read_ahead(groups)
            for rel in groups[0]:
                r.ensure(rel)
            return
        for rel in groups[0]:
            self._fetch_head(rel)
        r.read_ahead_ranges([(rel, 0, None if rel.endswith(".samples.npy") else -1) for g in groups[1:] for rel in g])

    def _fetch_head(self, rel: str) -> None:
        """Ranged: what opening shard file rel reads: a samples file whole
        (its every row is checked), a modality's header."""
        if rel.endswith(".samples.npy"):
            self.remote.ensure(rel)
        else:
            self.remote.ensure_head(rel)

    def refetch(self, k: int, name: str) -> bool:
        # A cache entry evicted by another local reader meanwhile: fetched
        # again (the same version, checked).
        rel = self.order.shards[k]["files"][name]
        self._fetch_head(rel) if self.ranged else self.remote.ensure(rel)
        return True

    def rows_ready(self, lo: int, hi: int, ahead: Iterable[int] = ()) -> None:
        """Ranged: the modalities' rows of positions [lo, hi) (this node's
        slice of that global batch, with LOCAL_WORLD_SIZE) fetched into the
        shard files this reader has open, and those of the batches at the
        positions ahead in the background."""
        if not self.ranged:
            return
        r, B, shards = self.remote, self.batch_size, self.order.shards
        L, mine = self.node
        modalities = [n for n in self.names if n != "samples"]
        for k, a, b in self.order.segments(lo - mine * B, lo - mine * B + L * B):
            files = self.shard(k)
            for name in modalities:
                f = files[name]
                r.ensure_range(shards[k]["files"][name], f.offset + a * f.row, f.offset + b * f.row, os.fstat(f.fd).st_ino)
        rows = {name: row_bytes(*self.expect[name]) for name in modalities}
        later = []
        for p in ahead:
            for k, a, b in self.order.segments(p - mine * B, p - mine * B + L * B):
                for name in modalities:
                    later.append((shards[k]["files"][name], DATA_AT + a * rows[name], DATA_AT + b * rows[name]))
        if later:
            r.read_ahead_ranges(later)

    def check_source(self) -> None:
        """The bucket's epochs.json still describes the epoch begun; the
        cache's folder of the epoch made (its files come as fetched)."""
        try:
            now = epoch_identity(json.loads(self.remote.check_current()), self.epoch)
        except (ValueError, OSError, RecursionError) as e:
            raise ValueError("%s: epochs.json cannot be read again as epoch %d starts: %s" % (self.url, self.epoch, e)) from None
        if now != self.identity:
            raise ValueError("%s: epochs.json no longer describes epoch %d as it did when it was loaded (the bucket's "
                             "epochs were replaced, push --force?): load the epochs again" % (self.url, self.epoch))
        os.makedirs(self.epoch_dir, exist_ok=True)

    def close(self) -> None:
        super().close()
        self.remote.close()  # (keeps nothing in the cache any more)


def group_disk_bytes(shards: list[dict[str, Any]], expect: Mapping[str, tuple[Any, list[int]]]) -> int:
    """What a full shard group's files (expect: name -> (dtype, shape of
    a sample)) take on disk in a cache: each its header (data at 4096)
    and data, in whole 4 KiB blocks, and its marks (a block)."""
    n = max((s["samples"] for s in shards), default=1)
    return sum(_remote.blocks(DATA_AT + n * row_bytes(dtype, shape)) + 4096 for dtype, shape in expect.values())


def node_ranks(rank: int, world_size: int) -> tuple[int, int]:
    """(ranks on this node, this rank's place among them), as torchrun
    numbers and tells them: LOCAL_WORLD_SIZE consecutive ranks a node,
    LOCAL_RANK this one's place (both set and agreeing with rank, else
    this rank alone)."""
    try:
        L, mine = int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    except (KeyError, ValueError):
        return 1, 0
    if L < 1 or world_size % L or not 0 <= mine < L or rank % L != mine:
        return 1, 0
    return L, mine


class ReadArray:
    """A checked shard file whose [i:j] slices are read with os.preadv
    into a new array (one call, unless the kernel returns less)."""

    def __init__(self, f: Npy) -> None:
        self.f = f

    def __getitem__(self, sl: slice) -> np.ndarray:
        f = self.f
        out = np.empty((sl.stop - sl.start,) + tuple(f.shape[1:]), dtype=f.dtype)
        view = memoryview(out).cast("B")  # type: ignore[arg-type]
        off, got = f.offset + sl.start * f.row, 0
        while got < len(view):
            n = os.preadv(f.fd, [view[got:]], off + got)
            if not n:
                raise ValueError("%s: shorter than its header says (changed since it was checked?)" % f.path)
            got += n
        return out
