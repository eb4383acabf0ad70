"""The assembly of a drawn epoch's batch (Cutter): its windows cut from
the sources' blobs (a gather from a memory map of each streamed blob, or
a pread a window; held modalities from memory) into the batch's
buffers, every index computed and every check made once for a chunk of
batches, the copies handed out as jobs for the read threads.
"""
from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, NamedTuple, Optional

import numpy as np

from ._files import Npy, pread_into

if TYPE_CHECKING:
    from ._draworder import Order
    from .draw import Drawn

__all__ = ["Cutter"]

CHUNK = 4 << 20  # bytes of gather indices a reader makes at once, for as many batches as they hold (at least one)


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


def _pread_windows(fs: list[Npy], bl: Optional[np.ndarray], dst: np.ndarray, first: np.ndarray, valid: np.ndarray, a: int,
                   b: int, rows: Optional[np.ndarray]) -> None:
    """Windows a..b of rows [first, first + valid) of their blob (fs[bl],
    or with bl None fs[0]) each read by one pread into dst's rows (a..b,
    or rows; dst: [n, per rows, ...], C-contiguous), zeros past valid; a
    file cut short raises, naming it."""
    view = memoryview(dst.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
    row, per = fs[0].row, dst.nbytes // len(dst)
    which = [0] * (b - a) if bl is None else bl[a:b].tolist()
    for k, at, v, j in zip(range(a, b) if rows is None else rows.tolist(), first[a:b].tolist(), valid[a:b].tolist(), which):
        f = fs[j]
        n, d = v * row, k * per
        if pread_into(f.fd, view[d: d + n], f.offset + at * row) < n:
            raise ValueError("%s: shorter than its header says (rows %d..%d; changed since it was checked?)"
                             % (f.path, at, at + v))
        if n < per:
            view[d + n: d + per] = bytes(per - n)


def _blob_ops(arg: tuple[list[Npy], list[np.ndarray], np.ndarray], idx: np.ndarray, valid: np.ndarray, dst: np.ndarray,
              sel: Optional[np.ndarray]) -> list[tuple[Optional[np.ndarray], Callable[[int, int, Any], None]]]:
    """The copies of a batch's windows of a modality in segments (a memory
    map of each blob): the blob most of them are in gathers into every
    row of the batch (the others' rows of it are one of its own windows'
    again, overwritten next), then each other blob's windows are gathered
    and put in their rows. (A batch whose windows were all gathered and put
    by blob copies twice; most of a batch drawn from a dataset grown by a
    few percent is in its first blob.) idx: the windows' rows in their
    blob; sel: the batch's rows they fill (None: all)."""
    fs, ms, bl = arg
    for f in fs:
        _check_size(f)
    if not len(bl):
        return []
    per = idx.shape[1]
    count = np.bincount(bl, minlength=len(ms))
    top = int(np.argmax(count))
    own = bl == top
    short = np.flatnonzero(own & (valid < per))
    ix = idx
    if not own.all():
        ix = idx.copy()
        ix[~own] = idx[int(np.argmax(own))]
    ops: list[tuple[Optional[np.ndarray], Callable[[int, int, Any], None]]] = [
        (sel, functools.partial(_take_windows, ms[top], ix, dst, "clip", short if len(short) else None, valid))]
    for j in np.flatnonzero(count).tolist():
        if j == top:
            continue
        w = np.flatnonzero(bl == j)
        sh = np.flatnonzero(valid[w] < per)
        ops.append((w if sel is None else sel[w],
                    functools.partial(_take_windows, ms[j], idx[w], dst, "clip", sh if len(sh) else None, valid[w])))
    return ops


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
    | "maps" (in segments: a map of each blob) | "pread", what it copies
    from, the gather indices (pread: each
    window's first row), the windows shorter than the indices (map), the
    windows' valid rows))."""
    batch: dict[int, int]
    cut: np.ndarray
    samples: np.ndarray
    sources: list[tuple[int, Optional[np.ndarray], np.ndarray, list[tuple[str, str, Any, np.ndarray, Any, Any]]]]



class Cutter:
    """The cut of one rank's batches of a drawn epoch (plan's order) into
    buffers: jobs(g, out, parts) fills batch g of the rank's positions
    (reset(): a callable, and the number of batches), every step-th batch
    made at once with it (a DataLoader worker's: num_workers).

        cut = Cutter(plan, plan.order(3), batch_size=256, mixed=False)
        cut.reset(reader.positions, reader.nb)
        cut.fill(0, out)      # out: name -> array of the batch's shape
    """

    def __init__(self, plan: "Drawn", order: "Order", batch_size: int, mixed: bool) -> None:
        self.plan, self.order, self.batch_size, self.mixed = plan, order, batch_size, mixed
        self.step = 1  # the reader reads every step-th batch (a DataLoader worker's: num_workers)
        self.reset(lambda: np.zeros(0, np.int64), 0)

    def __str__(self) -> str:
        return "Cutter(epoch %d, batches of %d)" % (self.order.epoch, self.batch_size)

    def reset(self, positions: Callable[[], np.ndarray], nb: int) -> None:
        self.positions, self.nb = positions, nb
        self._ch: Optional[_Chunk] = None  # the batches whose indices are made (_chunk)

    def close(self) -> None:
        self._ch = None

    def jobs(self, g: int, out: Mapping[str, np.ndarray], parts: int) -> list[Callable[[], None]]:
        """pieces(g, out, parts)' jobs alone."""
        return [job for _, _, job in self.pieces(g, out, parts)]

    def fill(self, g: int, out: Mapping[str, np.ndarray]) -> None:
        """Batch g into out (name -> array [n, ...] of the batch's shape;
        "samples" too): jobs(g, out, 1) done."""
        for job in self.jobs(g, out, 1):
            job()

    def pieces(self, g: int, out: Mapping[str, np.ndarray], parts: int) -> list[tuple[int, int, Callable[[], None]]]:
        """Batch g's fill into out, prepared: "samples" written, every check
        made and every index computed here, once; returned as at most
        `parts` (first row, end row, job), each job copying that stretch of
        the batch's rows (of every modality) and nothing else, for the read
        threads to run at once (a copy releases the GIL; when each thread
        computed the indices and made the checks of its half, that Python,
        the GIL's to hold, was a third of a warm batch's thread time).

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
                elif kind == "maps":
                    fs, ms, bl = arg
                    ops += _blob_ops((fs, ms, bl[lo:hi]), idx[lo:hi], vr[lo:hi], dst.reshape(n, idx.shape[1], -1).view(np.uint8),
                                     sel)
                else:
                    fs, bl = arg
                    ops.append((sel, functools.partial(_pread_windows, fs, None if bl is None else bl[lo:hi], dst, idx[lo:hi],
                                                       vr[lo:hi])))
        return [(i, k, functools.partial(_copy, ops, i, k)) for i, k in _rows(n, parts)]

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
        gs_ = list(range(g, min(self.nb, g + k * self.step), self.step)) or [g]  # (a batch past the last: none of its rows)
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
                fs, ms, runs = src.files[name], src.maps.get(name), rec["runs"]
                if runs.flat:  # (format 1, or a modality whose rows never moved: its first blob's rows are the clips')
                    if ms is not None:
                        idx, short_ = self._gather_index(fs[0], ms[0], first * rate, v * rate, W * rate, rows_at(rate))
                        mods.append((name, "map", (fs[0], ms[0]), idx, short_, v * rate))
                    else:
                        mods.append((name, "pread", (fs[:1], None), first * rate, None, v * rate))
                    continue
                bl, at = runs.locate(first * rate)  # (in segments: each window's blob, and its first row there)
                if ms is not None:
                    idx = self._blobs_index(fs, ms, bl, at, v * rate, W * rate)
                    mods.append((name, "maps", (fs, ms, bl), idx, None, v * rate))
                else:
                    mods.append((name, "pread", (fs, bl), at, None, v * rate))
            sources.append((s, rows, bnd, mods))
        self._ch = _Chunk({x: i for i, x in enumerate(gs_)}, cut, samples, sources)
        return self._ch

    @staticmethod
    def _blobs_index(fs: list[Npy], ms: list[np.ndarray], bl: np.ndarray, at: np.ndarray, valid: np.ndarray,
                     per: int) -> np.ndarray:
        """_gather_index of windows each in its own blob (bl: which; at:
        their first rows there), [n, per]: the blobs' sizes checked first,
        the rows against their blob, rows past valid any of that blob."""
        for f in fs:
            _check_size(f)
        if not len(at):
            return np.zeros((0, per), np.int64)
        size = np.array([len(m) for m in ms], np.int64)[bl]
        if int(at.min()) < 0 or bool((at + np.minimum(valid, per) > size).any()):
            k = int(np.flatnonzero((at < 0) | (at + np.minimum(valid, per) > size))[0])
            raise ValueError("%s: rows %d..%d asked of its %d rows (the order and the blob disagree)" % (
                fs[int(bl[k])].path, int(at[k]), int(at[k] + valid[k]), int(size[k])))
        idx = at[:, None] + np.arange(per, dtype=np.int64)[None, :]
        if bool((valid < per).any()):
            idx = np.minimum(idx, np.maximum(size - 1, 0)[:, None])  # (rows past valid: any row, zeroed after the copy)
        return idx

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
