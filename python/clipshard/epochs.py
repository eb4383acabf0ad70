"""Read an epoch written by `shuffle`: one global order per epoch that any
world size reads.

An epoch's samples lie in shard files in their shuffled order. A job of
`world_size` ranks with `batch_size` samples per rank reads global batch g
as world_size contiguous slices of that order: rank r takes samples

    [start + g*B*R + r*B,  start + g*B*R + (r+1)*B)

where `start` is where the job resumed (0 for a fresh epoch). Each batch is
then one sequential read per modality (two at a shard boundary). The
reader's state is the count of samples of the epoch consumed by all ranks
together; a job resumed from it with another world size or batch size goes
on from exactly there. What is left at the end of an epoch, too little for
one more global batch, is dropped (`remainder="drop"`, the default) or
filled with samples from the start of the epoch (`remainder="pad"`, as
torch's DistributedSampler pads), so that every rank gets the same number
of batches; one rank alone may keep it as a shorter last batch
(`remainder="partial"`).

EpochReader composes the stages: the order (_order: which positions, in
what order), the source (_shards: the shard files, on disk or through a
bucket's cache) and the assembly of a batch from them (here; the Loader's
read threads are another).
"""
from __future__ import annotations

import os
from typing import Any, Iterator, Mapping, Optional, Union

import numpy as np

from ._manifest import (STATE_VERSION, check_datasets, check_shards, check_state, epoch_identity, epoch_labels, expected_files, load_epochs,
                        parse_size, row_bytes, source_column, source_names)
from ._labels import check_codes, pick_labels
from ._order import ShardOrder, Stride, check_rank_args, worker
from ._shards import BucketShards, ShardFiles, open_epochs

__all__ = ["EpochReader", "load_epochs", "source_names", "open_epochs", "check_datasets", "check_state", "epoch_identity",
           "STATE_FORMAT", "STATE_VERSION"]

STATE_FORMAT = "clipshard.reader"


class EpochReader:
    """The batches of one rank of one epoch, as dicts of numpy arrays:
    one entry per modality ([B, W*rate, *frame_shape] float16; a per-clip
    modality, convert's NAME@clip=, gives each sample its clip's value:
    [B, *frame_shape]) and "samples" (int64 [B, 3]: clip row, start
    frame, valid frames). Epochs mixed from several datasets (shuffle
    --source, format version 3) have a fourth samples column, and
    "source" (int64 [B], a view of it): each sample's index into
    reader.sources, the sources' names (clip rows are its source's).

    rank, world_size: this process's place in the job (any world size: the
        epoch does not depend on it).
    batch_size: samples per rank per batch (B).
    remainder: "drop", "pad" or, for one rank, "partial" (see the module
        doc). Reading an epoch too small for one global batch is refused
        with "drop" (it would give no batch).
    replay_seed, virtual_epoch: read a materialised epoch in a seeded shard
        order for a later training epoch (1x storage, a coarser shuffle).
    mix_shards: read K consecutive shards (of that order) as one block and
        shuffle the samples across them (seeded by mix_seed and the
        virtual epoch): a finer shuffle of a replayed epoch, holding K
        shards' worth of the page cache. mix_mem picks K from a memory cap
        instead ("2GiB" or bytes).
    read: False: views of the memory-mapped shards (no copy); True: arrays
        of their own, one read call per modality (for NFS or Lustre).
    prefetch: batches of this rank asked of the kernel ahead of time
        (posix_fadvise); default 2 with read=False, 0 with read=True.

        from clipshard import EpochReader
        r = EpochReader("/data/epochs", epoch=3, rank=rank, world_size=8, batch_size=256)
        r.load_state_dict(saved)          # optional: resume (any world size, any batch size)
        for batch in r:                   # {"whisper": float16 [256, 30, 64], ..., "samples": int64 [256, 3]}
            step(batch); saved = r.state_dict()
    """

    def __init__(self, edir: str, epoch: int, rank: Optional[int] = None, world_size: int = 1, batch_size: int = 256,
                 remainder: str = "drop", replay_seed: Optional[int] = None, virtual_epoch: Optional[int] = None,
                 mix_shards: int = 1, mix_seed: int = 0, mix_mem: Union[str, int, None] = None,
                 read: bool = False, prefetch: Optional[int] = None,
                 cache_dir: Optional[str] = None, cache_limit: Union[str, int, None] = None,
                 _manifest: Optional[dict[str, Any]] = None, _pin: Optional[tuple[int, int]] = None,
                 _remote: Any = None) -> None:
        # (_manifest: the epochs.json the caller loaded and checked, e.g.
        # clipshard.Loader's, read once for all its epochs; _pin: the epoch
        # folder's identity another reader of the same epoch pinned, e.g.
        # EpochDataset's for its DataLoader workers; _remote: the caller's
        # bucket entry, clipshard.Loader's, shared by its readers)
        self.url = edir  # as given (a folder, or s3://...)
        # (what makes this reader again in another process: see __reduce__)
        self._made: Optional[dict[str, Any]] = None if _remote is not None else dict(
            edir=edir, epoch=epoch, rank=rank, world_size=world_size, batch_size=batch_size, remainder=remainder,
            replay_seed=replay_seed, virtual_epoch=virtual_epoch, mix_shards=mix_shards, mix_seed=mix_seed, mix_mem=mix_mem,
            read=read, prefetch=prefetch, cache_dir=cache_dir, cache_limit=cache_limit)
        remote = _remote
        if remote is not None:
            edir = remote.root
        else:
            edir, remote = open_epochs(edir, cache_dir, cache_limit)
        man = _manifest
        if man is None:
            man = load_epochs(edir)
            check_datasets(man, self.url)
        entry = _entry(edir, man, epoch)
        rank = check_rank_args(rank, world_size, batch_size, remainder)
        self.dir, self.manifest, self.epoch = edir, man, epoch
        self.virtual_epoch = epoch if virtual_epoch is None else virtual_epoch
        self.rank, self.world_size, self.batch_size, self.remainder = rank, world_size, batch_size, remainder
        self.read = read
        self.prefetch = (0 if read else 2) if prefetch is None else prefetch
        self.expect = expected_files(edir, man)  # name -> (dtype, shape of one sample) of every shard file
        self.modalities = [m["name"] for m in man["modalities"]]
        self.names = self.modalities + ["samples"]
        # Mixed epochs (version 3): each batch also holds "source", the
        # index into self.sources of each sample's dataset (the samples'
        # fourth column, a view of it).
        self.sources = source_names(man)
        self.mixed = man.get("version") == 3
        shards = check_shards(edir, man, entry, self.names)
        self.mix = _mix(mix_shards, mix_mem, read, _shard_bytes(shards, self.expect))
        self.mix_seed = mix_seed
        # The stages: the order of the epoch's positions, the rank's share
        # of each global batch, the files they are read from.
        self.order = ShardOrder(shards, self.virtual_epoch, replay_seed, self.mix, mix_seed)
        self.shards, self.samples = self.order.shards, self.order.samples
        self.stride = Stride(self.samples, rank, world_size, batch_size, remainder)
        args = (edir, self.url, man, epoch, entry, self.order, self.expect)
        kw: dict[str, Any] = dict(mix=self.mix, read=read, prefetch=self.prefetch, pin=_pin)
        self.files = ShardFiles(*args, **kw) if remote is None else BucketShards(
            remote, *args, rank=rank, world_size=world_size, batch_size=batch_size, **kw)
        # The version of the epoch this reader delivers is pinned when it
        # starts reading (ShardFiles.pinned): epochs.json must still
        # describe this epoch as it did when it was loaded, and every
        # shard is then opened inside the epoch folder it found, which a
        # rewrite of the epoch (shuffle --force) replaces: a reader never
        # mixes two orders.
        self.identity = self.files.identity
        self.start = 0  # samples consumed when this reader was resumed
        self.consumed = 0

    def __str__(self) -> str:
        return "EpochReader(%s, epoch %d, rank %d of %d, batches of %d, %d samples)" % (
            self.url, self.epoch, self.rank, self.world_size, self.batch_size, self.samples)

    # -- sizes and state -------------------------------------------------

    def batches_left(self) -> int:
        """Global batches left from the resume point (each rank reads one
        of each)."""
        return self.stride.left(self.start)

    def __len__(self) -> int:
        return self.batches_left()

    def labels(self, name: str) -> list[str]:
        """Label modality name's vocabulary (convert --label NAME), from
        epochs.json: a batch's code c in batch[name] is labels(name)[c]."""
        return pick_labels(epoch_labels(self.dir, self.manifest), name, self.dir)

    def state_dict(self) -> dict[str, Any]:
        """The state to resume from: the samples of the epoch consumed by
        all ranks together (the same on every rank), with what identifies
        the epoch (its epoch_identity: the options, the sources and their
        weights, its shards). A plain dict of ints and strings (torch.save,
        JSON)."""
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "epoch": self.epoch, "virtual_epoch": self.virtual_epoch,
                "seed": self.manifest["seed"], "samples": self.samples, "consumed": self.consumed,
                "epoch_id": self.identity}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume where state says, with this reader's world size and batch
        size (which may differ from those that saved it). The state must be
        of this very epoch (its epoch_id: another folder with the same seed
        and size but other weights is refused), with values of their exact
        types; a version 1 state (before epoch_id) is checked on the rest."""
        check_state(state, STATE_FORMAT, {"epoch": int, "virtual_epoch": int, "seed": int, "samples": int, "consumed": int})
        mine = self.state_dict()
        keys = ["epoch", "virtual_epoch", "seed", "samples"] + (["epoch_id"] if state["version"] >= 2 else [])
        for k in keys:
            if state[k] != mine[k]:
                raise ValueError("state is of %s %r, this reader's is %r (another epoch, or another epochs folder)" % (k, state[k], mine[k]))
        c = state["consumed"]
        if c < 0:
            raise ValueError("state consumed %r: want an int >= 0" % (c,))
        # Past the end: a padded epoch's last batch (it took samples from
        # the start again): the epoch is done.
        self.start = self.consumed = min(int(c), self.samples)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Pickled (a DataLoader worker started by spawn or forkserver), the
        # reader is made again in the other process from its arguments and
        # the epochs manifest it loaded, at its resume point (what
        # load_state_dict set; not where an iteration of it got to). Its
        # open files do not travel; the epoch folder's pin does (once this
        # reader has begun): the other one reads that version of the epoch
        # or raises, and without a pin checks epochs.json as it starts.
        if self._made is None:
            raise TypeError("an EpochReader made by a clipshard.Loader (which shares its bucket's cache entry) cannot be "
                            "pickled: pickle the Loader before it iterates, or make an EpochReader of your own")
        return (_reader_again, (self._made, self.manifest, self.files.pin, self.start))

    # -- iteration --------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self.batches()

    def batches(self, worker_id: Optional[int] = None, num_workers: Optional[int] = None,
                first: Optional[int] = None) -> Iterator[dict[str, np.ndarray]]:
        """Yield this rank's batches in order. Inside a DataLoader worker
        (found through torch, or given) only every num_workers-th batch,
        from the worker_id-th (or from batch first, one of the worker's):
        with DataLoader(batch_size=None) the workers' batches arrive in the
        order of a single process."""
        if worker_id is None or num_workers is None:
            worker_id, num_workers = worker()
        if first is not None and (first < worker_id or (first - worker_id) % num_workers):
            raise ValueError("first batch %r is not one of worker %d of %d's" % (first, worker_id, num_workers))
        self.check_fits()
        s, files, labels = self.stride, self.files, epoch_labels(self.dir, self.manifest)
        mine = range(worker_id if first is None else first, self.batches_left(), num_workers)
        try:
            for i, g in enumerate(mine):
                lo = s.first(self.start, g)
                files.rows_ready(lo, lo + self.batch_size, [s.first(self.start, h) for h in mine[i + 1: i + 1 + files.fetch_batches]])
                if self.prefetch > 0 and hasattr(os, "posix_fadvise"):
                    for h in mine[i: i + self.prefetch + 1]:
                        a = s.first(self.start, h)
                        files.advise(a, a + self.batch_size)
                batch = self._gather(lo, s.end(lo))
                for name, voc in labels.items():  # (a code of -1 would name the last label)
                    check_codes(self.dir, name, batch[name], voc, "batch %d's sample" % g)
                if self.mixed:
                    batch["source"] = source_column(batch["samples"], len(self.sources), lambda: "%s (the batch at %d)" % (
                        files.path(self.order.segments(lo, lo + 1)[0][0], "samples"), lo))
                self.consumed = s.consumed(self.start, g)
                yield batch
        finally:
            self.close()

    def check_fits(self) -> None:
        """Refuse to read an epoch that would give no batch: fewer samples
        than one global batch, with remainder="drop" (a resumed epoch near
        its end may have none left: that is not this)."""
        B, R = self.batch_size, self.world_size
        if self.remainder == "drop" and 0 < self.samples < B * R:
            raise ValueError("%s: epoch %d has %d samples, fewer than one global batch (batch_size %d x world_size %d = %d): it "
                             "would give no batch; give a smaller batch_size, or remainder='pad' (the last batch filled from the "
                             "epoch's start)%s" % (self.dir, self.epoch, self.samples, B, R, B * R,
                                                   ", or 'partial' (one short batch)" if R == 1 else ""))

    def close(self) -> None:
        """Close every file (the reader reopens what it needs)."""
        self.files.close()

    def _gather(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        """The batch of positions [lo, hi): views of one memory-mapped
        shard (no copy; the consumer's copy, e.g. into pinned memory, is
        the one sequential read), arrays of their own with read=True, or
        pieces put together."""
        segs = self.order.segments(lo, hi)
        if self.mix > 1:
            # Each shard's samples taken at once, in index order, then put
            # in the batch's order.
            by_shard: dict[int, list[tuple[int, int]]] = {}
            for j, (k, i, _) in enumerate(segs):
                by_shard.setdefault(k, []).append((i, j))
            parts: dict[str, list[Any]] = {name: [None] * len(segs) for name in self.names}
            for k, items in by_shard.items():
                items.sort()
                idx = np.array([i for i, _ in items])
                arrays = self.files.open(k)
                for name in self.names:
                    for (_, j), row in zip(items, arrays[name][idx]):
                        parts[name][j] = row
            return {name: np.stack(parts[name]) for name in self.names}
        pieces = [{name: self.files.open(k)[name][a:b] for name in self.names} for k, a, b in segs]
        if len(pieces) == 1:
            return pieces[0]
        return {name: np.concatenate([p[name] for p in pieces]) for name in self.names}


def _reader_again(made: dict[str, Any], manifest: dict[str, Any], pin: Optional[tuple[int, int]], start: int) -> EpochReader:
    r = EpochReader(**made, _manifest=manifest, _pin=pin)
    r.start = r.consumed = start
    return r


def _entry(edir: str, man: Mapping[str, Any], epoch: int) -> Mapping[str, Any]:
    """epochs.json's entry of epoch."""
    entries = man.get("epochs")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError("%s: epochs.json: 'epochs' is not a list of epochs" % edir)
    entry = next((e for e in entries if e.get("epoch") == epoch), None)
    if entry is None:
        raise ValueError("%s: epoch %d is not materialised (have %s)" % (edir, epoch, [e.get("epoch") for e in entries]))
    return entry


def _shard_bytes(shards: list[dict[str, Any]], expect: Mapping[str, tuple[Any, list[int]]]) -> int:
    """Bytes of a full shard's files (from the manifest)."""
    if not shards:
        return 1
    n = max(s["samples"] for s in shards)
    return sum(n * row_bytes(dtype, shape) for dtype, shape in expect.values())


def _mix(mix_shards: Any, mix_mem: Union[str, int, None], read: bool, per: int) -> int:
    """The shards mixed into one block (mix_shards, or as many of per
    bytes as mix_mem holds), checked."""
    if not isinstance(mix_shards, (int, np.integer)) or mix_shards < 1:
        raise ValueError("mix_shards %r: want an int >= 1" % (mix_shards,))
    if mix_mem is not None:
        if mix_shards != 1:
            raise ValueError("mix_shards and mix_mem: give one of them")
        mix_shards = parse_size(mix_mem) // max(1, per)
        if mix_shards < 2:
            raise ValueError("mix_mem %r holds %d shards of %d bytes: mixing needs room for 2 or more (give mix_mem >= %d, "
                             "or no mix_mem)" % (mix_mem, mix_shards, per, 2 * per))
    if read and mix_shards > 1:
        raise ValueError("read=True and mixing: mixed samples are gathered one by one from the memory-mapped "
                         "shards; give read=False (the mix block is asked of the kernel ahead of time)")
    return int(mix_shards)
