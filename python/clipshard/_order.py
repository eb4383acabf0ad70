"""The order stage of a materialised epoch: which samples a rank's batches
take, in what order.

An epoch's samples lie in its shards in their shuffled order (ShardOrder:
the shards in the order shuffle wrote them, or in a seeded order when a
materialised epoch is replayed, and with mixing each block of K shards'
samples permuted). A job of world_size ranks reads global batch g as
world_size contiguous slices of that order, rank r the r-th (Stride).
Neither opens a file: the source stage (_shards) reads what they name.
"""
from __future__ import annotations

import bisect
import sys
from typing import Any, Callable, Optional, Sequence

import numpy as np

__all__ = ["ShardOrder", "Stride", "check_rank_args", "worker"]


def worker() -> tuple[int, int]:
    """(worker id, number of workers) inside a torch DataLoader worker. A
    process that has not imported torch is none (importing it here cost
    the first batch of a numpy-only reader a second)."""
    data = sys.modules.get("torch.utils.data")
    if data is None:
        return 0, 1
    info = data.get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def check_rank_args(rank: Optional[int], world_size: int, batch_size: int, remainder: str) -> int:
    """The rank (0 when None with world_size 1), the arguments a reader
    of a rank's batches takes checked (EpochReader, DrawnReader)."""
    if rank is None:
        if world_size != 1:
            raise ValueError("world_size=%r without rank: give this process's rank" % (world_size,))
        rank = 0
    if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int) and 0 <= rank < world_size):
        raise ValueError("rank %r not in [0, world_size=%r)" % (rank, world_size))
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError("batch_size %r: want an int >= 1" % (batch_size,))
    if remainder not in ("drop", "pad", "partial"):
        raise ValueError("remainder %r: want 'drop', 'pad' or (one rank) 'partial'" % (remainder,))
    if remainder == "partial" and world_size != 1:
        raise ValueError("remainder='partial' is for one rank: with world_size %d every rank must get as many batches "
                         "of as many samples (a rank with one batch fewer would leave the others waiting): give 'pad' or "
                         "'drop'" % world_size)
    return rank


class Stride:
    """A rank's batches of an epoch of `samples` positions, read from the
    resume point `start` (the samples all ranks consumed): global batch g
    takes positions [start + g*B*R, start + (g+1)*B*R), rank r the slice
    [+ r*B, + (r+1)*B). What is left at the end, too little for one more
    global batch, is dropped ("drop"), filled from the epoch's start
    ("pad": positions past the end wrap), or for one rank kept as a
    shorter last batch ("partial").

        s = Stride(samples=100, rank=1, world_size=2, batch_size=8, remainder="drop")
        s.left(0), s.first(0, 0), s.consumed(0, 0)     # (6, 8, 16)
    """

    def __init__(self, samples: int, rank: int, world_size: int, batch_size: int, remainder: str) -> None:
        self.samples, self.rank, self.world_size, self.batch_size, self.remainder = (
            samples, rank, world_size, batch_size, remainder)

    def __str__(self) -> str:
        return "Stride(rank %d of %d, batches of %d of %d samples, %s)" % (
            self.rank, self.world_size, self.batch_size, self.samples, self.remainder)

    def left(self, start: int) -> int:
        """Global batches left from start (each rank reads one of each)."""
        left, per = self.samples - start, self.batch_size * self.world_size
        if left <= 0:
            return 0
        return left // per if self.remainder == "drop" else -(-left // per)

    def first(self, start: int, g: int) -> int:
        """The position this rank's share of global batch g starts at."""
        return start + g * self.batch_size * self.world_size + self.rank * self.batch_size

    def end(self, lo: int) -> int:
        """Where the batch from position lo ends: a batch on, but with
        remainder="partial" not past the epoch's end."""
        hi = lo + self.batch_size
        return min(hi, self.samples) if self.remainder == "partial" else hi

    def consumed(self, start: int, g: int) -> int:
        """The samples consumed once global batch g (read from start) is: a
        padded epoch's last counts past the end."""
        c = start + (g + 1) * self.batch_size * self.world_size
        return min(c, self.samples) if self.remainder == "partial" else c


class ShardOrder:
    """The order of a materialised epoch's samples: its shards as the
    manifest lists them or, replayed (replay_seed), in a shard order
    seeded by replay_seed and virtual_epoch; with mix > 1, each block of
    mix consecutive shards (of that order) read as one, its samples
    permuted (seeded by mix_seed, virtual_epoch and the block).

    segments(lo, hi) names the (shard position, first, last) runs of
    positions [lo, hi). entered, when set, is called with (first, last)
    shard positions as a mixed block is first entered (the source asks
    the kernel for it whole).

        o = ShardOrder(shards, virtual_epoch=3, replay_seed=7)
        o.samples, o.segments(0, 256)      # [(0, 0, 200), (1, 0, 56)]
    """

    def __init__(self, shards: Sequence[dict[str, Any]], virtual_epoch: int, replay_seed: Optional[int] = None,
                 mix: int = 1, mix_seed: int = 0) -> None:
        shards = list(shards)
        if replay_seed is not None:
            order = np.random.default_rng([replay_seed, virtual_epoch]).permutation(len(shards))
            shards = [shards[i] for i in order]
        self.shards = shards
        self.starts = [0]
        for s in shards:
            self.starts.append(self.starts[-1] + s["samples"])
        self.samples: int = self.starts[-1]
        self.virtual_epoch, self.mix, self.mix_seed = virtual_epoch, mix, mix_seed
        self.entered: Optional[Callable[[int, int], None]] = None
        self._perms: dict[int, np.ndarray] = {}  # block -> permutation of its samples (one block at a time)

    def __str__(self) -> str:
        return "ShardOrder(%d shards, %d samples, mix %d)" % (len(self.shards), self.samples, self.mix)

    def segments(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """(shard position, first, last) runs covering the positions
        [lo, hi), positions past the end wrapping to the start
        (remainder="pad"); with mixing, one run per sample."""
        out = []
        n = self.samples
        p = lo
        while p < hi:
            q = p % n
            end = min(hi, p + (n - q))  # up to the end of the epoch
            if self.mix == 1:
                a = q
                while a < q + (end - p):
                    k = bisect.bisect_right(self.starts, a) - 1
                    b = min(q + (end - p), self.starts[k + 1])
                    out.append((k, a - self.starts[k], b - self.starts[k]))
                    a = b
            else:
                for v in range(q, q + (end - p)):
                    k, i = self.mixed(v)
                    out.append((k, i, i + 1))
            p = end
        return out

    def mixed(self, v: int) -> tuple[int, int]:
        """Shard position and index of position v with mixing."""
        block = bisect.bisect_right(self.starts, v) - 1
        block -= block % self.mix
        first, last = block, min(block + self.mix, len(self.shards))
        b0 = self.starts[first]
        perm = self._perms.get(block)
        if perm is None:
            self._perms = {}  # one block at a time
            rng = np.random.default_rng([self.mix_seed, self.virtual_epoch, block])
            perm = self._perms[block] = rng.permutation(self.starts[last] - b0)
            if self.entered is not None:
                self.entered(first, last)
        u = b0 + int(perm[v - b0])
        k = bisect.bisect_right(self.starts, u) - 1
        return k, u - self.starts[k]
