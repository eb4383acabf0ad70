"""Epochs drawn at read time from a dataset (no epoch files, no shuffle
run, no storage beyond the dataset): fresh window offsets every epoch,
read a block of consecutive frames at a time.

An epoch's order is a deterministic function of the sources (their
index.npy), the options and the epoch (docs/FORMAT.md, "Epochs drawn at
read time"), independent of the ranks, workers and threads that read it:

1. Each source's windows are drawn as `shuffle` draws them (tile or
   random, per-clip counts, short clips padded or skipped), from a
   counter-based hash of (seed, epoch) instead of Go's PCG.
2. The source's frames are cut into blocks of `block_frames` consecutive
   frames (see Drawn's block and buffer), the blocks permuted, and the
   permutation cut into groups of `group_blocks` blocks; a window belongs
   to the block its first frame lies in.
3. The source's order: group after group, each group's windows in a
   seeded random order. Several sources are mixed by their weights into
   one order as `shuffle --source` mixes them (counts by largest
   remainder, more passes for a source that gives more than its windows,
   each source spread evenly along the epoch).

A rank reads its share of the epoch as one contiguous stretch of that
order (so each group is read by about one rank: cluster egress about
once the epoch's bytes), a group at a time: each block of each streamed
modality asked of the kernel as one sequential read, the windows then
copied from the page cache (a gather from a memory map of each blob).
Small modalities (at most `hold` bytes) are read whole, once, and checked
against the dataset's SHA256SUMS.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from typing import Any, Callable, Iterator, Literal, Mapping, NamedTuple, Optional, Sequence, Union

import numpy as np

from . import _remote
from ._files import (MAX_MANIFEST, Npy, cached as _cached, clip_starts, confined, dataset_modality, dataset_top, memory_limit, open_regular,
                     pread_all, pread_into)
from .epochs import _check_rank_args, _size, _worker

__all__ = ["Drawn", "DrawnReader"]

STATE_FORMAT = "clipshard.drawn"
STATE_VERSION = 1

GAMMA = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1
SALT = 0x636C697073686172  # "clipshar"
TAG_OFFSETS, TAG_BLOCKS, TAG_ORDER, TAG_MERGE = 1, 2, 3, 4
READ = 8 << 20  # bytes of the widest modality a block holds at most with block="auto"
MIN_READ = 256 << 10  # and at least (a read the disk, the network or the bucket does well)
CLIPS = 2048  # blocks a group holds with block="auto", within those bounds
SAMPLE = 32  # ranges of a group probed first: all of them in the page cache, the group is not asked for
PARTS = 2  # a group's read is asked for by this many threads at once, each a part of its ranges in order
CHUNK = 4 << 20  # bytes of gather indices a reader makes at once, for as many batches as they hold (at least one)
BUFFER = 2 << 30  # default bytes a source's groups take in the page cache (two groups)
HOLD = 64 << 20  # default: modalities of at most this many bytes of data are held whole


# -- the hash -------------------------------------------------------------


def _mix_int(z: int) -> int:
    """splitmix64's finalizer on a Python int."""
    z &= MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise on uint64 (wrapping)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def key(seed: int, epoch: int, tag: int) -> int:
    """The key of one stream: mix(mix(mix(seed ^ SALT) ^ epoch) ^ tag)."""
    return _mix_int(_mix_int(_mix_int((seed & MASK) ^ SALT) ^ (epoch & MASK)) ^ tag)


def stream(k: int, index: np.ndarray) -> np.ndarray:
    """The uint64 numbers of stream k at these indices: mix(k + (i+1)*GAMMA)."""
    i = np.asarray(index).astype(np.uint64) + np.uint64(1)
    return _mix(i * np.uint64(GAMMA) + np.uint64(k))


def below(u: np.ndarray, n: np.ndarray) -> np.ndarray:
    """min(n-1, floor(((u >> 11) * 2**-53) * n)) in float64: a number in
    [0, n) from u (n >= 1)."""
    f = (u >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return np.minimum(np.asarray(n, dtype=np.int64) - 1, np.floor(f * n).astype(np.int64))


# -- one source's windows, blocks and groups --------------------------------


def draw(lengths: np.ndarray, window: int, sampling: str, per_clip: int, short: str, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A source's windows of one pass (epoch: e | pass << 32), in clip
    order: (clip row, start frame in the clip, valid frames)."""
    L = np.asarray(lengths, dtype=np.int64)
    W = int(window)
    n = len(L)
    long = L >= W
    k = key(seed, epoch, TAG_OFFSETS)
    rows = np.arange(n, dtype=np.int64)
    if sampling == "tile":
        span = np.where(long, np.minimum(W, L - W + 1), 1)
        off = np.where(long, below(stream(k, rows), span), 0)
        count = np.where(long, (L - off) // W, 0)
    else:
        off = np.zeros(n, dtype=np.int64)
        count = np.where(long, int(per_clip), 0)
    count = count + ((~long) & (L > 0) & (short == "pad"))
    clip = np.repeat(rows, count)
    first = np.cumsum(count) - count
    j = np.arange(len(clip), dtype=np.int64) - np.repeat(first, count)  # the window's number in its clip
    lc = L[clip]
    lg = lc >= W
    if sampling == "tile":
        start = np.where(lg, off[clip] + j * W, 0)
    else:
        start = np.where(lg, below(stream(k, clip * int(per_clip) + j), np.maximum(lc - W + 1, 1)), 0)
    valid = np.where(lg, W, lc)
    return clip, start.astype(np.int64), valid.astype(np.int64)


def order_blocks(nblocks: int, seed: int, epoch: int) -> np.ndarray:
    """The blocks in their seeded order (by their stream numbers, then
    number)."""
    idx = np.arange(nblocks, dtype=np.int64)
    return np.lexsort((idx, stream(key(seed, epoch, TAG_BLOCKS), idx)))


class _Pass:
    """One pass of one source in an epoch: its windows in their order,
    and its groups."""

    __slots__ = ("clip", "start", "valid", "gs", "group", "groups")

    def __init__(self, src: "_Source", plan: "Drawn", seed: int, epoch: int) -> None:
        clip, start, valid = draw(src.lengths, plan.window, plan.sampling, plan.per_clip, plan.short, seed, epoch)
        gs = src.starts[clip] + start  # the window's first frame in the blob
        blk = gs // src.block_frames
        perm = order_blocks(src.blocks, seed, epoch)
        pos = np.empty(src.blocks, dtype=np.int64)
        pos[perm] = np.arange(src.blocks, dtype=np.int64)
        qb = pos // src.group_blocks  # each block's group
        q = qb[blk]
        w = stream(key(seed, epoch, TAG_ORDER), np.arange(len(clip), dtype=np.int64))
        o = np.lexsort((np.arange(len(clip)), w, q))
        # (26 bytes a window: an epoch's order of 10 million windows takes 260 MB)
        self.clip, self.start, self.valid = clip[o].astype(np.int32), start[o].astype(np.int32), valid[o].astype(np.int32)
        self.gs, self.group = gs[o], q[o].astype(np.int32)
        G = src.group_blocks
        self.groups = [np.sort(perm[a: a + G]) for a in range(0, src.blocks, G)]


# -- the sources --------------------------------------------------------------


class _Source:
    """A dataset read by blocks: checked (dataset.json, index.npy, every
    blob's header), its small modalities held in memory (checked against
    SHA256SUMS), its fds kept for the block reads. A bucket's (s3://) is
    read through a node-local cache entry."""

    def __init__(self, i: int, name: str, where: str, plan: "Drawn") -> None:
        self.i, self.name, self.url = i, name, where
        self.remote: Any = None
        path = where
        if _remote.is_url(where):
            self.remote = _remote.Remote(where, plan.cache_dir, plan.cache_limit, manifest="dataset.json")
            path = self.remote.root
        elif plan.cache_dir is not None or plan.cache_limit is not None:
            raise ValueError("%s: cache_dir and cache_limit are for a bucket (s3://...); a folder is read as it is" % where)
        self.dir = path
        if not os.path.lexists(os.path.join(path, "dataset.json")) and os.path.lexists(os.path.join(path, "epochs.json")):
            raise ValueError("%s is an epochs folder (it holds epochs.json), not a dataset: give Loader(edir) the epochs "
                             "folder, or Loader(dataset=...) the folder convert wrote" % where)
        raw = self._bytes("dataset.json")
        self.sha = hashlib.sha256(raw).hexdigest()
        try:
            man = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise ValueError("%s: dataset.json: not JSON: %s" % (where, e)) from None
        files, mods, clips, frames = dataset_top(where, man)
        self.clips, self.frames = clips, frames
        if self.remote is not None:
            self._room(files, mods)
        self.sums = self._sums(files.get("sha256sums"))
        rel = files.get("index")
        idx = self._open(rel, "files.index")
        try:
            idx.expect("<i8", [clips, 2])
            index = self._whole(idx, str(rel))
        finally:
            idx.close()
        self.starts, self.lengths = clip_starts(index, frames, idx.path)
        # The modalities: (name, dtype, frame shape, rate, per_clip), each
        # blob's header checked; the small ones read whole.
        self.mods: list[dict[str, Any]] = []
        self.files: dict[str, Npy] = {}
        self.held: dict[str, np.ndarray] = {}  # name -> rows (and a zero row past the end)
        self.maps: dict[str, np.ndarray] = {}  # name -> a streamed blob's rows mapped, uint8 [rows, row bytes] (read=False)
        hold = plan.hold
        try:
            for m in mods:
                name, per, rate, frame = dataset_modality(where, m, self.files, ("samples",))
                try:
                    dtype = np.dtype(m.get("dtype"))
                except (TypeError, ValueError) as e:
                    raise ValueError("%s: dataset.json: modality %r: dtype: %s" % (where, name, e)) from None
                rows = clips if per else frames * rate
                f = self._open(m.get("file"), "modality %r file" % name)
                self.files[name] = f
                f.expect(m.get("dtype"), [rows] + frame)
                if f.offset != m.get("data_offset"):
                    raise ValueError("%s: data at offset %d, dataset.json says %r" % (f.path, f.offset, m.get("data_offset")))
                if dtype.byteorder == ">":
                    raise ValueError("%s: dtype %s: big-endian (convert writes little-endian)" % (f.path, dtype.str))
                rec = dict(name=name, dtype=dtype.str, frame=tuple(frame), rate=rate, per_clip=per, file=m.get("file"),
                           row=f.row, frame_bytes=f.row * max(rate, 1))
                rec["held"] = per or f.size - f.offset <= hold
                if not per and f.row == 0:
                    raise ValueError("%s: modality %r: frame shape %s holds no values (windows of nothing; not a file "
                                     "convert wrote)" % (f.path, name, frame))
                self.mods.append(rec)
            if all(r["per_clip"] for r in self.mods):
                raise ValueError("%s: every modality is per clip: no frames to cut windows from" % where)
            for rec in self.mods:
                f = self.files[rec["name"]]
                if rec["held"]:
                    a = self._whole(f, rec["file"])
                    self.held[rec["name"]] = np.concatenate([a, np.zeros((1,) + a.shape[1:], dtype=a.dtype)])
        except BaseException:
            self.close()
            raise
        # The geometry (FORMAT.md): frames per block, blocks per group.
        streamed = [r["frame_bytes"] for r in self.mods if not r["held"]]
        if not streamed:
            self.block_frames, self.group_blocks = max(1, frames), 1  # everything held: one block
        else:
            per_frame, widest = sum(streamed), max(streamed)
            group_frames = plan.buffer // 2 // per_frame
            if plan.block is None:  # "auto": many blocks a group, reads of at most READ bytes, a window at least
                bf = max(plan.window, min(-(-READ // widest), max(-(-MIN_READ // widest), group_frames // CLIPS)))
            else:
                bf = -(-plan.block // widest)
            self.block_frames = max(1, bf)
            self.group_blocks = plan.group if plan.group else max(1, group_frames // self.block_frames)
        self.blocks = -(-frames // self.block_frames) if frames else 0

    # -- checked reading of the dataset's files ----------------------------

    def _room(self, files: Mapping[str, Any], mods: list[Any]) -> None:
        """A bucket's dataset: its files are kept in the cache while epochs
        are drawn (published as read: never evicted), so the cache must
        hold them all."""
        rels = [r for r in (files.get("index"), files.get("ids")) if isinstance(r, str)]
        rels += [str(m["file"]) for m in mods if isinstance(m, dict) and isinstance(m.get("file"), str)]
        for r in rels:
            confined(self.dir, r, "file")
        need = self.remote.manifest_bytes + sum(_remote.blocks(self.remote._object(r)[0]) for r in rels)
        if self.remote.cache.limit < need:
            raise ValueError("cache_limit %d bytes cannot hold %s's files (%d bytes with the manifests): epochs drawn from a "
                             "bucket keep the dataset's blocks in the node-local cache as they are read (none is evicted "
                             "while epochs are drawn): give cache_limit >= %d" % (self.remote.cache.limit, self.url, need, need))
        self.remote.at(rels, [])

    def _bytes(self, rel: str) -> bytes:
        if self.remote is not None:
            self.remote.ensure(rel)
        p = confined(self.dir, rel, rel)
        fd, st = open_regular(p)
        try:
            if st.st_size > MAX_MANIFEST:
                raise ValueError("%s: %d bytes, more than a manifest may have" % (p, st.st_size))
            return pread_all(fd, st.st_size, 0, p)
        finally:
            os.close(fd)

    def _sums(self, rel: Any) -> dict[str, str]:
        if not rel:
            return {}
        out = {}
        for line in self._bytes(rel).decode("utf-8", "replace").splitlines():
            h, _, n = line.partition("  ")
            if len(h) == 64 and n:
                out[n] = h
        return out

    def _open(self, rel: Any, what: str) -> Npy:
        p = confined(self.dir, rel, what)
        if self.remote is not None:
            self.remote.ensure_head(rel)
        return Npy(p)

    def _whole(self, f: Npy, rel: str) -> np.ndarray:
        """f's whole array, read once (a bucket's: fetched, checked), and
        checked against SHA256SUMS when the dataset lists it."""
        if self.remote is not None:
            self.remote.ensure_range(rel, 0, None)
        b = pread_all(f.fd, f.size, 0, f.path)
        if len(b) != f.size:
            raise ValueError("%s: shorter than when it was checked" % f.path)
        want = self.sums.get(rel)
        if want is not None and hashlib.sha256(b).hexdigest() != want:
            raise ValueError("%s: sha256 %s, the dataset's SHA256SUMS says %s (changed since convert wrote it)" % (
                f.path, hashlib.sha256(b).hexdigest(), want))
        return np.frombuffer(b, dtype=f.dtype, offset=f.offset).reshape(f.shape)

    def streamed_bytes(self) -> int:
        """Bytes of the blobs a drawn epoch reads (not held)."""
        return sum(self.files[r["name"]].size for r in self.mods if not r["held"])

    def map_streamed(self, strict: bool) -> None:
        """The streamed blobs' rows mapped (read=False). A blob the file
        system cannot map (some FUSE and network mounts: ENODEV) is read a
        pread a window instead, or with strict (read=False given) raises,
        naming it."""
        for rec in self.mods:
            if not rec["held"] and rec["name"] not in self.maps:
                f = self.files[rec["name"]]
                try:
                    # (through the fd checked: the file checked is the file mapped)
                    m = f.memmap()
                except OSError as e:  # (named: Npy.memmap)
                    if strict:
                        raise ValueError("%s; read=False was given" % e.strerror) from None
                    continue
                self.maps[rec["name"]] = m.view(np.uint8).reshape(f.shape[0], f.row)

    def signature(self) -> list[Any]:
        return [(r["name"], r["dtype"], list(r["frame"]), r["rate"], r["per_clip"]) for r in self.mods]

    def close(self) -> None:
        self.maps = {}  # (unmapped when the last batch being filled lets go of them)
        for f in self.files.values():
            f.close()
        self.files = {}
        if self.remote is not None:
            self.remote.close()


# -- the plan: what every epoch shares -----------------------------------------


def _weights_at(schedule: Any, names: list[str], epoch: int) -> Optional[list[Fraction]]:
    """The weights of epoch (in source order), None for natural."""
    if schedule is None:
        return None
    if isinstance(schedule, Mapping):
        schedule = [{"from": 0, "weights": schedule}]
    for r in schedule:
        lo, hi = r.get("from", 0), r.get("to")
        if lo <= epoch and (hi is None or hi == 0 or epoch < hi):
            w = r["weights"]
            return [Fraction(str(w.get(n, 0))) for n in names]
    raise ValueError("weights: no range of the schedule covers epoch %d" % epoch)


def _check_schedule(schedule: Any, names: list[str]) -> Any:
    if schedule is None:
        return None
    rs = [{"from": 0, "weights": schedule}] if isinstance(schedule, Mapping) else list(schedule)
    out = []
    for r in rs:
        if not isinstance(r, Mapping) or not isinstance(r.get("weights"), Mapping):
            raise ValueError("weights %r: want {name: weight}, or a list of {'from': E, 'to': E, 'weights': {name: weight}}" % (schedule,))
        lo, hi = r.get("from", 0), r.get("to")
        if type(lo) is not int or lo < 0 or (hi is not None and (type(hi) is not int or (hi and hi <= lo))):
            raise ValueError("weights: range %r: want 0 <= from < to (to left out: no end)" % (r,))
        w = {}
        weights: Any = r["weights"]
        for n, x in weights.items():
            if n not in names:
                raise ValueError("weights: %r is not a source (have %s)" % (n, names))
            try:
                f = Fraction(str(x))
            except (ValueError, ZeroDivisionError):
                raise ValueError("weights: %s=%r is not a number" % (n, x)) from None
            if f < 0 or isinstance(x, bool):
                raise ValueError("weights: %s=%r: want a number >= 0" % (n, x))
            w[n] = str(x)
        if not any(Fraction(v) > 0 for v in w.values()):
            raise ValueError("weights: range %r gives no source a weight" % (r,))
        out.append({"from": lo, "to": hi, "weights": w})
    return out


class Drawn:
    """The epochs of one or more datasets drawn at read time (see the
    module doc): the sources, checked, and the options every epoch
    shares. clipshard.Loader(dataset=...) makes one; order(epoch) is an
    epoch's whole order.

    dataset: a dataset folder or s3:// URL, or {name: folder or URL} to
        mix several (names of [A-Za-z0-9_.-], the batches' "source"
        numbers in this order).
    window, sampling ("tile" or "random"), per_clip (random: windows per
        clip), short ("pad" or "skip"), seed: as shuffle's.
    weights, epoch_samples: mixing, as shuffle --weights/--epoch-samples:
        {name: weight} for every epoch, or a list of {"from": E, "to": E,
        "weights": {...}} (to left out: no end); None is natural (each
        source its own windows).
    buffer: bytes of the page cache (or the bucket's node-local cache) a
        source's groups take ("2GiB"): a group is half of it (the one read,
        and the next read ahead). The process holds no block of its own:
        windows are copied from the page cache into the batches (see
        read).
    block: "auto" (default): blocks of as many frames as make CLIPS (2048)
        blocks a group (windows from that many places of the dataset in
        each batch), within MIN_READ (256 KiB) and READ (8 MiB) of the
        widest modality and at least a window; or bytes of the widest
        modality a block holds (bigger reads, fewer places a group).
    group: blocks per group instead of buffer // 2 // a block's bytes.
    hold: modalities with at most this many bytes of data ("64MiB") are
        read whole and held; per-clip modalities always are.
    read: "auto" (default): False where the streamed blobs of every
        source fit in half the memory this process may use (the least of
        MemTotal and its cgroup's memory limit: a Slurm job's, a
        container's), True where they do not (their mapped pages would
        crowd out the read-ahead of the next group: with the map, a 2.4
        GB dataset read under a 1.2 GB cap gave 134 windows/s, with
        preads 5-9k), and a blob the file system cannot map (some FUSE
        and network mounts) read as with True; the choice is in .read
        (False when it maps what it can). False: a batch's windows
        of a streamed modality are copied out of a read-only memory map
        of its blob (one gather, at ~2x the speed of a pread a window),
        the blob's size checked (fstat) before each batch: a blob cut
        short raises, naming it. A blob cut short in the microseconds
        between that check and the copy, or an I/O error of a
        soft-mounted network file system while a page is read through
        the map, is a SIGBUS (as for any memory map:
        numpy.load(mmap_mode=...), EpochReader's default). True: one
        pread a window (such errors raise OSError or ValueError).
    cache_dir, cache_limit: for s3:// sources, the node-local cache (it
        must hold the streamed modalities: blocks are not evicted while an
        epoch reads them).
    """

    def __init__(self, dataset: Union[str, Mapping[str, str]], window: int, seed: int = 0, sampling: str = "tile",
                 per_clip: int = 1, short: str = "pad", weights: Any = None, epoch_samples: int = 0,
                 block: Union[str, int] = "auto", buffer: Union[str, int] = BUFFER, group: Optional[int] = None,
                 hold: Union[str, int] = HOLD, read: Union[bool, str] = "auto",
                 cache_dir: Optional[str] = None, cache_limit: Union[str, int, None] = None) -> None:
        # (what makes these epochs again in another process: see __reduce__)
        self._made = (dict(dataset) if isinstance(dataset, Mapping) else dataset, dict(
            window=window, seed=seed, sampling=sampling, per_clip=per_clip, short=short, weights=weights,
            epoch_samples=epoch_samples, block=block, buffer=buffer, group=group, hold=hold, read=read,
            cache_dir=cache_dir, cache_limit=cache_limit))
        if type(window) is not int or not 1 <= window < 1 << 31:
            raise ValueError("window %r: want an int in [1, 2**31) (frames of each window)" % (window,))
        if sampling not in ("tile", "random"):
            raise ValueError("sampling %r: want 'tile' or 'random'" % (sampling,))
        if short not in ("pad", "skip"):
            raise ValueError("short %r: want 'pad' or 'skip'" % (short,))
        if type(per_clip) is not int or per_clip < 1 or (per_clip != 1 and sampling != "random"):
            raise ValueError("per_clip %r: want an int >= 1 (windows per clip, with sampling='random')" % (per_clip,))
        if type(seed) is not int or not 0 <= seed < 1 << 64:
            raise ValueError("seed %r: want an int in [0, 2**64)" % (seed,))
        if type(epoch_samples) is not int or not 0 <= epoch_samples <= 1 << 40:
            raise ValueError("epoch_samples %r: want an int in [0, 2**40] (0: the sources' own windows added up; an epoch's "
                             "order takes 26 bytes a window)" % (epoch_samples,))
        self.window, self.seed, self.sampling, self.per_clip, self.short = window, seed, sampling, per_clip, short
        self.block: Optional[int] = None if block == "auto" else _size(block)
        if self.block is not None and self.block < 1:
            raise ValueError("block %r: want 'auto' or bytes >= 1" % (block,))
        self.buffer, self.hold = _size(buffer), _size(hold)
        if self.buffer < 2:
            raise ValueError("buffer %r: want bytes (e.g. '1GiB')" % (buffer,))
        if group is not None and (type(group) is not int or group < 1):
            raise ValueError("group %r: want blocks per group >= 1" % (group,))
        self.group = group
        if type(read) is not bool and read != "auto":
            raise ValueError("read %r: want 'auto', False (windows copied from a memory map of each blob) or True (one "
                             "pread a window)" % (read,))
        self.read: Union[bool, str] = read  # (resolved once the sources are open: a bool)
        self.cache_dir, self.cache_limit = cache_dir, cache_limit
        if isinstance(dataset, Mapping):
            items = list(dataset.items())
            if not items:
                raise ValueError("dataset: an empty {name: folder} mapping")
            for n, _ in items:
                if not isinstance(n, str) or not 1 <= len(n) <= 64 or not all(c.isalnum() or c in "_.-" for c in n) or not n.isascii():
                    raise ValueError("dataset: source name %r: want 1-64 of [A-Za-z0-9_.-]" % (n,))
            self.mixed = True
        elif isinstance(dataset, (str, os.PathLike)):
            where = os.fspath(dataset)
            items = [(os.path.basename(os.path.normpath(where)) or "dataset", where)]
            self.mixed = False
        else:
            raise ValueError("dataset %r: want a folder, an s3:// URL, or {name: folder or URL}" % (dataset,))
        self.names = [n for n, _ in items]
        self.schedule = _check_schedule(weights, self.names)
        self.epoch_samples = epoch_samples
        if not self.mixed and (weights is not None or epoch_samples):
            raise ValueError("weights and epoch_samples mix several datasets: give dataset={name: folder, ...}")
        self.sources: list[_Source] = []
        try:
            for i, (n, where) in enumerate(items):
                src = _Source(i, n, os.fspath(where), self)
                self.sources.append(src)
            first = self.sources[0]
            for s in self.sources[1:]:
                if s.signature() != first.signature():
                    raise ValueError("dataset: source %s's modalities %s (%s/dataset.json) differ from %s's %s (%s/dataset.json; "
                                     "names in order, dtypes, frame shapes, rates, per-clip must match to mix them)" % (
                                         s.name, s.signature(), s.url, first.name, first.signature(), first.url))
            limit = memory_limit()
            half = limit // 2 if limit is not None else None  # (of the bytes the process may use, what its maps may take)
            streamed = {s.name: s.streamed_bytes() for s in self.sources}
            strict = self.read is False
            if self.read == "auto":
                # The map, unless what it maps would not stay in memory: its
                # pages are the process's (mapped, resident) and are
                # reclaimed last, so the read-ahead of the next group is
                # evicted instead and every window is read 4 KiB a fault
                # (a 2.4 GB dataset under a 1.2 GB cap: 134 windows/s,
                # one pread a window 5-9k).
                self.read = half is not None and sum(streamed.values()) > half
            big = [n for n, b in streamed.items() if half is not None and b > half]
            if big and limit is not None and self.buffer > limit // 2:
                warnings.warn("buffer %d bytes: more than half the memory this process may use (%d bytes: the least of "
                              "MemTotal and its cgroup's limit), and %s does not fit in it either: a group read ahead "
                              "will be evicted before its windows are read (under a 1.2 GB cap, buffer 2 GiB read 5k "
                              "windows/s, 256 MiB 9.5k); give a smaller buffer= (it changes the order)"
                              % (self.buffer, limit, big[0]), stacklevel=2)
            if self.read is False:
                for s in self.sources:
                    s.map_streamed(strict)
        except BaseException:
            self.close()
            raise
        self.modalities = [r["name"] for r in first.mods]
        # What identifies these epochs: the sources (names, dataset.json's
        # sha256) and every option the order depends on.
        ident = {"sources": [[s.name, s.sha] for s in self.sources], "window": window, "seed": seed, "sampling": sampling,
                 "per_clip": per_clip, "short": short, "weights": self.schedule, "epoch_samples": epoch_samples,
                 "block_frames": [s.block_frames for s in self.sources], "group_blocks": [s.group_blocks for s in self.sources]}
        self.identity = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]
        self._orders: dict[int, "Order"] = {}
        self._lock = threading.Lock()
        self.closed = False

    def shapes(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        """name -> (dtype, shape of one sample) of what a batch holds."""
        out = {}
        for r in self.sources[0].mods:
            shape = r["frame"] if r["per_clip"] else (self.window * r["rate"],) + r["frame"]
            out[r["name"]] = (np.dtype(r["dtype"]), tuple(shape))
        out["samples"] = (np.dtype("<i8"), (4 if self.mixed else 3,))
        return out

    def order(self, epoch: int) -> "Order":
        """Epoch's order (the last few are kept)."""
        with self._lock:
            o = self._orders.get(epoch)
            if o is None:
                o = Order(self, epoch)
                if len(self._orders) >= 2:
                    self._orders.pop(next(iter(self._orders)))
                self._orders[epoch] = o
            return o

    def check_current(self) -> None:
        """Refuse sources whose dataset.json changed since they were
        checked (convert --force, an incremental convert)."""
        for s in self.sources:
            try:
                now = hashlib.sha256(s._bytes("dataset.json")).hexdigest() if s.remote is None else \
                    hashlib.sha256(s.remote.check_current()).hexdigest()
            except (ValueError, OSError) as e:
                raise ValueError("%s: dataset.json cannot be read again: %s" % (s.url, e)) from None
            if now != s.sha:
                raise ValueError("%s: dataset.json changed since the loader checked it (converted again?): make the loader "
                                 "again" % s.url)

    def close(self) -> None:
        """Close every file of the sources (a reader then refuses to read)."""
        self.closed = True
        for s in self.sources:
            s.close()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Pickled (a DataLoader worker started by spawn or forkserver:
        # macOS's default, Python 3.14's on Linux): its open files, maps
        # and lock do not travel; the other process opens and checks the
        # sources again, and refuses them if they are not the ones checked
        # here (the identity: each dataset.json's sha256 and the options).
        if self.closed:
            raise ValueError("a closed Drawn cannot be pickled (its sources are closed)")
        return (_drawn_again, self._made + (self.identity,))


def _drawn_reader_again(plan: Drawn, epoch: int, rank: int, world_size: int, batch_size: int, remainder: str, threads: int,
                        remaining: list[tuple[int, int]], done: bool) -> "DrawnReader":
    r = DrawnReader(plan, epoch, rank=rank, world_size=world_size, batch_size=batch_size, remainder=remainder, threads=threads)
    r._resume(remaining, done)
    return r


def _drawn_again(dataset: Any, kw: dict[str, Any], identity: str) -> Drawn:
    d = Drawn(dataset, **kw)
    if d.identity != identity:
        d.close()
        raise ValueError("%s: the dataset changed between this process's parent checking it and this one opening it "
                         "(converted again?): make the loader again" % ", ".join(s.url for s in d.sources))
    return d


class Order:
    """One epoch's whole order: for each position, the source, its group
    (an index into groups: (source, blocks)), and the window (clip row,
    start, valid, first frame in the blob)."""

    def __init__(self, plan: Drawn, epoch: int) -> None:
        self.epoch = epoch
        srcs = plan.sources
        seeds = [(plan.seed + s * GAMMA) & MASK for s in range(len(srcs))]
        first = [_Pass(src, plan, seeds[src.i], epoch) for src in srcs]
        own = [len(p.clip) for p in first]
        w = _weights_at(plan.schedule, plan.names, epoch)
        N = plan.epoch_samples or sum(own)
        if w is None:
            counts = own if not plan.epoch_samples else _split(N, [Fraction(n) for n in own])
        else:
            counts = _split(N, w)
        for s, (c, n) in enumerate(zip(counts, own)):
            if c > 0 and n == 0:
                raise ValueError("%s: epoch %d: source %s is to give %d windows but has none (every clip shorter than the "
                                 "window %d?)" % (srcs[s].url, epoch, plan.names[s], c, plan.window))
        self.counts = dict(zip(plan.names, counts))
        self.groups: list[tuple[int, np.ndarray]] = []
        parts = []
        for s, src in enumerate(srcs):
            c, p, got = counts[s], 0, 0
            cols: list[list[np.ndarray]] = [[], [], [], [], []]
            while got < c:
                ps = first[s] if p == 0 else _Pass(src, plan, seeds[s], epoch | p << 32)
                take = min(c - got, len(ps.clip))
                g0 = len(self.groups)
                self.groups.extend((s, g) for g in ps.groups)
                for k, a in enumerate((ps.clip, ps.start, ps.valid, ps.gs, ps.group + g0)):
                    cols[k].append(a[:take])
                got += take
                p += 1
            parts.append([np.concatenate(x) if x else np.zeros(0, dtype=np.int32 if k != 3 else np.int64) for k, x in enumerate(cols)])
        if len(srcs) == 1:
            self.source = np.zeros(len(parts[0][0]), dtype=np.int16)
            self.clip, self.start, self.valid, self.gs, self.group = parts[0]
        else:
            keys, js, ss = [], [], []
            for s, c in enumerate(counts):
                j = np.arange(c, dtype=np.int64)
                u = (stream(key(seeds[s], epoch, TAG_MERGE), j) >> np.uint64(44)).astype(np.int64)
                keys.append((j * (1 << 20) + u).astype(np.float64) / float(c * (1 << 20)))
                js.append(j)
                ss.append(np.full(c, s, dtype=np.int16))
            o = np.lexsort((np.concatenate(js), np.concatenate(ss), np.concatenate(keys)))
            self.source = np.concatenate(ss)[o]
            self.clip, self.start, self.valid, self.gs, self.group = (np.concatenate([p[k] for p in parts])[o] for k in range(5))
        self.samples = len(self.clip)


def _split(N: int, w: Sequence[Fraction]) -> list[int]:
    """N split by the weights w: floor(N w_s / W) each, the rest one each
    to the largest remainders (ties: the earlier source)."""
    W = sum(w)
    if W <= 0:
        return [0] * len(w)
    exact = [Fraction(N) * x / W for x in w]
    c = [int(e) for e in exact]
    rest = N - sum(c)
    for s in sorted(range(len(w)), key=lambda s: (-(exact[s] - c[s]), s))[:rest]:
        c[s] += 1
    return c


# -- reading: a rank's stretch of the order, a group at a time ------------------

def _intervals(x: Any, n: int) -> list[tuple[int, int]]:
    """Checked, sorted, merged [a, b) intervals inside [0, n)."""
    if not isinstance(x, (list, tuple)):
        raise ValueError("state remaining %r: want a list of [first, end) pairs" % (x,))
    out: list[tuple[int, int]] = []
    for p in x:
        if not isinstance(p, (list, tuple)) or len(p) != 2 or any(type(v) is not int and not isinstance(v, np.integer) for v in p):
            raise ValueError("state remaining: %r is not a [first, end) pair of ints" % (p,))
        a, b = int(p[0]), int(p[1])
        if not 0 <= a < b <= n:
            raise ValueError("state remaining: [%d, %d) is not inside the epoch's %d windows" % (a, b, n))
        if out and a < out[-1][1]:
            raise ValueError("state remaining: [%d, %d) overlaps or precedes the pair before it" % (a, b))
        if out and a == out[-1][1]:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _spans(ivs: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """Positions [lo, hi) of the sequence the intervals make, as intervals
    of the order."""
    out, at = [], 0
    for a, b in ivs:
        n = b - a
        x, y = max(lo, at), min(hi, at + n)
        if x < y:
            out.append((a + x - at, a + y - at))
        at += n
        if at >= hi:
            break
    return out


def _distinct(a: np.ndarray) -> np.ndarray:
    """np.unique(a) of a 1-d int array, sorted. (numpy 2.3+'s np.unique
    without return_index asks np.ma.is_masked, whose first call imports
    numpy.ma: 7-9 ms, in the first batch of a process's first drawn epoch,
    which waited 19 ms against a materialised one's 5.)"""
    a = np.sort(a)
    return a[np.r_[True, a[1:] != a[:-1]]] if len(a) else a


def _rows(n: int, parts: int) -> list[tuple[int, int]]:
    """[0, n) cut into at most `parts` stretches of about equal rows."""
    step = max(1, -(-n // parts))
    return [(i, min(n, i + step)) for i in range(0, n, step)]


def _copy(ops: list[tuple[Optional[np.ndarray], Callable[[int, int, Any], None]]], i: int, j: int) -> None:
    """Rows i..j of a batch copied as DrawnReader.jobs prepared them: each
    op (sel, copy) for the rows of the batch it fills (all of them, or
    those of sel) that lie in i..j: copy(a, b, rows), its own rows a..b,
    which are the batch's rows (None: a..b)."""
    for sel, copy in ops:
        if sel is None:
            copy(i, j, None)
            continue
        a, b = int(np.searchsorted(sel, i)), int(np.searchsorted(sel, j))
        if a < b:
            copy(a, b, sel[a:b])


def _take_windows(src: np.ndarray, idx: np.ndarray, dst: np.ndarray, mode: Literal["raise", "clip"], short: Optional[np.ndarray],
                  valid: Optional[np.ndarray], a: int, b: int, rows: Optional[np.ndarray]) -> None:
    """src's rows idx[a:b] into dst's rows (a..b, or rows), then zeros
    past valid in the short windows. (A blob's rows: mode "clip", no bounds
    pass and no buffer, idx was checked against the blob; a held
    modality's: "raise".)"""
    if rows is None:
        np.take(src, idx[a:b], axis=0, out=dst[a:b], mode=mode)
    else:
        dst[rows] = np.take(src, idx[a:b], axis=0, mode=mode)
    if short is not None and valid is not None:
        for k in short[(short >= a) & (short < b)].tolist():
            dst[k if rows is None else int(rows[k - a]), int(valid[k]):] = 0


def _pread_windows(f: Npy, dst: np.ndarray, first: np.ndarray, valid: np.ndarray, a: int, b: int,
                   rows: Optional[np.ndarray]) -> None:
    """Windows a..b of rows [first, first + valid) of f each read by one
    pread into dst's rows (a..b, or rows; dst: [n, per rows, ...],
    C-contiguous), zeros past valid; a file cut short raises, naming it."""
    view = memoryview(dst.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
    row, per = f.row, dst.nbytes // len(dst)
    for k, at, v in zip(range(a, b) if rows is None else rows.tolist(), first[a:b].tolist(), valid[a:b].tolist()):
        n, d = v * row, k * per
        if pread_into(f.fd, view[d: d + n], f.offset + at * row) < n:
            raise ValueError("%s: shorter than its header says (rows %d..%d; changed since it was checked?)"
                             % (f.path, at, at + v))
        if n < per:
            view[d + n: d + per] = bytes(per - n)


def _check_size(f: Npy) -> None:
    """A blob's size checked before any page of its map is touched: a file
    cut short raises, naming it (its pages past the end would be SIGBUS)."""
    size = os.fstat(f.fd).st_size
    if size < f.size:
        raise ValueError("%s: shorter than its header says (%d bytes, %d when it was checked; changed since?)"
                         % (f.path, size, f.size))


class _Chunk(NamedTuple):
    """Batches' windows made at once (DrawnReader._chunk): batch -> its
    place j; the batches' rows [cut[j], cut[j+1]) of samples; and of each
    source, (source, its rows of the chunk or None for all of them, its
    rows' bounds of each batch, and of each modality (name, "held" | "map"
    | "pread", what it copies from, the gather indices (pread: each
    window's first row), the windows shorter than the indices (map), the
    windows' valid rows))."""
    batch: dict[int, int]
    cut: np.ndarray
    samples: np.ndarray
    sources: list[tuple[int, Optional[np.ndarray], np.ndarray, list[tuple[str, str, Any, np.ndarray, Any, Any]]]]


class DrawnReader:
    """One rank's batches of one drawn epoch (see Drawn), as
    EpochReader's: dicts of a batch's arrays per modality and "samples"
    (clip row, start, valid; and the source with several datasets), in an
    order that does not depend on the ranks, workers or threads reading.

    The epoch's windows still to read (all of them, or what a state says
    is left) are cut into world_size equal stretches of whole batches;
    rank r reads the r-th, batch after batch (remainder "drop": what is
    less than a global batch at the end is left; "pad": filled from the
    start; "partial", one rank: a short last batch). The state is the
    list of intervals of the order still to read: a job resumed from it
    with any world size or batch size reads each of them exactly once.
    """

    def __init__(self, plan: Drawn, epoch: int, rank: Optional[int] = None, world_size: int = 1, batch_size: int = 256,
                 remainder: str = "drop", threads: int = 1) -> None:
        if type(epoch) is not int or epoch < 0:
            raise ValueError("epoch %r: want an int >= 0" % (epoch,))
        self._check_args(rank, world_size, batch_size, remainder)
        self.plan, self.epoch = plan, epoch
        self.order = plan.order(epoch)
        self.samples = self.order.samples
        self.names = plan.modalities + ["samples"]
        self.sources = plan.names
        self.mixed = plan.mixed
        self.threads = max(1, int(threads))
        self._resume([(0, self.samples)] if self.samples else [], False)
        self._groups: dict[int, list[Any]] = {}  # group -> Futures of its read's parts (asked of the kernel, or fetched)
        self._probe_lock = threading.Lock()
        self._pool: Optional[ThreadPoolExecutor] = None
        self._step = 1  # this reader reads every _step-th batch (a DataLoader worker's: num_workers)

    def _check_args(self, rank: Optional[int], world_size: int, batch_size: int, remainder: str) -> None:
        rank = _check_rank_args(rank, world_size, batch_size, remainder)
        self.rank, self.world_size, self.batch_size, self.remainder = rank, world_size, batch_size, remainder

    # -- the layout -------------------------------------------------------

    def _resume(self, remaining: list[tuple[int, int]], done: bool) -> None:
        self.remaining, self.done = remaining, done
        n = sum(b - a for a, b in remaining)
        self.left = n
        per = self.batch_size * self.world_size
        if done or n == 0:
            self.nb = 0
        elif self.remainder == "drop":
            self.nb = n // per
        else:
            self.nb = -(-n // per)
        self.consumed_batches = 0  # this rank's batches handed out since the resume point
        self._pos: Optional[np.ndarray] = None
        self._need: Optional[tuple[np.ndarray, np.ndarray, np.ndarray]] = None
        self._blk: Optional[dict[int, np.ndarray]] = None
        self._probed: dict[int, tuple[list[Any], bool]] = {}  # group -> its spans, whether its sample is cached (_fetch)
        self._ch: Optional[_Chunk] = None  # the batches whose indices are made (_chunk)
        self._by_batch: Optional[tuple[np.ndarray, np.ndarray]] = None  # each batch's groups (_batch_groups)

    def batches_left(self) -> int:
        return self.nb

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Pickled (a DataLoader worker started by spawn or forkserver): made
        # again in the other process at its resume point (what
        # load_state_dict set, not where an iteration of it got to), on
        # the Drawn, which opens and checks its sources again there.
        return (_drawn_reader_again, (self.plan, self.epoch, self.rank, self.world_size, self.batch_size, self.remainder,
                                      self.threads, self.remaining, self.done))

    def __len__(self) -> int:
        return self.nb

    def check_fits(self) -> None:
        B, R = self.batch_size, self.world_size
        if self.remainder == "drop" and 0 < self.samples < B * R and self.remaining == [(0, self.samples)]:
            raise ValueError("epoch %d draws %d windows, fewer than one global batch (batch_size %d x world_size %d = %d): it "
                             "would give no batch; give a smaller batch_size, or remainder='pad'%s" % (
                                 self.epoch, self.samples, B, R, B * R, ", or 'partial'" if R == 1 else ""))

    def positions(self) -> np.ndarray:
        """This rank's positions of the order, batch after batch (nb * B of
        them; with "partial", the last batch shorter)."""
        if self._pos is None:
            B, nb, n = self.batch_size, self.nb, self.left
            lo = self.rank * nb * B
            hi = min(lo + nb * B, n) if self.remainder == "partial" else lo + nb * B
            v = np.arange(lo, hi, dtype=np.int64)
            if n:
                v %= n  # pad: past the end, from the start again
            ivs = np.array(self.remaining, dtype=np.int64).reshape(-1, 2)
            cum = np.concatenate([[0], np.cumsum(ivs[:, 1] - ivs[:, 0])])
            k = np.searchsorted(cum, v, side="right") - 1
            self._pos = ivs[k, 0] + (v - cum[k]) if len(v) else v
        return self._pos

    def batch_positions(self, g: int) -> np.ndarray:
        B = self.batch_size
        return self.positions()[g * B: (g + 1) * B]

    def remaining_after(self, k: int) -> tuple[list[tuple[int, int]], bool]:
        """What is left to read once every rank has handed out k batches."""
        if k >= self.nb:
            return [], True
        B, nb, n, R = self.batch_size, self.nb, self.left, self.world_size
        left: list[tuple[int, int]] = []
        for r in range(R):
            a = r * nb * B + k * B
            left += _spans(self.remaining, a, min((r + 1) * nb * B, n))
        if self.remainder == "drop":
            left += _spans(self.remaining, R * nb * B, n)  # the tail no rank reads in this layout
        left.sort()
        merged: list[tuple[int, int]] = []
        for a, b in left:
            if merged and a == merged[-1][1]:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        return merged, False

    # -- state ----------------------------------------------------------------

    def state_after(self, k: int) -> dict[str, Any]:
        rem, done = self.remaining_after(k)
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "epoch": self.epoch, "id": self.plan.identity,
                "samples": self.samples, "remaining": [[a, b] for a, b in rem], "done": done}

    def state_dict(self) -> dict[str, Any]:
        """What is left of the epoch once every rank has handed out the
        batches this one has: the intervals of the order still to read
        (the same on every rank), with what identifies the epoch. A dict
        of ints, strings, lists and a bool (torch.save, JSON); its size
        grows with the world sizes it was read with, not the epoch."""
        return self.state_after(self.consumed_batches)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise ValueError("not a clipshard drawn-epoch state: %r" % (state,))
        if state.get("version") != STATE_VERSION:
            raise ValueError("state version %r: this reader knows version %d" % (state.get("version"), STATE_VERSION))
        for k, mine in (("epoch", self.epoch), ("id", self.plan.identity), ("samples", self.samples)):
            if state.get(k) != mine or type(state.get(k)) is bool:
                raise ValueError("state is of %s %r, this reader's is %r (another epoch, other datasets or options)" % (k, state.get(k), mine))
        if type(state.get("done")) is not bool:
            raise ValueError("state done %r: want a bool" % (state.get("done"),))
        self._resume(_intervals(state.get("remaining"), self.samples), state["done"])

    # -- reading --------------------------------------------------------------

    def groups_of(self, pos: np.ndarray) -> np.ndarray:
        return _distinct(self.order.group[pos])

    def _pool_(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(2, thread_name_prefix="clipshard-blocks")
        return self._pool

    def _fetch(self, gid: int, part: int = 0, parts: int = 1) -> None:
        """Part `part` of `parts` of a group's read asked for: from a
        bucket, each block and streamed modality fetched into the
        node-local cache (checked by BLOCKSUMS); then of the kernel
        (posix_fadvise WILLNEED: read ahead into the page cache), the
        frames this rank's windows of the group read (_spans: not the
        rows between them), in the files' order, each streamed modality's
        range unless the page cache holds that range (_files.cached probes
        its middle and its first and last whole pages, not its ends, which
        the ranges beside it may share; each modality's own: a probe of a
        cold page starts a read of its own, and when the first modality's
        probe decided for every modality, a cold epoch of 4000 clips
        skipped the other modalities of a sixth of its blocks and read them
        by page faults at its end, the disk idle before). (In the order the
        windows first need them, a cold epoch of 4000 clips in 256 KiB
        blocks read 13-14k windows/s, in the files' order 19-21k; blocks
        that touch asked as one range of 16 MiB did no better and made
        waits longer.)"""
        s, _ = self.order.groups[gid]
        src = self.plan.sources[s]
        BF, F, W = src.block_frames, src.frames, self.plan.window
        streamed = [(rec, src.files[rec["name"]]) for rec in src.mods if not rec["held"]]
        if src.remote is not None:
            with self._probe_lock:  # (made once, by the first part)
                blocks = self._blocks().get(gid, np.zeros(0, np.int64))  # (the group's blocks this rank reads windows of)
            for k in blocks[part::parts].tolist():
                a, b = k * BF, min(F, (k + 1) * BF + W - 1)
                for rec, f in streamed:
                    off = f.offset + a * rec["rate"] * f.row
                    src.remote.ensure_range(rec["file"], off, off + (b - a) * rec["rate"] * f.row)
        got = self._probe(gid)
        if got is None:
            return
        every, warm, ranges = got
        if warm:
            return
        spans = every[part * len(every) // parts: (part + 1) * len(every) // parts]
        for a, b in spans:
            for fd, off, n in ranges(a, b):
                if not _cached(fd, off, n):
                    os.posix_fadvise(fd, off, n, os.POSIX_FADV_WILLNEED)

    def _probe(self, gid: int) -> Optional[tuple[list[Any], bool, Callable[[int, int], Iterator[tuple[int, int, int]]]]]:
        """Group gid's spans (_spans, as a list), whether the group is warm,
        and its spans' ranges in each streamed file (fd, offset, bytes);
        None when there is nothing to ask of the kernel (no streamed
        modality, no posix_fadvise). The spans and the warmth made once a
        group, by the first to ask (each of a group's parts making its own,
        the two took turns at the GIL: an epoch's start on the bench set,
        3.4-4 ms of thread time). A warm group (SAMPLE of its ranges,
        evenly spread, all cached) is not probed range by range: 3 probes a
        block cost a warm epoch of 4000 clips (6000 blocks of 256 KiB) 80
        ms of the GIL."""
        s, _ = self.order.groups[gid]
        src = self.plan.sources[s]
        streamed = [(rec, src.files[rec["name"]]) for rec in src.mods if not rec["held"]]
        streamed = [(rec, f) for rec, f in streamed if f.fd >= 0]
        if not hasattr(os, "posix_fadvise") or not streamed:
            return None

        def ranges(a: int, b: int) -> Iterator[tuple[int, int, int]]:
            for rec, f in streamed:
                yield f.fd, f.offset + a * rec["rate"] * f.row, (b - a) * rec["rate"] * f.row
        with self._probe_lock:
            got = self._probed.get(gid)
            if got is None:
                every = self._spans(gid).tolist()
                warm = len(every) > SAMPLE and all(_cached(*r) for a, b in every[:: len(every) // SAMPLE] for r in ranges(a, b))
                got = self._probed[gid] = (every, warm)
        return got[0], got[1], ranges

    def _spans(self, gid: int) -> np.ndarray:
        """The frames this rank's windows of group gid read, [n, 2] (first,
        end) in order: each window's W frames from its start (a short
        window's gather touches the rows past its valid ones), windows
        that overlap or touch merged. (Asked for instead of the windows'
        whole blocks: a cold epoch of 4000 clips read 2.32 GB, not 2.54,
        the materialised epoch's 2.31; rows of up to 64 KiB between
        windows asked with them: 2.50 GB, and slower.)"""
        o, W = self.order, self.plan.window
        pos = self.positions()
        pos = pos[o.group[pos] == gid]
        src = self.plan.sources[int(o.groups[gid][0])]
        lo = np.sort(o.gs[pos].astype(np.int64))
        if not len(lo):
            return np.zeros((0, 2), np.int64)
        hi = np.maximum.accumulate(np.minimum(lo + W, src.frames))
        cut = np.flatnonzero(lo[1:] > hi[:-1]) + 1
        return np.stack([lo[np.r_[0, cut]], hi[np.r_[cut - 1, len(lo) - 1]]], axis=1)

    def _needs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This rank's groups: of each position, every group in the order
        its batches first need it, with that batch."""
        if self._need is None:
            pos = self.positions()
            grp = self.order.group[pos].astype(np.int64)
            gids, first = np.unique(grp, return_index=True)
            o = np.argsort(first, kind="stable")
            self._need = (grp, gids[o], first[o] // self.batch_size)
        return self._need

    def _blocks(self) -> dict[int, np.ndarray]:
        """The blocks of each group that hold windows of this rank's, in
        the order its windows first need them (a bucket's fetch: made
        only for one; a third of an epoch's start on disk)."""
        if self._blk is None:
            pos = self.positions()
            grp = self._needs()[0]
            bf = np.array([s.block_frames for s in self.plan.sources], dtype=np.int64)
            blk = self.order.gs[pos] // bf[self.order.source[pos]]
            pairs, at = np.unique(grp * (1 << 40) + blk, return_index=True)
            g_of, b_of = pairs >> 40, pairs & ((1 << 40) - 1)
            cut = np.flatnonzero(np.diff(g_of)) + 1
            self._blk = {int(g[0]): b[np.argsort(a, kind="stable")]
                         for g, b, a in zip(np.split(g_of, cut), np.split(b_of, cut), np.split(at, cut)) if len(g)}
        return self._blk

    def _batch_groups(self, g: int) -> list[int]:
        """The groups batch g's windows are in, ascending (made for every
        batch at once: one sort an epoch, not one a batch)."""
        if self._by_batch is None:
            grp = self._needs()[0]
            G = max(1, len(self.order.groups))
            u = _distinct(np.arange(len(grp), dtype=np.int64) // self.batch_size * G + grp)
            self._by_batch = (np.searchsorted(u // G, np.arange(self.nb + 1)), u % G)
        ptr, gid = self._by_batch
        return gid[ptr[g]: ptr[g + 1]].tolist()

    def prepare(self, g: int, ahead: int = 2) -> None:
        """The groups of batch g asked for (and waited for, from a bucket),
        then, in the background, the next `ahead` groups the batches after
        it need first: the groups read ahead are asked once batch g's are
        (asked beside them, they shared the disk with them, and a cold
        epoch's first batch waited for both: 4000 clips, 2 GiB groups, 1.0-1.2
        s against 0.6-0.9)."""
        grp, seq, first = self._needs()
        need = self._batch_groups(g)
        k = int(np.searchsorted(first, g, side="right"))
        later = seq[k: k + ahead].tolist()
        keep = set(need) | set(later)
        for x in list(self._groups):
            if x not in keep:
                self._groups.pop(x)
                self._probed.pop(x, None)
        for x in need:
            self._ask(x, now=True)
        for x in need:
            # (asked of the kernel, all of the group's blocks: the windows'
            # reads then wait for that read-ahead instead of racing it
            # with small reads of their own; from a bucket, fetched and
            # checked: raises what the fetch raised)
            for f in self._groups[x]:
                f.result()
        for x in later:
            self._ask(x)

    def order_ahead(self, epoch: int) -> None:
        """The plan's order of another epoch made in the background (the
        next epoch's, while this one's last batches are copied: its reader
        then starts without making it, 0.6-1.7 ms an epoch of the bench
        set; an error is raised when that reader makes it again)."""
        self._pool_().submit(self.plan.order, epoch)

    def _ask(self, gid: int, now: bool = False) -> None:
        """Group gid's read started (unless it is), in PARTS parts, each by
        a thread of the pool (one thread asking the kernel for a cold
        group of 1 GiB in 256 KiB blocks: 1.5-1.7 GB/s here, two 1.9-2.2,
        four 1.6-1.7). now: a group the batch waits for, on disk, probed
        here first (the producer waits for its probe either way), and a
        warm one not handed to the pool (its threads, made again each
        epoch, and the waits for them were 0.8 ms of a warm epoch's first
        batch on the bench set). A group read ahead is probed by the pool,
        off the batch's path (probed here too, 4000 clips, cold, 3 rounds:
        the first batch 678-774 ms against 647-680; not kept)."""
        if gid in self._groups:
            return
        if now and self.plan.sources[int(self.order.groups[gid][0])].remote is None:
            got = self._probe(gid)
            if got is None or got[1]:
                self._groups[gid] = []
                return
        self._groups[gid] = [self._pool_().submit(self._fetch, gid, i, PARTS) for i in range(PARTS)]

    def fill(self, g: int, out: Mapping[str, np.ndarray]) -> None:
        """Batch g into out (name -> array [n, ...] of the batch's shape;
        "samples" too): jobs(g, out, 1) done."""
        for job in self.jobs(g, out, 1):
            job()

    def jobs(self, g: int, out: Mapping[str, np.ndarray], parts: int) -> list[Callable[[], None]]:
        """Batch g's fill into out, prepared: "samples" written, every check
        made and every index computed here, once; returned as at most
        `parts` jobs, each copying a stretch of the batch's rows (of every
        modality) and nothing else, for the read threads to run at once (a
        copy releases the GIL; when each thread computed the indices and
        made the checks of its half, that Python, the GIL's to hold, was
        a third of a warm batch's thread time).

        A streamed modality's windows are gathered from the memory map of
        its blob (read=False; its size checked first), or each read by one
        pread of its rows (read=True), from the page cache the group's read
        put them in (a file cut short raises, naming it), zeros past valid;
        a held modality's windows are gathered from memory. The indices
        and checks are those of a chunk of batches (_chunk), made once for
        all of them; a batch's are slices of them."""
        ch = self._chunk(g)
        j = ch.batch[g]
        a0, b0 = int(ch.cut[j]), int(ch.cut[j + 1])
        n = b0 - a0
        out["samples"][:n] = ch.samples[a0:b0]
        ops: list[tuple[Optional[np.ndarray], Callable[[int, int, Any], None]]] = []  # (sel: the batch's rows, None: all; copy)
        for s, rows, bnd, mods in ch.sources:
            lo, hi = int(bnd[j]), int(bnd[j + 1])
            if lo == hi:
                continue
            sel = None if rows is None else rows[lo:hi] - a0
            for name, kind, arg, idx, short, vr in mods:
                dst = out[name][:n]
                if not dst.flags.c_contiguous:  # (a reshape would copy: the rows would go to the copy)
                    raise RuntimeError("a batch's buffer of %s is not C-contiguous" % name)
                if kind == "held":
                    ops.append((sel, functools.partial(_take_windows, arg, idx[lo:hi], dst, "raise", None, None)))
                elif kind == "map":
                    f, m = arg
                    _check_size(f)
                    sh = None
                    if len(short):
                        sh = short[int(np.searchsorted(short, lo)): int(np.searchsorted(short, hi))] - lo
                    ops.append((sel, functools.partial(_take_windows, m, idx[lo:hi], dst.reshape(n, idx.shape[1], -1).view(np.uint8),
                                                       "clip", sh if sh is not None and len(sh) else None, vr[lo:hi])))
                else:
                    ops.append((sel, functools.partial(_pread_windows, arg, dst, idx[lo:hi], vr[lo:hi])))
        return [functools.partial(_copy, ops, i, k) for i, k in _rows(n, parts)]

    def _chunk(self, g: int) -> "_Chunk":
        """The chunk of batches holding batch g: g and the batches this
        reader reads after it (every step-th: a DataLoader worker's), as
        many as CHUNK bytes of indices hold (at least g), their windows'
        samples, gather indices and short windows made at once, and the
        rows checked against each blob. (Made a batch at a time, 3-4 numpy
        calls a modality, that Python was 0.13-0.23 ms of a warm batch's 2
        on the bench set; made once for its epoch's 14 batches, 0.5 ms,
        then 0.03 a batch.)"""
        ch = self._ch
        if ch is not None and g in ch.batch:
            return ch
        B, o, W = self.batch_size, self.order, self.plan.window
        per = sum(W * rec["rate"] for src in self.plan.sources for rec in src.mods if not rec.get("per_clip"))
        k = max(1, CHUNK // max(1, 8 * per * B))
        gs_ = list(range(g, min(self.nb, g + k * self._step), self._step)) or [g]  # (a batch past the last: none of its rows)
        allpos = self.positions()
        L = len(allpos)
        spans = [(min(x * B, L), min((x + 1) * B, L)) for x in gs_]
        pos = np.concatenate([allpos[a:b] for a, b in spans]) if len(spans) > 1 else allpos[spans[0][0]: spans[0][1]]
        cut = np.zeros(len(spans) + 1, np.int64)
        cut[1:] = np.cumsum([b - a for a, b in spans])
        clip, start, valid, gs = o.clip[pos], o.start[pos], o.valid[pos], o.gs[pos]
        srcs = o.source[pos] if self.mixed else None
        samples = np.empty((len(pos), 4 if srcs is not None else 3), np.int64)
        samples[:, 0], samples[:, 1], samples[:, 2] = clip, start, valid
        if srcs is not None:
            samples[:, 3] = srcs
        sources = []
        for s in (_distinct(srcs).tolist() if srcs is not None else [0]):
            rows = np.flatnonzero(srcs == s) if srcs is not None else None
            bnd = cut if rows is None else np.searchsorted(rows, cut)
            src = self.plan.sources[s]
            c, v, first = (clip, valid, gs) if rows is None else (clip[rows], valid[rows], gs[rows])
            short = bool((v < W).any())
            mods: list[tuple[str, str, Any, np.ndarray, Any, Any]] = []
            base: dict[int, np.ndarray] = {}  # rate -> each window's rows (first * rate + arange(W * rate)), which the modalities
            # of a rate share

            def rows_at(rate: int) -> np.ndarray:
                if rate not in base:
                    base[rate] = first[:, None] * rate + np.arange(W * rate, dtype=np.int64)[None, :]
                return base[rate]
            for rec in src.mods:
                name, rate = rec["name"], rec["rate"]
                if rec["held"]:
                    a = src.held[name]
                    if rec["per_clip"]:
                        idx = c
                    else:
                        idx = rows_at(rate)
                        if short:
                            r = np.arange(W * rate, dtype=np.int64)
                            idx = np.where(r[None, :] < (v * rate)[:, None], idx, len(a) - 1)  # past valid: the zero row
                    mods.append((name, "held", a, idx, None, None))
                    continue
                f = src.files[name]
                m = src.maps.get(name)
                if m is not None:
                    idx, short_ = self._gather_index(f, m, first * rate, v * rate, W * rate, rows_at(rate))
                    mods.append((name, "map", (f, m), idx, short_, v * rate))
                else:
                    mods.append((name, "pread", f, first * rate, None, v * rate))
            sources.append((s, rows, bnd, mods))
        self._ch = _Chunk({x: i for i, x in enumerate(gs_)}, cut, samples, sources)
        return self._ch

    @staticmethod
    def _gather_index(f: Npy, m: np.ndarray, first: np.ndarray, valid: np.ndarray, per: int,
                      rows: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray]:
        """The rows of a mapped blob (m: uint8 [rows, row bytes]) that
        windows of rows [first, first + valid) gather, [n, per] (rows past
        valid: any row, zeroed after the copy; those windows, `short`);
        the blob's size checked first (a file cut short raises, naming
        it, before any page of it is touched), and the rows against it.
        (rows: first[:, None] + arange(per), made already; not written.)"""
        _check_size(f)
        if not len(first):
            return np.zeros((0, per), np.int64), np.zeros(0, np.int64)
        if int(first.min()) < 0 or int((first + np.minimum(valid, per)).max()) > len(m):
            raise ValueError("%s: rows %d..%d asked of its %d rows (the order and the blob disagree)" % (
                f.path, int(first.min()), int((first + valid).max()), len(m)))
        idx = first[:, None] + np.arange(per, dtype=np.int64)[None, :] if rows is None else rows
        short = np.flatnonzero(valid < per)
        if len(short):
            idx = np.minimum(idx, len(m) - 1)  # (rows past valid: any row, zeroed below)
        return idx, short

    def batches(self, worker_id: Optional[int] = None, num_workers: Optional[int] = None,
                first: Optional[int] = None) -> Iterator[dict[str, np.ndarray]]:
        """This rank's batches in order (inside a DataLoader worker, every
        num_workers-th, as EpochReader.batches)."""
        if worker_id is None or num_workers is None:
            worker_id, num_workers = _worker()
        self.check_fits()
        self.plan.check_current()
        shapes = self.plan.shapes()
        try:
            self._step = num_workers
            for g in range(worker_id if first is None else first, self.nb, num_workers):
                n = len(self.batch_positions(g))
                out = {k: np.empty((n,) + shape, dtype=d) for k, (d, shape) in shapes.items()}
                self.prepare(g)
                self.fill(g, out)
                if self.mixed:
                    out["source"] = out["samples"][:, 3]
                self.consumed_batches = g + 1
                yield out
        finally:
            self.close()

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self.batches()

    def close(self) -> None:
        for fs in self._groups.values():
            for f in fs:
                f.cancel()
        self._groups = {}
        self._probed = {}
        self._ch = None
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
