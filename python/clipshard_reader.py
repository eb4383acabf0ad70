"""Read clipshard epoch shards with numpy alone.

    from clipshard_reader import EpochShards
    shards = EpochShards("/data/epochs", epoch=3, rank=rank)
    for batch in shards.batches(256):
        batch["whisper"]   # float16 [B, W*rate, 64]
        batch["samples"]   # int64 [B, 3]: clip, start, valid

Shard files are memory-mapped and read strictly in order, so each batch is
one sequential read. The next `prefetch` batches (default 2) are asked of
the kernel ahead of time (posix_fadvise WILLNEED: asynchronous reads, many
in flight), so the speed does not hang on the filesystem's readahead size
(with the common 128 KiB, page faults alone read a few hundred MB/s). On
a network filesystem (NFS, Lustre) pass `read=True` to `batches`: each
batch is then read with one read call per modality into a new array,
which the client turns into large parallel requests (and the kernel's
readahead follows: no prefetch by default there). `replay_seed` reuses one materialised epoch for later
epochs in a seeded shard order (1x storage, coarser shuffle): pass the
epoch that exists as `epoch` and the training epoch as `virtual_epoch`.
"""
import json
import os

import numpy as np

__all__ = ["EpochShards"]


class EpochShards:
    def __init__(self, edir, epoch, rank=0, replay_seed=None, virtual_epoch=None):
        with open(os.path.join(edir, "epochs.json")) as f:
            man = json.load(f)
        if man.get("format") != "clipshard.epochs":
            raise ValueError("%s: not a clipshard epochs directory" % edir)
        entry = next((e for e in man["epochs"] if e["epoch"] == epoch), None)
        if entry is None:
            raise ValueError("%s: epoch %d is not materialised (have %s)" % (edir, epoch, [e["epoch"] for e in man["epochs"]]))
        if not 0 <= rank < man["world_size"]:
            raise ValueError("rank %d not in [0, %d)" % (rank, man["world_size"]))
        self.dir = edir
        self.manifest = man
        self.modalities = [m["name"] for m in man["modalities"]]
        shards = sorted((s for s in entry["shards"] if s["rank"] == rank), key=lambda s: s["shard"])
        if replay_seed is not None:
            order = np.random.default_rng([replay_seed, virtual_epoch or 0]).permutation(len(shards))
            shards = [shards[i] for i in order]
        self.shards = shards

    def __len__(self):
        return sum(s["samples"] for s in self.shards)

    def _open(self, shard):
        out = {}
        for name in self.modalities + ["samples"]:
            path = os.path.join(self.dir, *shard["files"][name].split("/"))
            out[name] = np.load(path, mmap_mode="r")
        return out

    def batches(self, batch_size, drop_last=False, read=False, prefetch=None):
        """Yield dicts of numpy arrays, batch_size samples each, in order.

        read=False: views of the memory-mapped shards (no copy).
        read=True: arrays of their own, read with one call per modality.
        prefetch: batches read ahead, asynchronously, by the kernel; by
        default 2 for the views (page faults), 0 with read=True (one large
        read a batch, which the kernel's own readahead follows).
        """
        if prefetch is None:
            prefetch = 0 if read else 2
        ahead = _Ahead(self, batch_size * prefetch) if prefetch > 0 and hasattr(os, "posix_fadvise") else None
        try:
            yield from self._batches(batch_size, drop_last, read, ahead)
        finally:
            if ahead is not None:
                ahead.close()

    def _batches(self, batch_size, drop_last, read, ahead):
        pending, have = [], 0
        for s, shard in enumerate(self.shards):
            arrays = self._read_views(shard) if read else self._open(shard)
            n, i = shard["samples"], 0
            while i < n:
                take = min(batch_size - have, n - i)
                if ahead is not None:
                    ahead.advance(s, i + take)
                pending.append({k: v[i : i + take] for k, v in arrays.items()})
                have += take
                i += take
                if have == batch_size:
                    yield _join(pending)
                    pending, have = [], 0
        if pending and not drop_last:
            yield _join(pending)


    def _read_views(self, shard):
        return {name: _ReadArray(os.path.join(self.dir, *shard["files"][name].split("/")))
                for name in self.modalities + ["samples"]}


class _ReadArray:
    """An open .npy shard file whose [i:j] slices are read with os.preadv
    into a new array (one call, unless the kernel returns less)."""

    def __init__(self, path):
        self.path = path
        self.offset, self.shape, self.dtype, self.row = _header(path)
        self.fd = os.open(path, os.O_RDONLY)

    def __getitem__(self, sl):
        out = np.empty((sl.stop - sl.start,) + tuple(self.shape[1:]), dtype=self.dtype)
        view = memoryview(out).cast("B")
        off, got = self.offset + sl.start * self.row, 0
        while got < len(view):
            n = os.preadv(self.fd, [view[got:]], off + got)
            if not n:
                raise EOFError("%s: file shorter than its header says" % self.path)
            got += n
        return out

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    __del__ = close


class _Ahead:
    """Asks the kernel to read the shard files ahead of the reader: up to
    `samples` samples past the reader's position, across shard boundaries,
    in every file of the shards (posix_fadvise WILLNEED, in pieces the
    kernel reads in full)."""

    PIECE = 256 << 10

    def __init__(self, shards, samples):
        self.r, self.samples = shards, samples
        self.s, self.i = 0, 0  # asked up to: shard, sample
        self.files = {}  # shard -> [(fd, data offset, row bytes)]

    def _files(self, s):
        if s not in self.files:
            out = []
            for name in self.r.modalities + ["samples"]:
                path = os.path.join(self.r.dir, *self.r.shards[s]["files"][name].split("/"))
                offset, _, _, row = _header(path)
                out.append((os.open(path, os.O_RDONLY), offset, row))
            self.files[s] = out
        return self.files[s]

    def advance(self, s, i):
        """The reader is at sample i of shard s: ask for what follows."""
        left = self.samples
        for old in [k for k in self.files if k < s]:
            for fd, _, _ in self.files.pop(old):
                os.close(fd)
        # Where the asked-for part ends: `samples` past (s, i).
        ts, ti = s, i + left
        while ts < len(self.r.shards) and ti > self.r.shards[ts]["samples"]:
            ti -= self.r.shards[ts]["samples"]
            ts += 1
        if ts >= len(self.r.shards):
            ts, ti = len(self.r.shards) - 1, self.r.shards[-1]["samples"]
        while (self.s, self.i) < (ts, ti):
            n = self.r.shards[self.s]["samples"]
            end = ti if self.s == ts else n
            if end > self.i:
                for fd, off, row in self._files(self.s):
                    a, b = off + self.i * row, off + end * row
                    for p in range(a, b, self.PIECE):
                        os.posix_fadvise(fd, p, min(self.PIECE, b - p), os.POSIX_FADV_WILLNEED)
            if end == n and self.s < ts:
                self.s, self.i = self.s + 1, 0
            else:
                self.i = end

    def close(self):
        for files in self.files.values():
            for fd, _, _ in files:
                os.close(fd)
        self.files = {}

    __del__ = close


def _header(path):
    """The data offset, shape, dtype and bytes per row of the .npy at path."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
        offset = f.tell()
    if fortran:
        raise ValueError("%s: Fortran order: not a clipshard shard" % path)
    return offset, shape, dtype, int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize


def _join(parts):
    # One part: views of the memory-mapped shard (no copy; the consumer's
    # copy, e.g. into pinned memory, is the one sequential read). Several:
    # a batch that spans shards is concatenated.
    if len(parts) == 1:
        return dict(parts[0])
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
