"""A read-ahead loader over the epochs `shuffle` wrote: a background thread
reads this rank's next batches straight into preallocated buffers, so the
training step finds its batch ready.

The batches, the order and the resume rule are those of EpochReader (any
world size, any batch size, the state a count of samples), across any
number of epochs, materialised or replayed, in one object.
"""
from __future__ import annotations

import math
import mmap
import queue
import sys
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generator, Iterable, Iterator, Mapping, Optional, Union

import numpy as np

from ._files import memory_limit, pread_into
from .draw import STATE_FORMAT as DRAWN_STATE, Drawn, DrawnReader, _rows
from .epochs import (_sources, STATE_FORMAT as READER_STATE, STATE_VERSION, EpochReader, check_datasets, check_state, epoch_identity,
                     load_epochs, open_epochs)

__all__ = ["Loader"]

STATE_FORMAT = "clipshard.loader"

_END = object()  # the end of an epoch in the queue


class _Batch:
    """What the thread hands over: one batch of one epoch."""

    __slots__ = ("pos", "g", "arrays", "consumed", "last")

    def __init__(self, pos: int, g: int, arrays: Any, consumed: Any, last: bool) -> None:
        self.pos, self.g, self.arrays, self.consumed, self.last = pos, g, arrays, consumed, last


class _Failed:
    """An error of the thread, raised again in the consumer."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Loader:
    """This rank's batches of a list of epochs, read ahead by a thread.

    A background thread reads the next `prefetch` batches of this rank
    with os.preadv straight into preallocated buffers (one copy, from the
    page cache or the disk, with the GIL released); no worker processes,
    no memory map, no copy by the consumer. A batch handed out is never
    written again: its buffer is reused only once nothing refers to it.

        loader = Loader("/data/epochs", epochs=range(10), rank=r, world_size=8, batch_size=256)
        for epoch in loader.epochs:
            loader.set_epoch(epoch)              # optional: iteration goes on to the next epoch by itself
            for batch in loader:                 # {"whisper": float16 [256, 30, 64], ..., "samples": int64 [256, 3]}
                step(batch)
                save(loader.state_dict())        # resumes here, with any world size or batch size

    epochs: the training epochs to read, in order (an int, or an iterable
        of ints; default: every materialised epoch). An epoch materialised
        in the folder is read as it is; another is a replay (give
        replay_seed) of materialised epoch number epochs_on_disk[e % n], in
        a shard order seeded by replay_seed and e (EpochReader's
        replay_seed and virtual_epoch), optionally mixed (mix_shards,
        mix_seed, mix_mem).
    rank, world_size, batch_size, remainder: as EpochReader ("drop", "pad",
        or for one rank "partial"); a world_size without a rank is
        refused.
    prefetch: batches read ahead (0: read in the consumer, no thread).
    threads: threads that share each batch's reads and casts (2: one core
        copies from the page cache at ~4.5 GB/s here, two at ~7.5 GB/s,
        what `cat` gets into a small buffer).
        Host memory held is at most (prefetch + 2) batches, plus when
        casting 1 MiB a thread (a drawn epoch's: one batch of the
        shards' dtype): loader.host_bytes gives the figure. For B=256,
        W=15, whisper 30x512 + w2v 15x1024 + motion 15x56 + emotion 15x8,
        all float16, a batch is 15.5 MiB and prefetch=4 holds 93 MiB;
        delivered as float32, 186 MiB.
    dtype: cast floating-point modalities to it in the thread (numpy's
        cast releases the GIL); None keeps the shards' dtype.

    dataset (instead of edir): epochs drawn at read time from a dataset
        folder or s3:// URL, or {name: folder or URL} to mix several (no
        epoch files; clipshard.draw): every epoch fresh windows, blocks of
        consecutive frames read whole, windows shuffled across a buffer of
        blocks. It takes window (required), seed, sampling, per_clip,
        short, weights, epoch_samples, block, buffer, hold, read (see
        clipshard.draw.Drawn); epochs is then required. The state is the
        intervals of the epoch's order still to read (any world size or
        batch size resumes them exactly once).

    Errors of the thread (a file that is not what epochs.json says, a
    shard shorter than its header) are raised by the consumer's next(),
    naming the file. Breaking out of the loop, close() or leaving a `with`
    block stops the thread and closes every file; so does letting go of
    the loader (the thread holds it only while it reads a batch), e.g.
    after an epoch, when the thread has read on into the next one.
    """

    def __init__(self, edir: Optional[str] = None, epochs: Union[int, Iterable[int], None] = None, *, rank: Optional[int] = None,
                 world_size: int = 1, batch_size: int = 256, remainder: str = "drop", prefetch: int = 4,
                 threads: int = 2, dtype: Any = None, replay_seed: Optional[int] = None, mix_shards: int = 1, mix_seed: int = 0,
                 mix_mem: Union[str, int, None] = None, cache_dir: Optional[str] = None,
                 cache_limit: Union[str, int, None] = None, dataset: Any = None, **draw: Any) -> None:
        self._drawn: Optional[Drawn] = None
        if dataset is not None:
            if edir is not None:
                raise ValueError("edir %r and dataset %r: give one (an epochs folder, or a dataset to draw epochs from)" % (edir, dataset))
            if replay_seed is not None or mix_shards != 1 or mix_mem is not None:
                raise ValueError("replay_seed, mix_shards and mix_mem replay materialised epochs; epochs drawn from a dataset "
                                 "are fresh every epoch")
            if epochs is None:
                raise ValueError("epochs: give the epochs to draw from %s (e.g. epochs=range(10))" % (dataset,))
            if "window" not in draw:
                raise ValueError("window: give the frames of each window to draw from %s" % (dataset,))
            self._draw_args: dict[str, Any] = dict(dataset=dataset, cache_dir=cache_dir, cache_limit=cache_limit, **draw)
            self._drawn = Drawn(**self._draw_args)
            self._remote, man = None, {"seed": self._drawn.seed}
            on_disk: list[int] = []
            edir = str(dataset)
        else:
            if edir is None:
                raise ValueError("give an epochs folder (edir), or dataset= to draw epochs from a dataset")
            if draw:
                raise ValueError("%s: unexpected arguments %s (window, seed, sampling, ... are for dataset=)" % (edir, sorted(draw)))
            local, self._remote = open_epochs(edir, cache_dir, cache_limit)  # a bucket's: its entry in the node-local cache
            man = load_epochs(local)
            check_datasets(man, edir)
            entries = man.get("epochs")
            if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
                raise ValueError("%s: epochs.json: 'epochs' is not a list of epochs" % edir)
            on_disk = sorted(e.get("epoch") for e in entries if isinstance(e.get("epoch"), int))
        if epochs is None:
            epochs = on_disk
        elif isinstance(epochs, (int, np.integer)):
            epochs = [int(epochs)]
        try:
            self.epochs: list[int] = [int(e) for e in epochs]
        except (TypeError, ValueError):
            raise ValueError("epochs %r: want an int or an iterable of ints" % (epochs,)) from None
        if any(e < 0 for e in self.epochs) or len(set(self.epochs)) != len(self.epochs):
            raise ValueError("epochs %r: want distinct ints >= 0" % (self.epochs,))
        if not isinstance(prefetch, (int, np.integer)) or prefetch < 0:
            raise ValueError("prefetch %r: want an int >= 0" % (prefetch,))
        if not isinstance(threads, (int, np.integer)) or threads < 1:
            raise ValueError("threads %r: want an int >= 1" % (threads,))
        self.threads = int(threads)
        self._threads: Optional[ThreadPoolExecutor] = None  # the read threads while reading
        self.dir, self.manifest, self.prefetch = edir, man, int(prefetch)
        self._kw: dict[str, Any] = dict(rank=rank, world_size=world_size, batch_size=batch_size,
                                        remainder=remainder, mix_seed=mix_seed, prefetch=1,
                                        cache_dir=cache_dir, cache_limit=cache_limit)
        mixing: dict[str, Any] = {"mix_shards": mix_shards} if mix_mem is None else {"mix_mem": mix_mem}
        # Which epoch on disk each training epoch reads, and how.
        self._plans: list[dict[str, Any]] = []
        for e in self.epochs:
            if self._drawn is not None:
                self._plans.append(dict(epoch=e))
            elif e in on_disk:
                self._plans.append(dict(epoch=e))  # (already shuffled whole: no replay order, no mixing)
            elif replay_seed is None:
                raise ValueError("%s: epoch %d is not materialised (have %s): give replay_seed to replay one" % (
                    edir, e, on_disk))
            elif not on_disk:
                raise ValueError("%s: no materialised epoch to replay" % edir)
            else:
                self._plans.append(dict(epoch=on_disk[e % len(on_disk)], replay_seed=replay_seed, virtual_epoch=e,
                                        **mixing))
        # Every epoch's reader is made (and so checked) now: a bad shard
        # list or argument is an error here, not epochs later. (A drawn
        # epoch's order is computed when it is first needed.)
        self._lens: list[Optional[tuple[int, int]]] = []
        for plan in self._plans:
            if self._drawn is not None:
                self._lens.append(None)
                continue
            r = self._reader(plan)
            self._lens.append((r.samples, r.batches_left()))
            r.close()
        if not on_disk and self._drawn is None:
            raise ValueError("%s: no materialised epoch" % edir)
        if self._drawn is not None:
            first: Any = DrawnReader.__new__(DrawnReader)  # (the arguments checked; no order computed)
            DrawnReader._check_args(first, rank, world_size, batch_size, remainder)
            first.names, first.sources, first.mixed = self._drawn.modalities + ["samples"], self._drawn.names, self._drawn.mixed
            expect = {n: (d, s) for n, (d, s) in self._drawn.shapes().items()}
        else:
            first = self._reader(self._plans[0] if self._plans else dict(epoch=on_disk[0]))
            expect = first._expect
        self.rank, self.world_size, self.batch_size, self.remainder = first.rank, first.world_size, first.batch_size, first.remainder
        self.names: list[str] = first.names
        self.sources: list[str] = first.sources  # what a batch's "source" numbers name (mixed epochs)
        self.mixed: bool = first.mixed
        self._src: dict[str, tuple[np.dtype, tuple[int, ...]]] = {
            n: (np.dtype(d), (self.batch_size,) + tuple(s)) for n, (d, s) in expect.items()}
        if self._drawn is None:
            first.close()
        self._out = {n: (self._cast_to(d, dtype, n), s) for n, (d, s) in self._src.items()}
        self.shapes: dict[str, tuple[int, ...]] = {n: s for n, (_, s) in self._src.items()}  # of a batch's arrays
        self.floating: list[str] = [n for n, (d, _) in self._src.items() if d.kind == "f"]  # the modalities dtype casts
        # Each modality's arrays have buffers of their own: a batch's
        # "samples" kept by the user (say) holds on to its own few bytes,
        # not to the whole batch.
        self._sizes = {n: math.prod(s) * d.itemsize for n, (d, s) in self._out.items()}
        self.batch_bytes = sum(self._sizes.values())  # bytes of one batch as handed out
        self._casting = [n for n in self.names if self._out[n][0] != self._src[n][0]]
        # (a drawn epoch's batch is cut whole into a scratch batch of the
        # shards' dtype, then cast; a materialised epoch's is cast a
        # SCRATCH at a time by each read thread)
        raw = (sum(math.prod(self._src[n][1]) * self._src[n][0].itemsize for n in self._casting)
               if self._drawn is not None else SCRATCH * self.threads * bool(self._casting))
        self.host_bytes = (self.prefetch + 2) * self.batch_bytes + raw  # at most, held by the loader
        room = memory_limit() or 1 << 47
        if self.host_bytes > room:
            raise ValueError("batch_size %d: batches of %d samples of %s take %d bytes each, and the loader holds up to %d "
                             "(prefetch %d + 2 batches): more than this machine's memory (%d bytes): lower batch_size or "
                             "prefetch, or cut shorter windows" % (self.batch_size, self.batch_size, dict(self.shapes),
                                                                    self.batch_bytes, self.host_bytes, self.prefetch, room))
        self._pool: dict[str, list[Any]] = {n: [] for n in self.names}  # per modality; free when nothing else refers to it
        self._pool_refs: dict[str, list[int]] = {n: [] for n in self.names}
        self._raw: dict[str, Any] = {}  # the thread's scratch of the shards' dtype, when casting
        for n in self.names if self.prefetch else ():  # (allocated now: not by the first epoch)
            for _ in range(self.prefetch + 2):
                self._pool[n].append(self._alloc(self._sizes[n]))
                self._pool_refs[n].append(sys.getrefcount(self._pool[n][-1]))
        # current epoch, its resume point (a drawn epoch's: 0 or (the
        # intervals left, done)), last batch handed out
        self._pos, self._start, self._handed = 0, 0, None  # type: tuple[int, Any, Optional[_Batch]]
        self._run: Optional[_Run] = None

    # -- what the subclass (clipshard.torch.Loader) changes ---------------

    def _cast_to(self, src: np.dtype, dtype: Any, name: str) -> Any:
        if dtype is None or src.kind != "f":
            return src
        return np.dtype(dtype)

    def _alloc(self, nbytes: int) -> Any:
        return buffer(nbytes)

    def _finish(self, arrays: dict[str, np.ndarray]) -> Any:
        """What the thread makes of a batch it read (e.g. a copy to the
        device)."""
        return arrays

    def _wrap(self, arrays: Any) -> Any:
        """The batch as handed to the user, in the consumer."""
        return arrays

    def _cast(self, name: str, dst: np.ndarray, src: np.ndarray) -> None:
        np.copyto(dst, src, casting="unsafe")

    # -- epochs and state -------------------------------------------------

    def _reader(self, plan: Mapping[str, Any]) -> Any:
        if self._drawn is not None:
            if self._drawn.closed:  # (closed by close(): opened and checked again)
                again = Drawn(**self._draw_args)
                if again.identity != self._drawn.identity:
                    again.close()
                    raise ValueError("%s: the datasets changed since this loader was made (converted again?): make the "
                                     "loader again" % self.dir)
                self._drawn = again
            kw = self._kw
            return DrawnReader(self._drawn, plan["epoch"], rank=kw["rank"], world_size=kw["world_size"],
                               batch_size=kw["batch_size"], remainder=kw["remainder"])
        # (a bucket's readers share the loader's connection and cache entry)
        return EpochReader(self.dir, **plan, **self._kw, _manifest=self.manifest, _remote=self._remote)

    def _len(self, pos: int) -> tuple[int, int]:
        """(samples, batches) of epoch pos, read from its start."""
        got = self._lens[pos]
        if got is None:
            r = self._reader(self._plans[pos])
            got = self._lens[pos] = (r.samples, r.batches_left())
            r.close()
        return got

    @property
    def drawn(self) -> Optional[Drawn]:
        """With dataset=: the Drawn the epochs are drawn by (its sources,
        options, and .read, the read mode "auto" chose); else None."""
        return self._drawn

    @property
    def epoch(self) -> Optional[int]:
        """The epoch the next iteration reads (None after the last one)."""
        return self.epochs[self._pos] if self._pos < len(self.epochs) else None

    def set_epoch(self, epoch: int) -> None:
        """Read epoch next (DataLoader style). The current epoch, or the one
        a loaded state resumes, keeps its resume point; another starts at
        its beginning."""
        if epoch not in self.epochs:
            raise ValueError("epoch %r is not one of this loader's epochs %s" % (epoch, self.epochs))
        pos = self.epochs.index(epoch)
        if pos != self._pos:
            self._stop()
            self._pos, self._start, self._handed = pos, 0, None

    def __len__(self) -> int:
        """Batches of this rank the next iteration yields (the current
        epoch, from its resume point)."""
        if self._pos >= len(self.epochs):
            return 0
        if self._drawn is not None:
            if self._start == 0:
                return self._len(self._pos)[1]
            r = self._reader(self._plans[self._pos])
            r._resume(*self._start)
            return r.batches_left()
        samples, full = self._len(self._pos)
        left, per = samples - self._start, self.batch_size * self.world_size
        if left <= 0:
            return 0
        return left // per if self.remainder == "drop" else -(-left // per)

    def state_dict(self) -> dict[str, Any]:
        """Where the batches handed out so far end: the epoch and the
        samples of it that all ranks together have consumed (the same on
        every rank), and whether it is done. A dict of ints, strings and
        bools (torch.save, JSON). Save it after the step that trained on
        the last batch. (Drawn epochs: the intervals of the epoch's order
        still to read, see clipshard.draw.DrawnReader.state_dict.)"""
        if self._drawn is not None:
            return self._drawn_state()
        if self._pos >= len(self.epochs):
            pos, consumed, done = len(self.epochs) - 1, self._len(len(self.epochs) - 1)[0] if self.epochs else 0, True
        elif self._handed is not None:
            pos, consumed, done = self._pos, self._handed.consumed, self._handed.last
        else:
            pos, consumed, done = self._pos, self._start, len(self) == 0 and self._start > 0
        plan = self._plans[pos] if self._plans else {}
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "epoch": self.epochs[pos] if self.epochs else None,
                "source_epoch": plan.get("epoch"), "replay_seed": plan.get("replay_seed"),
                "seed": self.manifest.get("seed"), "samples": self._len(pos)[0] if self._lens else 0,
                "consumed": int(consumed), "done": bool(done),
                "epoch_id": epoch_identity(self.manifest, plan["epoch"]) if plan else ""}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go on where state says, with this loader's world size and batch
        size (which may differ from those that saved it). Also takes an
        EpochReader's or EpochDataset's state (its virtual epoch)."""
        fmt = state.get("format") if isinstance(state, Mapping) else None
        if self._drawn is not None or fmt == DRAWN_STATE:
            self._load_drawn(state)
            return
        if fmt == READER_STATE:
            check_state(state, READER_STATE, {"epoch": int, "virtual_epoch": int, "seed": int, "samples": int, "consumed": int})
            state = dict(state, epoch=state.get("virtual_epoch"), done=False, source_epoch=state.get("epoch"))
        else:
            check_state(state, STATE_FORMAT, {"epoch": int, "source_epoch": int, "seed": int, "samples": int, "consumed": int,
                                              "done": bool})
            rs = state.get("replay_seed")
            if rs is not None and type(rs) is not int:
                raise ValueError("state replay_seed %r: want an int or None" % (rs,))
        e, c = state.get("epoch"), int(state["consumed"])  # (an int: checked above)
        if e not in self.epochs:
            raise ValueError("state is of epoch %r, not one of this loader's epochs %s" % (e, self.epochs))
        pos = self.epochs.index(e)
        for k, mine in (("seed", self.manifest.get("seed")), ("samples", self._len(pos)[0])):
            if state.get(k) != mine:
                raise ValueError("state of epoch %r has %s %r, this loader's is %r (another epochs folder?)" % (
                    e, k, state.get(k), mine))
        if state.get("source_epoch") != self._plans[pos]["epoch"]:
            raise ValueError("state of epoch %r read epoch %r on disk, this loader reads %r" % (
                e, state.get("source_epoch"), self._plans[pos]["epoch"]))
        if fmt == STATE_FORMAT and state.get("replay_seed") != self._plans[pos].get("replay_seed"):
            raise ValueError("state of epoch %r replayed with seed %r, this loader's is %r" % (
                e, state.get("replay_seed"), self._plans[pos].get("replay_seed")))
        if state["version"] >= 2 and state.get("epoch_id") != epoch_identity(self.manifest, self._plans[pos]["epoch"]):
            raise ValueError("state of epoch %r is of another version of it (epoch_id %r, this folder's %r: other "
                             "weights, sources or options)" % (e, state.get("epoch_id"), epoch_identity(self.manifest, self._plans[pos]["epoch"])))
        if c < 0:
            raise ValueError("state consumed %r: want an int >= 0" % (c,))
        self._stop()
        samples = self._len(pos)[0]
        # A padded epoch's last batch counts past the end; a done epoch
        # has nothing left, whatever the new world size and batch size.
        self._pos, self._start, self._handed = pos, samples if state.get("done") else min(c, samples), None

    # -- iteration --------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        """This rank's batches of the current epoch, from its resume point
        (after a break: after the last batch handed out); at its end the
        loader moves on to the next epoch of the list."""
        if self._pos >= len(self.epochs):
            return
        pos, start = self._pos, self._start
        if start == 0:
            r = self._reader(self._plans[pos])
            try:
                r.check_fits()  # (an epoch too small for one global batch: refused, not silently empty)
            finally:
                r.close()
        if len(self) == 0:
            self._next_epoch()
            return
        if self.prefetch == 0:
            self._open_threads()
            source: Generator[Any, None, None] = _produce(weakref.ref(self), pos, start, None)
        else:
            run = self._run
            if run is None or not run.alive_at(pos, start):
                self._stop()
                run = self._run = _Run(self, pos, start)
            source = run.take(pos)
        finished = False
        try:
            for item in source:
                if item is _END:
                    break
                if isinstance(item, _Failed):
                    raise item.error
                self._handed = item
                arrays = item.arrays
                if self.mixed and "source" not in arrays:
                    arrays["source"] = _sources(arrays["samples"], len(self.sources),
                                                lambda: "%s: epoch %r" % (self.dir, self.epochs[item.pos]))
                yield self._wrap(arrays)
                if item.last:
                    finished = True
        finally:
            if self.prefetch == 0:
                source.close()  # (its reader's files close)
                self._close_threads()
            if not finished:
                self._stop()  # a break, an error: the thread ends, the files close
                if self._handed is not None:  # the next iteration goes on after the last batch handed out
                    c = self._handed.consumed
                    self._start, self._handed = c if self._drawn is not None else min(c, self._len(pos)[0]), None
        self._next_epoch()

    def _drawn_state(self) -> dict[str, Any]:
        assert self._drawn is not None
        if not self.epochs:
            raise ValueError("no epochs")
        if self._pos >= len(self.epochs):
            pos, rem, done = len(self.epochs) - 1, [], True
        elif self._handed is not None:
            pos, (rem, done) = self._pos, self._handed.consumed
        elif self._start == 0:
            n = self._len(self._pos)[0]
            pos, rem, done = self._pos, [(0, n)] if n else [], False
        else:
            pos, (rem, done) = self._pos, self._start
        return {"format": DRAWN_STATE, "version": 1, "epoch": self.epochs[pos], "id": self._drawn.identity,
                "samples": self._len(pos)[0], "remaining": [[int(a), int(b)] for a, b in rem], "done": bool(done)}

    def _load_drawn(self, state: Mapping[str, Any]) -> None:
        if self._drawn is None:
            raise ValueError("a state of epochs drawn from a dataset, loaded into a loader of an epochs folder")
        if not isinstance(state, Mapping) or state.get("format") != DRAWN_STATE:
            raise ValueError("not a state of drawn epochs (%r): this loader draws its epochs from %s" % (
                state.get("format") if isinstance(state, Mapping) else state, self.dir))
        e = state.get("epoch")
        if type(e) is not int or e not in self.epochs:
            raise ValueError("state is of epoch %r, not one of this loader's epochs %s" % (e, self.epochs))
        pos = self.epochs.index(e)
        r = self._reader(self._plans[pos])
        r.load_state_dict(state)  # (checks the identity, the size and the intervals)
        self._stop()
        fresh = r.remaining == ([(0, r.samples)] if r.samples else []) and not r.done
        self._pos, self._start, self._handed = pos, 0 if fresh else (r.remaining, r.done), None

    def _next_epoch(self) -> None:
        self._pos, self._start, self._handed = self._pos + 1, 0, None

    def close(self) -> None:
        """Stop the thread and close every file (iterating again reopens)."""
        self._stop()
        self._pool, self._pool_refs = {n: [] for n in self.names}, {n: [] for n in self.names}
        self._raw = {}
        if self._drawn is not None:
            self._drawn.close()  # (its datasets' files: opened and checked again by the next iteration)

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._stop()
            drawn = getattr(self, "_drawn", None)
            if drawn is not None:
                drawn.close()
        except Exception:
            pass

    def _stop(self) -> None:
        run, self._run = self._run, None
        if run is not None:
            run.stop()

    # -- reading (in the thread, or in the consumer with prefetch=0) -------

    def _open_threads(self) -> None:
        if self.threads > 1 and self._threads is None:
            self._threads = ThreadPoolExecutor(self.threads, thread_name_prefix="clipshard-read")

    def _close_threads(self) -> None:
        pool, self._threads = self._threads, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _buffer(self, name: str) -> Any:
        """A buffer of name's array that nothing refers to, or a new one (the
        loader keeps at most prefetch + 2 of each)."""
        pool, refs = self._pool[name], self._pool_refs[name]
        for i in range(len(pool)):
            if sys.getrefcount(pool[i]) <= refs[i]:
                return pool[i]
        if len(pool) >= self.prefetch + 2:
            # The user holds on to every buffer: that one is theirs now.
            del pool[0], refs[0]
        pool.append(self._alloc(self._sizes[name]))
        # (measured as the check above measures it: no other reference)
        refs.append(sys.getrefcount(pool[-1]))
        return pool[-1]

    def _read(self, r: EpochReader, lo: int, hi: int, ahead: Iterable[int] = ()) -> dict[str, np.ndarray]:
        if r._ranged:
            r._rows_ready(lo, hi, ahead)  # (a bucket's: the rows fetched into the cache first)
        out: dict[str, np.ndarray] = {}
        pieces: list[tuple[Any, Any, int]] = []
        segs = r._segments(lo, hi)
        r.hold(segs)  # (the pieces are read after every shard of the batch is opened)
        for name in self.names:
            dtype, shape = self._out[name]
            # (a partial last batch: the first hi - lo rows of the buffer)
            arr = np.frombuffer(self._buffer(name), dtype=np.uint8, count=self._sizes[name]).view(dtype).reshape(shape)[:hi - lo]
            # A modality cast is read a cache-sized piece at a time into the
            # reading thread's scratch and cast from there into the batch
            # (the shards' bytes never go to memory and back).
            view: Any = arr.data.cast("B") if name not in self._casting else _CastInto(arr.reshape(-1), self._src[name][0], self._cast, name)
            at = 0
            for k, a, b in segs:
                f = r._shard(k)[name]
                n = (b - a) * f.row
                pieces.append((f, view[at: at + n], f.offset + a * f.row))
                at += n
            out[name] = arr
        pool = self._threads
        if pool is None or self.threads < 2:
            _pread_pieces(pieces)
        else:
            # The reads (and casts) shared among the read threads in parts
            # of about equal bytes.
            list(pool.map(_pread_pieces, _split(pieces, self.threads)))
        return out

    def _read_drawn(self, r: DrawnReader, g: int) -> dict[str, np.ndarray]:
        """Batch g of a drawn epoch: its groups' blocks read (or being read
        ahead), the windows cut from them into the batch's buffers by the
        read threads (rows split among them), then cast."""
        n = len(r.batch_positions(g))
        r.prepare(g)
        out, dsts, casts = {}, {}, []
        for name in self.names:
            dtype, shape = self._out[name]
            arr = np.frombuffer(self._buffer(name), dtype=np.uint8, count=self._sizes[name]).view(dtype).reshape(shape)[:n]
            dst = arr
            if name in self._casting:
                src_dtype, src_shape = self._src[name]
                raw = self._raw.get(name)
                if raw is None:
                    raw = self._raw[name] = np.empty(src_shape, dtype=src_dtype)
                dst = raw[:n]
                casts.append((name, arr, dst))
            out[name], dsts[name] = arr, dst
        pool = self._threads
        if pool is None or self.threads < 2:
            r.fill(g, dsts)
            for name, arr, raw in casts:
                self._cast(name, arr, raw)
        else:
            list(pool.map(lambda job: job(), r.jobs(g, dsts, self.threads)))
            parts = [(name, arr[i:j], raw[i:j]) for name, arr, raw in casts for i, j in _rows(len(arr), self.threads)]
            list(pool.map(lambda c: self._cast(*c), parts))
        return out


def buffer(nbytes: int) -> np.ndarray:
    """A new buffer of nbytes (uint8 numpy array) for batches, its pages
    faulted in (2 MiB ones where the kernel gives them: the first epoch's
    reads do not wait on page faults). Private memory (MAP_PRIVATE):
    mmap's default, MAP_SHARED, kept the pages shared across a fork, and a
    Loader made before a fork and iterated on both sides wrote the
    parent's batches into the child's (check_loader.py); shared anonymous
    memory is also shmem, which gets no 2 MiB pages unless the machine's
    shmem_enabled says so (here: never). (bench_peers.py's floor writes
    into these too.)"""
    flags = getattr(mmap, "MAP_PRIVATE", None)
    m = mmap.mmap(-1, max(nbytes, 1)) if flags is None else mmap.mmap(-1, max(nbytes, 1), flags=flags)
    if nbytes >= 4 << 20 and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    a = np.frombuffer(m, dtype=np.uint8, count=nbytes)
    a[::4096] = 0
    return a


CHUNK = 4 << 20  # bytes read by one preadv call at most (a piece of a batch is split so)


def _split(pieces: list[tuple[Any, Any, int]], parts: int) -> list[list[tuple[Any, Any, int]]]:
    """The pieces cut into parts of about equal bytes (a big piece is split)."""
    flat = []
    for f, view, off in pieces:
        for o in range(0, len(view), CHUNK):
            flat.append((f, view[o: o + CHUNK], off + o))
    total = sum(len(v) for _, v, _ in flat)
    out: list[list[tuple[Any, memoryview, int]]] = [[] for _ in range(parts)]
    acc, i = 0, 0
    for p in flat:
        if acc >= (i + 1) * total / parts and i < parts - 1:
            i += 1
        out[i].append(p)
        acc += len(p[1])
    return [o for o in out if o]


SCRATCH = 1 << 20  # bytes a read thread reads and casts at a time (its L2 cache; measured best of 64 KiB..2 MiB here)
_scratch = threading.local()


class _CastInto:
    """The destination of a piece read and cast: dst (a flat array of the
    batch's dtype) indexed by the bytes of the shards' dtype src."""

    def __init__(self, dst: np.ndarray, src: np.dtype, cast: Any, name: str) -> None:
        self.dst, self.src, self.cast, self.name = dst, src, cast, name

    def __len__(self) -> int:
        return len(self.dst) * self.src.itemsize

    def __getitem__(self, s: slice) -> "_CastInto":
        i = self.src.itemsize
        return _CastInto(self.dst[s.start // i: s.stop // i], self.src, self.cast, self.name)

    def read(self, f: Any, off: int) -> None:
        buf = getattr(_scratch, "buf", None)
        if buf is None:
            buf = _scratch.buf = np.empty(SCRATCH, dtype=np.uint8)
        i, n = self.src.itemsize, len(self.dst)
        step = SCRATCH // i
        for e in range(0, n, step):
            k = min(step, n - e)
            _pread_into(f, buf.data[:k * i], off + e * i)
            self.cast(self.name, self.dst[e: e + k], buf[:k * i].view(self.src))


def _pread_into(f: Any, view: memoryview, off: int) -> None:
    if pread_into(f.fd, view, off) < len(view):
        raise ValueError("%s: shorter than its header says (changed since it was checked?)" % f.path)


def _pread_pieces(pieces: list[tuple[Any, Any, int]]) -> None:
    """Read each piece: len(view) bytes of f (a checked Npy) at off, into
    view (a memoryview, or a _CastInto: read and cast)."""
    for f, view, off in pieces:
        if isinstance(view, _CastInto):
            view.read(f, off)
        else:
            _pread_into(f, view, off)


def _produce(ref: "weakref.ref[Loader]", pos: int, start: int, stop: Optional[threading.Event]) -> Generator[Any, None, None]:
    """The batches from epoch pos at start on, then the following epochs'
    from their beginnings, each epoch ended by _END (the thread reads on
    across the boundary). The loader is held only while a batch is read:
    a loader its user let go of is collected, and its thread stops."""
    r = None
    try:
        while True:
            loader = ref()
            if loader is None or pos >= len(loader.epochs):
                return
            r = loader._reader(loader._plans[pos])
            drawn = loader._drawn is not None
            del loader
            if drawn:
                r.plan.check_current()  # (a dataset converted again since: refused, not read in two versions)
                if start != 0:
                    r._resume(*start)  # type: ignore[misc]
                n = r.batches_left()
                for g in range(n):
                    loader = ref()
                    if loader is None or (stop is not None and stop.is_set()):
                        return
                    if g == max(0, n - 2) and stop is not None and pos + 1 < len(loader._plans):
                        r.order_ahead(loader._plans[pos + 1]["epoch"])
                    arrays = loader._finish(loader._read_drawn(r, g))
                    del loader
                    yield _Batch(pos, g, arrays, r.remaining_after(g + 1), g + 1 == n)
                r.close()
                r = None
                yield _END
                if stop is None:
                    return
                pos, start = pos + 1, 0
                continue
            r.load_state_dict(dict(r.state_dict(), consumed=start))
            n = r.batches_left()
            B, R = r.batch_size, r.world_size
            for g in range(n):
                loader = ref()
                if loader is None or (stop is not None and stop.is_set()):
                    return
                lo = r.start + g * B * R + r.rank * B
                if g + 1 < n:
                    r._advise(lo + B * R, lo + B * R + B, probe=True)  # the disk works on the next one meanwhile
                arrays = loader._finish(loader._read(r, lo, r._end(lo), [lo + h * B * R for h in range(1, 5) if g + h < n]))
                del loader
                yield _Batch(pos, g, arrays, r._consumed(g), g + 1 == n)
            r.close()
            r = None
            yield _END
            if stop is None:
                return  # (prefetch=0: one epoch at a time)
            pos, start = pos + 1, 0
    finally:
        if r is not None:
            r.close()


class _Run:
    """The read-ahead thread of one stretch of epochs, and its queue."""

    def __init__(self, loader: Loader, pos: int, start: int) -> None:
        self.q: queue.Queue[Any] = queue.Queue(maxsize=loader.prefetch)
        self.halt = threading.Event()
        self.next = (pos, start)  # where the first batch not yet taken is
        self.done = False
        self.thread = threading.Thread(target=self._work, args=(weakref.ref(loader), pos, start), daemon=True,
                                       name="clipshard-loader")
        self.thread.start()

    def _work(self, ref: "weakref.ref[Loader]", pos: int, start: int) -> None:
        loader = ref()
        if loader is None:
            return
        loader._open_threads()
        pool = loader._threads
        del loader  # (the thread does not keep the loader alive)
        gen = _produce(ref, pos, start, self.halt)
        try:
            for item in gen:
                if not self._put(item):
                    return
        except BaseException as e:  # everything reaches the consumer
            self._put(_Failed(e))
        finally:
            gen.close()  # its reader's files close
            loader = ref()
            if loader is not None and loader._threads is pool:
                loader._threads = None
            del loader
            if pool is not None:
                pool.shutdown(wait=True)
            self._put(None)

    def _put(self, item: Any) -> bool:
        while not self.halt.is_set():
            try:
                self.q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def alive_at(self, pos: int, start: int) -> bool:
        return not self.done and not self.halt.is_set() and self.next == (pos, start)

    def take(self, pos: int) -> Generator[Any, None, None]:
        """The items of epoch pos, up to its _END."""
        while True:
            item = self.q.get()
            if item is None:
                self.done = True
                return
            if item is _END:
                self.next = (pos + 1, 0)
                return
            if isinstance(item, _Failed):
                self.done = True
            yield item

    def stop(self) -> None:
        self.halt.set()
        if threading.current_thread() is self.thread:
            return  # (the loader collected in its own thread: it ends on its own)
        while self.thread.is_alive():
            try:  # make room, so that a put in progress returns
                while True:
                    self.q.get_nowait()
            except queue.Empty:
                pass
            self.thread.join(timeout=0.05)
