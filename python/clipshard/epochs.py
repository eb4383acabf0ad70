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
"""
from __future__ import annotations

import bisect
import hashlib
import json
import math
import mmap
import os
import stat
import sys
from typing import Any, Iterable, Iterator, Mapping, Optional, Union

import numpy as np

from . import _remote
from ._remote import blocks as _disk_blocks
from ._files import MAX_MANIFEST, MAX_SAMPLE, Npy, cached, confined, open_regular, pread_all, read_json

__all__ = ["EpochReader", "load_epochs", "source_names"]

STATE_FORMAT = "clipshard.reader"


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


def load_epochs(edir: str) -> dict[str, Any]:
    """Load and check EDIR/epochs.json (a regular file of bounded size).

        from clipshard import load_epochs
        man = load_epochs("/data/epochs")
        [e["epoch"] for e in man["epochs"]]        # the materialised epochs
        [m["name"] for m in man["modalities"]]     # what each batch holds
        man["seed"], man["window"], man["shard_samples"]
    """
    if not os.path.lexists(os.path.join(edir, "epochs.json")) and os.path.lexists(os.path.join(edir, "dataset.json")):
        raise ValueError("%s is a dataset (it holds dataset.json), not an epochs folder (no epochs.json): cut epochs from it "
                         "with clipshard shuffle --dataset %s --out EDIR --window W --epochs N, or read its clips with "
                         "clipshard.Dataset" % (edir, edir))
    man = read_json(os.path.join(edir, "epochs.json"))
    if man.get("format") != "clipshard.epochs":
        raise ValueError("%s: not a clipshard epochs directory" % edir)
    if man.get("version") == 1:
        raise ValueError("%s: epochs of format version 1 (a folder per rank); run shuffle again into a new folder "
                         "(version 2 is one order per epoch that any world size reads)" % edir)
    if man.get("version") not in (2, 3):
        raise ValueError("%s: epochs format version %r, this reader knows versions 2 and 3" % (edir, man.get("version")))
    if man["version"] == 3:
        src = man.get("sources")
        names = [s.get("name") if isinstance(s, dict) else None for s in src] if isinstance(src, list) else None
        if not names or any(not isinstance(n, str) or not n for n in names) or len(set(names)) != len(names):
            raise ValueError("%s: epochs.json: version 3 without a list of named sources (%r)" % (edir, src))
    return man


def check_datasets(man: Mapping[str, Any], edir: str) -> None:
    """The datasets epochs were cut from (their dataset, or each source of
    mixed epochs), where present at the folder epochs.json records, must be
    those recorded (the sha256 of their dataset.json): a dataset converted
    again in place under its epochs is refused, naming both (each sample's
    clip row would name a clip of another dataset). A dataset that is not
    there (moved, or on another machine) is not checked."""
    refs = []
    if man.get("version") == 3:
        for s in man.get("sources") or []:
            if isinstance(s, dict):
                refs.append(("source %s" % s.get("name"), s.get("dir"), s.get("manifest_sha256")))
    elif isinstance(man.get("dataset"), dict):
        refs.append(("dataset", man["dataset"].get("dir"), man["dataset"].get("manifest_sha256")))
    for what, d, want in refs:
        if not isinstance(d, str) or not os.path.isabs(d) or not isinstance(want, str) or "\0" in d:
            continue
        p = os.path.join(d, "dataset.json")
        try:
            os.stat(p)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:
            raise ValueError("%s: the %s the epochs were cut from, %s: its dataset.json cannot be read to check that it is "
                             "still that dataset: %s" % (edir, what, d, e.strerror)) from None
        try:
            now = _sha_of(p)
        except ValueError as e:
            raise ValueError("%s: the %s the epochs were cut from: %s" % (edir, what, e)) from None
        if now != want and _kept_version(d, want):
            continue  # a version convert --segments kept: the epochs read it
        if now != want:
            raise ValueError("%s: cut from the %s %s when its dataset.json had sha256 %s; it now has %s: the dataset was "
                             "converted again (or replaced) since the shuffle, and the samples' clip rows name the clips of "
                             "the dataset they were cut from, not of this one: shuffle again from %s (into a new folder, or "
                             "--force), or restore the dataset they were cut from" % (edir, what, d, want, now, d))


def _sha_of(p: str) -> str:
    """The sha256 of the manifest at p (a regular file of at most
    MAX_MANIFEST bytes, else ValueError)."""
    fd, st = open_regular(p)
    try:
        return hashlib.sha256(pread_all(fd, min(st.st_size, MAX_MANIFEST + 1), 0, p)).hexdigest()
    finally:
        os.close(fd)


def _kept_version(d: str, want: str) -> bool:
    """Whether the dataset in d keeps a version (versions/N/dataset.json,
    of a dataset grown by convert --segments) whose dataset.json has sha256
    want."""
    try:
        names = os.listdir(os.path.join(d, "versions"))
    except OSError:
        return False
    for n in names:
        if not n.isdigit() or n.startswith("0") or len(n) > 9:
            continue
        try:
            if _sha_of(os.path.join(d, "versions", n, "dataset.json")) == want:
                return True
        except (OSError, ValueError):
            continue
    return False


def epoch_identity(man: Mapping[str, Any], epoch: int) -> str:
    """What identifies epoch's samples in an epochs folder: a hash of
    epochs.json's options (seed, window, sampling, the dataset or the
    sources, the weight schedule...: everything but the list of epochs,
    "created" and "tool") and of the epoch's own entry (its shards and,
    when mixed, its weights and counts). Another epoch committed beside it
    leaves it unchanged; a shuffle --force with other options changes it.
    A reader checks it when it starts reading, and a state carries it."""
    top = {k: v for k, v in man.items() if k not in ("epochs", "created", "tool")}
    entry = next((e for e in man.get("epochs", []) if isinstance(e, dict) and e.get("epoch") == epoch), None)
    b = json.dumps([top, entry], sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(b).hexdigest()[:32]


def source_names(man: Mapping[str, Any]) -> list[str]:
    """The names of an epochs folder's sources, in the order of the
    batches' "source" numbers: a mixed folder's (version 3) sources, or
    the one dataset's folder name (version 2)."""
    if man.get("version") == 3:
        return [s["name"] for s in man["sources"]]
    ds = man.get("dataset")  # (a name only: what is not a folder's entry names the one source "dataset")
    return [os.path.basename(os.path.normpath(str(ds.get("dir") or "dataset") if isinstance(ds, dict) else "dataset"))]


def _worker() -> tuple[int, int]:
    """(worker id, number of workers) inside a torch DataLoader worker. A
    process that has not imported torch is none (importing it here cost
    the first batch of a numpy-only reader a second)."""
    data = sys.modules.get("torch.utils.data")
    if data is None:
        return 0, 1
    info = data.get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


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
        # EpochDataset's for its DataLoader workers)
        self.url = edir  # as given (a folder, or s3://...)
        # (what makes this reader again in another process: see __reduce__)
        self._made: Optional[dict[str, Any]] = None if _remote is not None else dict(
            edir=edir, epoch=epoch, rank=rank, world_size=world_size, batch_size=batch_size, remainder=remainder,
            replay_seed=replay_seed, virtual_epoch=virtual_epoch, mix_shards=mix_shards, mix_seed=mix_seed, mix_mem=mix_mem,
            read=read, prefetch=prefetch, cache_dir=cache_dir, cache_limit=cache_limit)
        if _remote is not None:  # (the caller's: clipshard.Loader's, shared by its readers)
            edir, self._remote = _remote.root, _remote
        else:
            edir, self._remote = open_epochs(edir, cache_dir, cache_limit)
        if _manifest is None:
            man = load_epochs(edir)
            check_datasets(man, self.url)
        else:
            man = _manifest
        entries = man.get("epochs")
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise ValueError("%s: epochs.json: 'epochs' is not a list of epochs" % edir)
        entry = next((e for e in entries if e.get("epoch") == epoch), None)
        if entry is None:
            raise ValueError("%s: epoch %d is not materialised (have %s)" % (edir, epoch, [e.get("epoch") for e in entries]))
        rank = _check_rank_args(rank, world_size, batch_size, remainder)
        self.dir, self.manifest, self.epoch = edir, man, epoch
        self.virtual_epoch = epoch if virtual_epoch is None else virtual_epoch
        self.rank, self.world_size, self.batch_size, self.remainder = rank, world_size, batch_size, remainder
        self.read = read
        self.prefetch = (0 if read else 2) if prefetch is None else prefetch
        self._expect = _expected(edir, man)
        self.modalities = [m["name"] for m in man["modalities"]]
        self.names = self.modalities + ["samples"]
        # Mixed epochs (version 3): each batch also holds "source", the
        # index into self.sources of each sample's dataset (the samples'
        # fourth column, a view of it).
        self.sources = source_names(man)
        self.mixed = man.get("version") == 3
        shards = _check_shards(edir, man, entry, self.names)
        # The version of the epoch this reader delivers is pinned when it
        # starts reading (see _pinned): epochs.json must still describe
        # this epoch as it did when it was loaded, and every shard is then
        # opened inside the epoch folder it found, which a rewrite of the
        # epoch (shuffle --force) replaces: a reader never mixes two orders.
        self.identity = epoch_identity(man, epoch)
        self._epoch_dir = confined(edir, entry.get("dir"), "epoch dir")
        self._pin = _pin
        self._check_rows = _row_checks(edir, man)
        if replay_seed is not None:
            order = np.random.default_rng([replay_seed, self.virtual_epoch]).permutation(len(shards))
            shards = [shards[i] for i in order]
        self.shards = shards
        self._starts = [0]
        for s in shards:
            self._starts.append(self._starts[-1] + s["samples"])
        self.samples = self._starts[-1]  # in the epoch
        self._shards: dict[int, dict[str, Npy]] = {}  # shard position -> {name: Npy}, checked
        self._files: dict[int, dict[str, Any]] = {}  # shard position -> {name: array-like}
        if not isinstance(mix_shards, (int, np.integer)) or mix_shards < 1:
            raise ValueError("mix_shards %r: want an int >= 1" % (mix_shards,))
        if mix_mem is not None:
            if mix_shards != 1:
                raise ValueError("mix_shards and mix_mem: give one of them")
            per = self._shard_bytes()
            mix_shards = _size(mix_mem) // max(1, per)
            if mix_shards < 2:
                raise ValueError("mix_mem %r holds %d shards of %d bytes: mixing needs room for 2 or more (give mix_mem >= %d, "
                                 "or no mix_mem)" % (mix_mem, mix_shards, per, 2 * per))
        self.mix = int(mix_shards)
        if read and self.mix > 1:
            raise ValueError("read=True and mixing: mixed samples are gathered one by one from the memory-mapped "
                             "shards; give read=False (the mix block is asked of the kernel ahead of time)")
        self.mix_seed = mix_seed
        self._perms: dict[int, np.ndarray] = {}  # block -> permutation of its samples
        self._hold: Optional[int] = None  # no shard from this one on is closed (a batch spanning shards: hold)
        self.start = 0  # samples consumed when this reader was resumed
        self.consumed = 0
        self._ranged = False  # a bucket's shard files fetched by the block ranges this rank reads (else whole)
        self._node = (1, 0)  # (ranks on this node, this rank's place among them), from LOCAL_WORLD_SIZE
        if self._remote is not None:
            # The read-ahead of a bucket's shards: this many groups past the
            # one being read are fetched in the background; the cache must
            # hold them and the one being read, and one more.
            self.fetch_ahead = max(2, self.mix)
            self.fetch_batches = 4  # ranged: this rank's batches whose rows are fetched ahead
            first_file = shards[0]["files"]["samples"] if shards else None
            sums_size = self._remote.block_sums_size(first_file) if first_file else 0
            per = self._group_disk_bytes()
            extra = self._remote.manifest_bytes + (_disk_blocks(sums_size) if sums_size else 0)
            need = (self.fetch_ahead + 2) * per + extra
            if self._remote.cache.limit < need:
                raise ValueError("cache_limit %d bytes is too small for this epoch's read-ahead: %d shard groups of up to %d bytes "
                                 "(the one read, %d ahead, one more) and the manifests' %d: give cache_limit >= %d" % (
                                     self._remote.cache.limit, self.fetch_ahead + 2, per, self.fetch_ahead,
                                     extra, need))
            sums = self._remote.block_sums(first_file) if first_file else None
            self._node = _node_ranks(rank, world_size)
            # Ranged when the ranks of other nodes read the rest of each
            # shard: whole files when this node reads all of it anyway (one
            # rank, or all of them here) or mixing scatters a rank's samples
            # over whole shards.
            self._ranged = sums is not None and self.mix == 1 and self._node[0] < world_size

    # -- sizes and state -------------------------------------------------

    def batches_left(self) -> int:
        """Global batches left from the resume point (each rank reads one
        of each)."""
        left, per = self.samples - self.start, self.batch_size * self.world_size
        if left <= 0:
            return 0
        return left // per if self.remainder == "drop" else -(-left // per)

    def __len__(self) -> int:
        return self.batches_left()

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
        return (_reader_again, (self._made, self.manifest, self._pin, self.start))

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
            worker_id, num_workers = _worker()
        B, R = self.batch_size, self.world_size
        if first is not None and (first < worker_id or (first - worker_id) % num_workers):
            raise ValueError("first batch %r is not one of worker %d of %d's" % (first, worker_id, num_workers))
        self.check_fits()
        mine = range(worker_id if first is None else first, self.batches_left(), num_workers)
        try:
            for i, g in enumerate(mine):
                lo = self.start + g * B * R + self.rank * B
                if self._ranged:
                    self._rows_ready(lo, lo + B, [self.start + h * B * R + self.rank * B for h in mine[i + 1: i + 1 + self.fetch_batches]])
                if self.prefetch > 0 and hasattr(os, "posix_fadvise"):
                    ahead = mine[i: i + self.prefetch + 1]
                    for h in ahead:
                        a = self.start + h * B * R + self.rank * B
                        self._advise(a, a + B)
                batch = self._gather(lo, self._end(lo))
                if self.mixed:
                    batch["source"] = _sources(batch["samples"], len(self.sources),
                                               lambda: "%s (the batch at %d)" % (self._path(self._segments(lo, lo + 1)[0][0], "samples"), lo))
                self.consumed = self._consumed(g)
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

    def _end(self, lo: int) -> int:
        """Where the batch from position lo ends: a batch on, but with
        remainder="partial" not past the epoch's end."""
        hi = lo + self.batch_size
        return min(hi, self.samples) if self.remainder == "partial" else hi

    def _consumed(self, g: int) -> int:
        """The samples of the epoch consumed once global batch g (of this
        reading) is: a padded epoch's last counts past the end."""
        c = self.start + (g + 1) * self.batch_size * self.world_size
        return min(c, self.samples) if self.remainder == "partial" else c

    def close(self) -> None:
        """Close every file (the reader reopens what it needs)."""
        self._files = {}
        for files in self._shards.values():
            for f in files.values():
                f.close()
        self._shards = {}
        if self._remote is not None:
            self._remote.close()  # (keeps nothing in the cache any more)

    # -- the virtual order --------------------------------------------------

    def _segments(self, lo, hi):
        """(shard position, first, last) runs covering the virtual order's
        positions [lo, hi), positions past the end wrapping to the start
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
                    k = bisect.bisect_right(self._starts, a) - 1
                    b = min(q + (end - p), self._starts[k + 1])
                    out.append((k, a - self._starts[k], b - self._starts[k]))
                    a = b
            else:
                for v in range(q, q + (end - p)):
                    k, i = self._mixed(v)
                    out.append((k, i, i + 1))
            p = end
        return out

    def _mixed(self, v):
        """Shard position and index of virtual position v with mixing."""
        block = bisect.bisect_right(self._starts, v) - 1
        block -= block % self.mix
        first, last = block, min(block + self.mix, len(self.shards))
        b0 = self._starts[first]
        perm = self._perms.get(block)
        if perm is None:
            self._perms = {}  # one block at a time
            rng = np.random.default_rng([self.mix_seed, self.virtual_epoch, block])
            perm = self._perms[block] = rng.permutation(self._starts[last] - b0)
            if self.prefetch > 0 and hasattr(os, "posix_fadvise"):
                for k in range(first, last):
                    for fd, off, row in self._shard_fds(k):
                        self._advise_one(fd, off, off + self.shards[k]["samples"] * row)
        u = b0 + int(perm[v - b0])
        k = bisect.bisect_right(self._starts, u) - 1
        return k, u - self._starts[k]

    # -- reading ---------------------------------------------------------

    def _fetch(self, k: int) -> None:
        """A bucket's shard group k (and the groups after it, in the
        background) into the cache, first saying which this reader keeps
        (every group it has open, and the epoch's BLOCKSUMS): whole files,
        or, ranged, the samples files and the modalities' headers (their
        rows come as they are read: _rows_ready)."""
        r = self._remote
        if r is None:
            return
        ahead = range(k, min(len(self.shards), k + 1 + self.fetch_ahead))
        groups = [[self.shards[j]["files"][n] for n in self.names] for j in ahead]
        keep = [self.shards[j]["files"][n] for j in sorted(set(self._shards) | {k}) for n in self.names]
        r.at(keep + [self.shards[k]["files"]["samples"].rsplit("/", 1)[0] + "/" + _remote.BLOCKSUMS],
             [rel for g in groups[1:] for rel in g])
        if not self._ranged:
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
            self._remote.ensure(rel)
        else:
            self._remote.ensure_head(rel)

    def _rows_ready(self, lo: int, hi: int, ahead: Iterable[int] = ()) -> None:
        """Ranged: the modalities' rows of positions [lo, hi) (this node's
        slice of that global batch, with LOCAL_WORLD_SIZE) fetched into the
        shard files this reader has open, and those of the batches at the
        positions ahead in the background."""
        r, B = self._remote, self.batch_size
        L, mine = self._node
        files_of = {}
        for k, a, b in self._segments(lo - mine * B, lo - mine * B + L * B):
            files = self._shard(k)
            for name in self.modalities:
                f = files[name]
                r.ensure_range(self.shards[k]["files"][name], f.offset + a * f.row, f.offset + b * f.row, os.fstat(f.fd).st_ino)
            files_of[k] = files
        rows = {name: _row_bytes(*self._expect[name]) for name in self.modalities}
        later = []
        for p in ahead:
            for k, a, b in self._segments(p - mine * B, p - mine * B + L * B):
                for name in self.modalities:
                    later.append((self.shards[k]["files"][name], _DATA_AT + a * rows[name], _DATA_AT + b * rows[name]))
        if later:
            r.read_ahead_ranges(later)

    def _pinned(self) -> tuple[int, int]:
        """The epoch folder's (st_dev, st_ino), pinned when this reader
        starts reading: epochs.json must then still describe the epoch as
        it did when it was loaded (its epoch_identity), else the folder is
        being rewritten and nothing is read."""
        if self._pin is None and self._remote is not None:
            try:
                now = epoch_identity(json.loads(self._remote.check_current()), self.epoch)
            except (ValueError, OSError, RecursionError) as e:
                raise ValueError("%s: epochs.json cannot be read again as epoch %d starts: %s" % (self.url, self.epoch, e)) from None
            if now != self.identity:
                raise ValueError("%s: epochs.json no longer describes epoch %d as it did when it was loaded (the bucket's "
                                 "epochs were replaced, push --force?): load the epochs again" % (self.url, self.epoch))
        if self._pin is None:
            if self._remote is not None:
                os.makedirs(self._epoch_dir, exist_ok=True)  # (the cache's: its files come as they are fetched)
            try:
                st = os.stat(self._epoch_dir)
            except OSError as e:
                raise ValueError("%s: cannot open the epoch's folder: %s" % (self._epoch_dir, e.strerror)) from None
            if not stat.S_ISDIR(st.st_mode):
                raise ValueError("%s: not a folder" % self._epoch_dir)
            try:
                now = epoch_identity(load_epochs(self.dir), self.epoch)
            except ValueError as e:
                raise ValueError("%s: epochs.json cannot be read again as epoch %d starts (a shuffle rewriting the folder?): %s"
                                 % (self.dir, self.epoch, e)) from None
            if now != self.identity:
                raise ValueError("%s: epochs.json no longer describes epoch %d as it did when it was loaded: the folder "
                                 "was rewritten (shuffle --force with other options?); refusing to read a version of "
                                 "the epoch other than the one begun: load the epochs again" % (self.dir, self.epoch))
            self._pin = (st.st_dev, st.st_ino)
        return self._pin

    def hold(self, segs) -> None:
        """Keep open every shard of these segments (a batch's, which may
        span many shards) while they are opened and read."""
        self._hold = min((k for k, _, _ in segs), default=None)

    def _shard(self, k):
        """Shard position k's files, opened inside the epoch folder pinned
        (a folder replaced since is refused, naming the shard) and checked
        against the manifest, the samples' every column too (the files of
        shards well behind, and behind the batch held, are closed)."""
        files = self._shards.get(k)
        if files is None:
            floor = k - self.mix if self._hold is None else min(k - self.mix, self._hold)
            for old in [x for x in self._shards if x < floor]:
                self._files.pop(old, None)
                for f in self._shards.pop(old).values():
                    f.close()
            self._fetch(k)
            pin = self._pinned()
            files = {}
            try:
                dfd = os.open(self._epoch_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
            except OSError as e:
                raise ValueError("%s: the epoch's folder is gone since epoch %d began (%s): refusing to read another version "
                                 "of it" % (self._path(k, "samples"), self.epoch, e.strerror)) from None
            try:
                st = os.fstat(dfd)
                if (st.st_dev, st.st_ino) != pin:
                    raise ValueError("%s: the epoch's folder was replaced since epoch %d began (shuffle --force?): refusing "
                                     "to mix two versions of the epoch" % (self._path(k, "samples"), self.epoch))
                for name in self.names:
                    path = self._path(k, name)
                    for attempt in range(4):
                        try:
                            f = files[name] = Npy(path, dir_fd=dfd)
                            break
                        except ValueError as e:
                            gone = not os.path.lexists(path) or "No such file" in str(e)
                            if gone and self._remote is not None and attempt < 3:
                                # A bucket's cache entry evicted by another
                                # local reader meanwhile: fetched again (the
                                # same version, checked).
                                rel = self.shards[k]["files"][name]
                                self._fetch_head(rel) if self._ranged else self._remote.ensure(rel)
                                continue
                            if gone:
                                raise ValueError("%s: gone since epoch %d began (the folder is being rewritten?): refusing "
                                                 "to read another version of the epoch" % (path, self.epoch)) from None
                            raise
                    dtype, shape = self._expect[name]
                    f.expect(dtype, [self.shards[k]["samples"]] + shape)
                self._check_rows(files["samples"])
            except BaseException:
                for f in files.values():
                    f.close()
                raise
            finally:
                os.close(dfd)
            self._shards[k] = files
        return files

    def _open(self, k):
        files = self._files.get(k)
        if files is None:
            for old in [x for x in self._files if x != k and (self.mix == 1 or x // self.mix != k // self.mix)]:
                del self._files[old]
            checked = self._shard(k)
            files = {}
            for name in self.names:
                f = checked[name]
                files[name] = _ReadArray(f) if self.read else f.memmap()
                m = getattr(files[name], "_mmap", None)
                if m is not None and self.prefetch > 0 and hasattr(m, "madvise"):
                    # The read-ahead asks for exactly this rank's bytes; the
                    # kernel's own read-around on a page fault would also
                    # read the other ranks' batches in between (1.15x the
                    # time of per-rank files at R=2 and 8; 0.99-1.01x so).
                    m.madvise(mmap.MADV_RANDOM)
            self._files[k] = files
        return files

    def _path(self, k, name):
        rel = self.shards[k]["files"][name]
        path = confined(self.dir, rel, "shard file")
        if os.path.dirname(path) != self._epoch_dir:
            raise ValueError("%s: shard file %r is not in the epoch's folder %r" % (self.dir, rel, os.path.basename(self._epoch_dir)))
        return path

    def _gather(self, lo, hi):
        segs = self._segments(lo, hi)
        if self.mix > 1:
            # Each shard's samples taken at once, in index order, then put
            # in the batch's order.
            by_shard = {}
            for j, (k, i, _) in enumerate(segs):
                by_shard.setdefault(k, []).append((i, j))
            parts = {name: [None] * len(segs) for name in self.names}
            out = {}
            for k, items in by_shard.items():
                items.sort()
                idx = np.array([i for i, _ in items])
                files = self._open(k)
                for name in self.names:
                    got = files[name][idx]
                    for (_, j), row in zip(items, got):
                        parts[name][j] = row
            for name in self.names:
                out[name] = np.stack(parts[name])
            return out
        pieces = [{name: self._open(k)[name][a:b] for name in self.names} for k, a, b in segs]
        if len(pieces) == 1:
            # Views of the memory-mapped shard (no copy; the consumer's copy,
            # e.g. into pinned memory, is the one sequential read), or
            # arrays of their own with read=True.
            return pieces[0]
        return {name: np.concatenate([p[name] for p in pieces]) for name in self.names}

    # -- read-ahead ------------------------------------------------------

    def _shard_fds(self, k):
        return [(f.fd, f.offset, f.row) for f in self._shard(k).values()]

    def _advise(self, lo, hi, probe=False):
        """Ask the kernel for the bytes of virtual positions [lo, hi), once
        (probe: not for bytes the page cache holds; for readers that read
        with preadv, the Loader's, never for memory-mapped batches: see
        _advise_one)."""
        if self.mix > 1:
            return  # a block is asked for whole when it is first entered
        done = getattr(self, "_asked", None)
        if done is None:
            done = self._asked = set()
        if lo in done:
            return
        done.add(lo)
        for k, a, b in self._segments(lo, hi):
            for fd, off, row in self._shard_fds(k):
                self._advise_one(fd, off + a * row, off + b * row, probe)

    def _advise_one(self, fd, a, b, probe=False):
        """Ask the kernel for bytes [a, b) of fd; with probe, unless the
        page cache holds them (asking for cached pages walks them all: a
        fifth of a warm epoch's time). The probe (_files.cached: 1-byte
        RWF_NOWAIT reads) runs while probes find the bytes there; after a
        miss the next PROBE_BACKOFF ranges are asked for unprobed (a probe of a
        page the cache lacks starts a read of it, out of order). Never
        for memory-mapped batches: their maps are MADV_RANDOM, and a
        range whose ends are cached but not its middle would be faulted
        in a page at a time (a cold epoch read per rank took 1.5x as
        long, at times 4x, probing: docs/BENCHMARKS.md, "The trainer's
        read"); a preadv of such a range reads what is missing at once."""
        if probe:
            skip = getattr(self, "_probe_skip", 0)
            if skip:
                self._probe_skip = skip - 1
            elif cached(fd, a, b - a):
                return
            else:
                self._probe_skip = PROBE_BACKOFF
        _advise_range(fd, a, b)

    def _group_disk_bytes(self):
        """What a full shard group's files take on disk in a cache: each its
        header (data at 4096) and data, in whole 4 KiB blocks, and its
        marks (a block)."""
        n = max((s["samples"] for s in self.shards), default=1)
        return sum(_remote.blocks(_DATA_AT + n * _row_bytes(dtype, shape)) + 4096 for dtype, shape in self._expect.values())

    def _shard_bytes(self):
        """Bytes of a full shard's files (from the manifest)."""
        if not self.shards:
            return 1
        n = max(s["samples"] for s in self.shards)
        return sum(n * _row_bytes(dtype, shape) for dtype, shape in self._expect.values())


PIECE = 256 << 10  # bytes asked of the kernel per posix_fadvise call
PROBE_BACKOFF = 64  # ranges asked for without a probe after a probe found one not cached
_DATA_AT = 4096  # where a shard file's data starts (docs/FORMAT.md; each file's header is checked when it is opened)


def _reader_again(made: dict[str, Any], manifest: dict[str, Any], pin: Optional[tuple[int, int]], start: int) -> EpochReader:
    r = EpochReader(**made, _manifest=manifest, _pin=pin)
    r.start = r.consumed = start
    return r


def _node_ranks(rank: int, world_size: int) -> tuple[int, int]:
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


def _check_rank_args(rank: Optional[int], world_size: int, batch_size: int, remainder: str) -> int:
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


def _advise_range(fd, a, b):
    for p in range(a, b, PIECE):
        os.posix_fadvise(fd, p, min(PIECE, b - p), os.POSIX_FADV_WILLNEED)


class _ReadArray:
    """A checked shard file whose [i:j] slices are read with os.preadv
    into a new array (one call, unless the kernel returns less)."""

    def __init__(self, f):
        self.f = f

    def __getitem__(self, sl):
        f = self.f
        out = np.empty((sl.stop - sl.start,) + tuple(f.shape[1:]), dtype=f.dtype)
        view = memoryview(out).cast("B")
        off, got = f.offset + sl.start * f.row, 0
        while got < len(view):
            n = os.preadv(f.fd, [view[got:]], off + got)
            if not n:
                raise ValueError("%s: shorter than its header says (changed since it was checked?)" % f.path)
            got += n
        return out


def _sources(samples: Any, n: int, where: Any) -> Any:
    """The samples' source column (a view, of a numpy array or a torch
    tensor), refused if a number names none of the n sources: a samples
    file the shuffle did not write. where() words the file or epoch."""
    src = samples[:, 3]
    if len(src):
        lo, hi = int(src.min()), int(src.max())
        if lo < 0 or hi >= n:
            raise ValueError("%s: a sample names source %d; epochs.json lists %d sources" % (where(), lo if lo < 0 else hi, n))
    return src


STATE_VERSION = 2  # 2: with epoch_id


def check_state(state: Any, fmt: str, types: Mapping[str, Any]) -> None:
    """Refuse a state that is not of format fmt, of a known version (1 or
    2; 2 with an epoch_id string), with each key of types of that exact
    type (an int is not a bool, nor a float such as 3.0)."""
    if not isinstance(state, Mapping) or state.get("format") != fmt:
        raise ValueError("not a clipshard %s state: %r" % (fmt.split(".")[-1], state))
    v = state.get("version")
    if type(v) is not int or v not in (1, STATE_VERSION):
        raise ValueError("state version %r: this reader knows versions 1 and %d" % (v, STATE_VERSION))
    want = dict(types)
    if v >= 2:
        want["epoch_id"] = str
    for k, t in want.items():
        x = state.get(k)
        ok = type(x) is t or (t is int and isinstance(x, np.integer))
        if not ok:
            raise ValueError("state %s %r: want %s" % (k, x, "an int" if t is int else "a bool" if t is bool else "a string"))


def _row_checks(edir, man):
    """A check of a shard's samples file (an open Npy) against epochs.json,
    vectorised: every clip below its source's clip count (where epochs.json
    records it), start >= 0, valid frames in 1..window (exactly the window
    unless short is "pad"), source one of the sources. The error names the
    file, the sample and the column."""
    window, pad = man.get("window"), man.get("short") == "pad"
    if type(window) is not int or window < 1:
        raise ValueError("%s: epochs.json: window %r" % (edir, window))
    if man.get("version") == 3:
        clips = [s.get("clips") for s in man["sources"]]
    else:
        ds = man.get("dataset")
        clips = [ds.get("clips", 0) if isinstance(ds, dict) else 0]
    if any(type(c) is not int or c < 0 for c in clips):
        raise ValueError("%s: epochs.json: clip counts %r" % (edir, clips))
    limit = np.array([c if c > 0 else 1 << 62 for c in clips], dtype=np.int64)

    def check(f: Npy) -> None:
        a = f.read()
        if not len(a):
            return
        src = a[:, 3] if a.shape[1] == 4 else np.zeros(len(a), dtype=np.int64)
        bad_src = (src < 0) | (src >= len(limit))
        clip, start, valid = a[:, 0], a[:, 1], a[:, 2]
        checks = (
            (bad_src, lambda i: "source %d; epochs.json lists %d sources" % (src[i], len(clips))),
            (~bad_src & ((clip < 0) | (clip >= limit[np.where(bad_src, 0, src)])),
             lambda i: "clip %d; its source has %s clips" % (clip[i], clips[src[i]] or "an unrecorded number of")),
            (start < 0, lambda i: "start %d" % start[i]),
            ((valid < 1) | (valid > window) | ((valid != window) & (not pad)),
             lambda i: "valid %d frames; the window is %d (short %r)" % (valid[i], window, man.get("short"))))
        for bad, words in checks:
            if bad.any():
                i = int(np.argmax(bad))
                raise ValueError("%s: sample %d: %s" % (f.path, i, words(i)))
    return check


def _row_bytes(dtype, shape):
    return math.prod(int(x) for x in shape) * np.dtype(dtype).itemsize


def _expected(edir, man):
    """name -> (dtype, shape of one sample) of every shard file, from
    epochs.json's modalities (and "samples": int64 [3], or [4] in a mixed
    folder: clip, start, valid, source)."""
    mods = man.get("modalities")
    if not isinstance(mods, list) or not mods:
        raise ValueError("%s: epochs.json: no modalities" % edir)
    out = {}
    for m in mods:
        try:
            name, dtype, frame = m["name"], m["dtype"], [int(x) for x in m["frame_shape"]]
            np.dtype(dtype)
            shape = frame if m.get("per_clip") else [int(m["window_rows"])] + frame
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError("%s: epochs.json: modality %r: %s" % (edir, m, e)) from None
        if not isinstance(name, str) or name in out or name == "samples" or any(x < 0 for x in shape):
            raise ValueError("%s: epochs.json: modality %r" % (edir, m))
        if _row_bytes(dtype, shape) > MAX_SAMPLE:
            raise ValueError("%s: epochs.json: modality %r: a sample of %d bytes (%s %s): more than any reader holds" % (
                edir, name, _row_bytes(dtype, shape), dtype, shape))
        out[name] = (dtype, shape)
    out["samples"] = ("<i8", [4 if man.get("version") == 3 else 3])
    return out


def _check_shards(edir, man, entry, names):
    """The epoch's shards in order, checked: whole numbers of samples (at
    most shard_samples each), each shard starting where the last one ends,
    adding up to the epoch's samples, with a file for every name."""
    shards, per = entry.get("shards"), man.get("shard_samples")
    where = "%s: epochs.json: epoch %r" % (edir, entry.get("epoch"))
    if not isinstance(shards, list) or not isinstance(per, int) or per < 1:
        raise ValueError("%s: no shard list (or no shard_samples)" % where)
    try:
        shards = sorted(shards, key=lambda s: s["shard"])
    except (KeyError, TypeError):
        raise ValueError("%s: a shard without a number" % where) from None
    first = 0
    for s in shards:
        n, f, files = s.get("samples"), s.get("first"), s.get("files")
        if not isinstance(n, int) or not 0 <= n <= per:
            raise ValueError("%s: shard %r holds %r samples: want 0..%d (shard_samples)" % (where, s["shard"], n, per))
        if f != first:
            raise ValueError("%s: shard %r starts at sample %r, want %d (where the shard before it ends)" % (where, s["shard"], f, first))
        if not isinstance(files, dict) or any(not isinstance(files.get(x), str) for x in names):
            raise ValueError("%s: shard %r does not list a file for each of %s" % (where, s["shard"], names))
        first += n
    if entry.get("samples") != first:
        raise ValueError("%s: the shards hold %d samples, the epoch says %r" % (where, first, entry.get("samples")))
    return shards


def _size(s):
    """Bytes of "2GiB", "512MiB", "1G" or a number (>= 0; anything else: a
    ValueError saying so)."""
    bad = ValueError("%r: want a size in bytes such as 536870912, '512MiB' or '2GiB'" % (s,))
    if isinstance(s, (bool, np.bool_)):
        raise bad
    if isinstance(s, (int, np.integer)):
        v = int(s)
    else:
        units = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("TB", 10**12), ("GB", 10**9),
                 ("MB", 10**6), ("KB", 10**3), ("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10), ("B", 1))
        text, mult = str(s).strip(), 1
        for suffix, m in units:
            if text.endswith(suffix):
                text, mult = text[: -len(suffix)], m
                break
        try:
            v = int(float(text) * mult)
        except (ValueError, OverflowError):  # ("abc", "nan", "inf")
            raise bad from None
    if v < 0:
        raise bad
    return v
    units = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("TB", 10**12), ("GB", 10**9),
             ("MB", 10**6), ("KB", 10**3), ("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10), ("B", 1))
    for suffix, mult in units:
        if str(s).endswith(suffix):
            return int(float(str(s)[: -len(suffix)]) * mult)
    return int(s)
