"""The order stage of epochs drawn at read time (docs/FORMAT.md, "Epochs
drawn at read time"): each source's windows drawn from a counter-based
hash of (seed, epoch), its frames cut into blocks and groups of blocks in
a seeded order, the sources mixed by their weights into one order
(Order); and the intervals of it a state says are left.

Nothing here opens a file: the sources (_blocks) are read for their clip
lengths and geometry only.
"""
from __future__ import annotations

import os
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

import numpy as np

if TYPE_CHECKING:
    from ._blocks import Source
    from .draw import Drawn

__all__ = ["Order", "draw", "key", "stream", "below", "order_blocks"]

GAMMA = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1
SALT = 0x636C697073686172  # "clipshar"
TAG_OFFSETS, TAG_BLOCKS, TAG_ORDER, TAG_MERGE = 1, 2, 3, 4

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

    def __init__(self, src: "Source", plan: "Drawn", seed: int, epoch: int) -> None:
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


def _check_options(window: Any, sampling: Any, short: Any, per_clip: Any, seed: Any, epoch_samples: Any) -> None:
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


def _items(dataset: Any) -> tuple[list[tuple[str, Any]], bool]:
    """[(name, folder or URL)] of dataset, and whether it mixes several."""
    if isinstance(dataset, Mapping):
        items = list(dataset.items())
        if not items:
            raise ValueError("dataset: an empty {name: folder} mapping")
        for n, _ in items:
            if not isinstance(n, str) or not 1 <= len(n) <= 64 or not all(c.isalnum() or c in "_.-" for c in n) or not n.isascii():
                raise ValueError("dataset: source name %r: want 1-64 of [A-Za-z0-9_.-]" % (n,))
        return items, True
    if isinstance(dataset, (str, os.PathLike)):
        where = os.fspath(dataset)
        return [(os.path.basename(os.path.normpath(where)) or "dataset", where)], False
    raise ValueError("dataset %r: want a folder, an s3:// URL, or {name: folder or URL}" % (dataset,))
