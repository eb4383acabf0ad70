"""The read-ahead of epochs drawn at read time (the source stage's side
of a drawn reader): the groups of blocks a rank's batches need, asked of
the kernel (posix_fadvise WILLNEED), or fetched from a bucket into the
node-local cache, ahead of the batches, a group at a time, by a pool of
two threads; a warm group (in the page cache) is not asked for.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

import numpy as np

from ._cut import _distinct
from ._files import cached as _cached

if TYPE_CHECKING:
    from ._draworder import Order
    from .draw import Drawn

__all__ = ["GroupReads"]

SAMPLE = 32  # ranges of a group probed first: all of them in the page cache, the group is not asked for
PARTS = 2  # a group's read is asked for by this many threads at once, each a part of its ranges in order


class GroupReads:
    """The groups of blocks of one rank's batches of a drawn epoch (plan's
    order), read ahead: prepare(g) asks for batch g's groups and waits for
    them (from a bucket: fetched and checked), then asks for the next ones
    in the background. reset() gives it the rank's positions of the order
    (a callable: made when first needed) and its number of batches.

        reads = GroupReads(plan, plan.order(3), batch_size=256)
        reads.reset(reader.positions, reader.nb)
        reads.prepare(0)      # batch 0's groups in the page cache (or the cache)
    """

    def __init__(self, plan: "Drawn", order: "Order", batch_size: int) -> None:
        self.plan, self.order, self.batch_size = plan, order, batch_size
        self._groups: dict[int, list[Any]] = {}  # group -> Futures of its read's parts (asked of the kernel, or fetched)
        self._probe_lock = threading.Lock()
        self._pool: Optional[ThreadPoolExecutor] = None
        self.reset(lambda: np.zeros(0, np.int64), 0)

    def __str__(self) -> str:
        return "GroupReads(epoch %d, %d groups asked)" % (self.order.epoch, len(self._groups))

    def reset(self, positions: Callable[[], np.ndarray], nb: int) -> None:
        """A new layout of the rank's batches (a resume): what was made of
        the old one dropped (the groups asked stay asked)."""
        self.positions, self.nb = positions, nb
        self._need: Optional[tuple[np.ndarray, np.ndarray, np.ndarray]] = None
        self._blk: Optional[dict[int, np.ndarray]] = None
        self._probed: dict[int, tuple[list[Any], bool]] = {}  # group -> its spans, whether its sample is cached (_fetch)
        self._by_batch: Optional[tuple[np.ndarray, np.ndarray]] = None  # each batch's groups (_batch_groups)

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
                for rec, fs in streamed:
                    rate, runs = rec["rate"], rec["runs"]
                    if runs.flat:
                        f = fs[0]
                        off = f.offset + a * rate * f.row
                        src.remote.ensure_range(rec["file"], off, off + (b - a) * rate * f.row)
                        continue
                    for j, at, n in runs.pieces(a * rate, b * rate):  # (in segments: the blobs' rows of these frames)
                        f = fs[j]
                        src.remote.ensure_range(rec["files"][j], f.offset + at * f.row, f.offset + (at + n) * f.row)
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
        streamed = [(rec, fs) for rec, fs in streamed if all(f.fd >= 0 for f in fs)]
        if not hasattr(os, "posix_fadvise") or not streamed:
            return None

        def ranges(a: int, b: int) -> Iterator[tuple[int, int, int]]:
            for rec, fs in streamed:
                rate, runs = rec["rate"], rec["runs"]
                if runs.flat:
                    f = fs[0]
                    yield f.fd, f.offset + a * rate * f.row, (b - a) * rate * f.row
                    continue
                for j, at, n in runs.pieces(a * rate, b * rate):  # (in segments: the blobs' rows of these frames)
                    f = fs[j]
                    yield f.fd, f.offset + at * f.row, n * f.row
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

    def close(self) -> None:
        """Cancel what is not read yet; the pool's threads end."""
        for fs in self._groups.values():
            for f in fs:
                f.cancel()
        self._groups = {}
        self._probed = {}
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

