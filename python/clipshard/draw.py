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

The stages: the order (_draworder: the hash, the windows, blocks and
groups, the mixing), the source (_blocks: each dataset read by blocks;
_groupreads: a rank's groups read ahead into the page cache or the
bucket's cache), and the assembly of a batch (_cut), composed by
DrawnReader.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import warnings
from typing import Any, Callable, Iterator, Mapping, Optional, Union

import numpy as np

from ._blocks import Source
from ._cut import Cutter
from ._draworder import Order, _check_options, _check_schedule, _intervals, _items, _spans
from ._files import memory_limit
from ._labels import merge_labels, pick_labels
from ._groupreads import GroupReads
from ._manifest import parse_size
from ._order import Stride, check_rank_args, worker
from ._versions import said, versions_of

__all__ = ["Drawn", "DrawnReader", "Order"]

STATE_FORMAT = "clipshard.drawn"
STATE_VERSION = 1

BUFFER = 2 << 30  # default bytes a source's groups take in the page cache (two groups)
HOLD = 64 << 20  # default: modalities of at most this many bytes of data are held whole


class Drawn:
    """The epochs of one or more datasets drawn at read time (see the
    module doc): the sources, checked, and the options every epoch
    shares. clipshard.Loader(dataset=...) makes one; order(epoch) is an
    epoch's whole order.

    dataset: a dataset folder or s3:// URL, or {name: folder or URL} to
        mix several (names of [A-Za-z0-9_.-], the batches' "source"
        numbers in this order).
    window, sampling ("tile" or "random"), per_clip (random: windows per
        clip), short ("skip", the default, or "pad"), seed: as shuffle's
        (a clip shorter than the window is left out, or padded with
        zeros past its frames: the samples' valid column; short_clips
        counts them, and a dataset whose every clip is shorter than the
        window is refused with "skip", as shuffle refuses it).
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
    version: the dataset version to read (a dataset in segments and
        versions, convert --segments: one it keeps, versions/N; with
        several datasets, {name: version}); None: the current one. Either
        way the version read is pinned: a newer one committed while epochs
        are drawn is not read (the one read is, while convert keeps it),
        and .versions says which were read.
    """

    def __init__(self, dataset: Union[str, Mapping[str, str]], window: int, seed: int = 0, sampling: str = "tile",
                 per_clip: int = 1, short: str = "skip", weights: Any = None, epoch_samples: int = 0,
                 block: Union[str, int] = "auto", buffer: Union[str, int] = BUFFER, group: Optional[int] = None,
                 hold: Union[str, int] = HOLD, read: Union[bool, str] = "auto",
                 cache_dir: Optional[str] = None, cache_limit: Union[str, int, None] = None,
                 version: Union[int, Mapping[str, int], None] = None) -> None:
        # (what makes these epochs again in another process: see __reduce__)
        self._made = (dict(dataset) if isinstance(dataset, Mapping) else dataset, dict(
            window=window, seed=seed, sampling=sampling, per_clip=per_clip, short=short, weights=weights,
            epoch_samples=epoch_samples, block=block, buffer=buffer, group=group, hold=hold, read=read,
            cache_dir=cache_dir, cache_limit=cache_limit, version=version))
        _check_options(window, sampling, short, per_clip, seed, epoch_samples)
        self.window, self.seed, self.sampling, self.per_clip, self.short = window, seed, sampling, per_clip, short
        self.block: Optional[int] = None if block == "auto" else parse_size(block)
        if self.block is not None and self.block < 1:
            raise ValueError("block %r: want 'auto' or bytes >= 1" % (block,))
        self.buffer, self.hold = parse_size(buffer), parse_size(hold)
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
        items, self.mixed = _items(dataset)
        self.names = [n for n, _ in items]
        self.schedule = _check_schedule(weights, self.names)
        self.epoch_samples = epoch_samples
        if not self.mixed and (weights is not None or epoch_samples):
            raise ValueError("weights and epoch_samples mix several datasets: give dataset={name: folder, ...}")
        self.sources: list[Source] = []
        try:
            self._open(items, versions_of(version, self.names, self.mixed))
        except BaseException:
            self.close()
            raise
        first = self.sources[0]
        self.modalities = [r["name"] for r in first.mods]
        # Clips shorter than the window (left out with "skip", padded with "pad").
        self.short_clips = {s.name: int((s.lengths < window).sum()) for s in self.sources}
        longest = max((int(s.lengths.max()) if len(s.lengths) else 0) for s in self.sources)
        if short == "skip" and longest < window:
            self.close()
            raise ValueError("%s: no windows: every clip is shorter than window %d (the longest has %d frames): lower window "
                             "or give short='pad' (zeros past each clip's frames: the samples' valid column)" % (
                                 ", ".join(s.url for s in self.sources), window, longest))
        # The versions read: pinned (made again in another process, or
        # after close(), these are opened, not whatever is current then).
        self.versions = {s.name: s.version for s in self.sources}
        self._made[1]["version"] = dict(self.versions) if self.mixed else first.version
        # What identifies these epochs: the sources (names, dataset.json's
        # sha256) and every option the order depends on.
        ident = {"sources": [[s.name, s.sha] for s in self.sources], "window": window, "seed": seed, "sampling": sampling,
                 "per_clip": per_clip, "short": short, "weights": self.schedule, "epoch_samples": epoch_samples,
                 "block_frames": [s.block_frames for s in self.sources], "group_blocks": [s.group_blocks for s in self.sources]}
        self.identity = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]
        self._orders: dict[int, "Order"] = {}
        self._lock = threading.Lock()
        self.closed = False

    def _open(self, items: list[tuple[str, Any]], versions: list[Optional[int]]) -> None:
        """The sources opened and checked (their modalities must agree),
        the read mode chosen ("auto"), the streamed blobs mapped (read=False)."""
        for i, (n, where) in enumerate(items):
            src = Source(i, n, os.fspath(where), self, versions[i])
            self.sources.append(src)
        first = self.sources[0]
        for s in self.sources[1:]:
            if s.signature() != first.signature():
                raise ValueError("dataset: source %s's modalities %s (%s/dataset.json) differ from %s's %s (%s/dataset.json; "
                                 "names in order, dtypes, frame shapes, rates, per-clip, labels must match to mix them)" % (
                                     s.name, s.signature(), s.url, first.name, first.signature(), first.url))
        self.labels = merge_labels(self.sources)  # name -> vocabulary (labels(name) of the readers)
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
                          % (self.buffer, limit, big[0]), stacklevel=3)
        if self.read is False:
            for s in self.sources:
                s.map_streamed(strict)

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
        """Refuse sources whose version changed or was dropped since they
        were checked (convert --force, an incremental convert in place,
        convert --keep); a version kept while newer ones are committed
        (convert --segments) is read on."""
        for s in self.sources:
            s.check_current()

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
        # The stages: the groups read ahead (the source's), the cut of
        # each batch from them (the assembly's).
        self.reads = GroupReads(plan, self.order, batch_size)
        self.cut = Cutter(plan, self.order, batch_size, self.mixed)
        self._resume([(0, self.samples)] if self.samples else [], False)

    def labels(self, name: str) -> list[str]:
        """Label modality name's vocabulary (convert --label NAME): a
        batch's code c in batch[name] is labels(name)[c]."""
        return pick_labels(self.plan.labels, name, ", ".join(s.url for s in self.plan.sources))

    def _check_args(self, rank: Optional[int], world_size: int, batch_size: int, remainder: str) -> None:
        rank = check_rank_args(rank, world_size, batch_size, remainder)
        self.rank, self.world_size, self.batch_size, self.remainder = rank, world_size, batch_size, remainder

    # -- the layout -------------------------------------------------------

    def _resume(self, remaining: list[tuple[int, int]], done: bool) -> None:
        self.remaining, self.done = remaining, done
        n = sum(b - a for a, b in remaining)
        self.left = n
        self.nb = 0 if done else Stride(n, self.rank, self.world_size, self.batch_size, self.remainder).left(0)
        self.consumed_batches = 0  # this rank's batches handed out since the resume point
        self._pos: Optional[np.ndarray] = None
        self.reads.reset(self.positions, self.nb)
        self.cut.reset(self.positions, self.nb)

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
                "samples": self.samples, "remaining": [[a, b] for a, b in rem], "done": done,
                "versions": dict(self.plan.versions)}

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
        was = state.get("versions")
        if isinstance(was, Mapping) and was != self.plan.versions and state.get("id") != self.plan.identity:
            raise ValueError("state is of dataset version%s %s, this reader reads %s: make the loader with version=%s to "
                             "finish the epoch on the bytes it began with (a version convert keeps reads as it was)" % (
                                 "s" if len(was) > 1 else "", said(was), said(self.plan.versions),
                                 was if self.mixed else next(iter(was.values()), None)))
        for k, mine in (("epoch", self.epoch), ("id", self.plan.identity), ("samples", self.samples)):
            if state.get(k) != mine or type(state.get(k)) is bool:
                raise ValueError("state is of %s %r, this reader's is %r (another epoch, other datasets or options)" % (k, state.get(k), mine))
        if type(state.get("done")) is not bool:
            raise ValueError("state done %r: want a bool" % (state.get("done"),))
        self._resume(_intervals(state.get("remaining"), self.samples), state["done"])

    # -- reading --------------------------------------------------------------
    # -- reading --------------------------------------------------------------

    def prepare(self, g: int, ahead: int = 2) -> None:
        """The groups of batch g asked for and waited for, the next `ahead`
        asked for in the background (GroupReads.prepare)."""
        self.reads.prepare(g, ahead)

    def order_ahead(self, epoch: int) -> None:
        """The plan's order of another epoch made in the background."""
        self.reads.order_ahead(epoch)

    def fill(self, g: int, out: Mapping[str, np.ndarray]) -> None:
        """Batch g into out (name -> array [n, ...] of the batch's shape;
        "samples" too)."""
        self.cut.fill(g, out)

    def pieces(self, g: int, out: Mapping[str, np.ndarray], parts: int) -> list[tuple[int, int, Callable[[], None]]]:
        """Batch g's fill into out as at most `parts` (first row, end row,
        job) for the read threads (Cutter.pieces)."""
        return self.cut.pieces(g, out, parts)

    def jobs(self, g: int, out: Mapping[str, np.ndarray], parts: int) -> list[Callable[[], None]]:
        """Batch g's fill into out as at most `parts` jobs for the read
        threads (Cutter.jobs)."""
        return self.cut.jobs(g, out, parts)

    def batches(self, worker_id: Optional[int] = None, num_workers: Optional[int] = None,
                first: Optional[int] = None) -> Iterator[dict[str, np.ndarray]]:
        """This rank's batches in order (inside a DataLoader worker, every
        num_workers-th, as EpochReader.batches)."""
        if worker_id is None or num_workers is None:
            worker_id, num_workers = worker()
        self.check_fits()
        self.plan.check_current()
        shapes = self.plan.shapes()
        try:
            self.cut.step = num_workers
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
        self.reads.close()
        self.cut.close()
