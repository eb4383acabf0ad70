"""A read-ahead loader over the epochs `shuffle` wrote: a background thread
reads this rank's next batches straight into preallocated buffers, so the
training step finds its batch ready.

The batches, the order and the resume rule are those of EpochReader (any
world size, any batch size, the state a count of samples), across any
number of epochs, materialised or replayed, in one object.

A Loader composes the stages: the epochs and their readers (_epochlist:
each epoch's order and source), the assembly of a batch into buffers by
read threads (_assembly), the read-ahead thread (_prefetch), and the
device (HostDevice here; clipshard.torch's TorchDevice: tensors, pinned
buffers, a CUDA device).
"""
from __future__ import annotations

import weakref
from typing import Any, Generator, Iterable, Iterator, Mapping, Optional, Union

import numpy as np

from ._assembly import Assembly, buffer
from ._epochlist import STATE_FORMAT, EpochList
from ._files import memory_limit
from ._labels import pick_labels
from ._manifest import source_column
from ._prefetch import END, Batch, Failed, Run, produce
from .draw import Drawn

__all__ = ["Loader", "HostDevice", "buffer", "STATE_FORMAT"]


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
                 cache_limit: Union[str, int, None] = None, dataset: Any = None, _device: Any = None, **draw: Any) -> None:
        # (_device: the device stage, clipshard.torch.Loader's TorchDevice;
        # a HostDevice by default)
        if not isinstance(prefetch, (int, np.integer)) or prefetch < 0:
            raise ValueError("prefetch %r: want an int >= 0" % (prefetch,))
        if not isinstance(threads, (int, np.integer)) or threads < 1:
            raise ValueError("threads %r: want an int >= 1" % (threads,))
        self.list = el = EpochList(edir, epochs, rank=rank, world_size=world_size, batch_size=batch_size, remainder=remainder,
                                   replay_seed=replay_seed, mix_shards=mix_shards, mix_seed=mix_seed, mix_mem=mix_mem,
                                   cache_dir=cache_dir, cache_limit=cache_limit, dataset=dataset, draw=draw)
        self.epochs: list[int] = el.epochs
        self.dir, self.manifest, self.prefetch, self.threads = el.dir, el.manifest, int(prefetch), int(threads)
        self._remote = el.remote
        self.rank, self.world_size, self.batch_size, self.remainder = el.rank, el.world_size, el.batch_size, el.remainder
        self.names: list[str] = el.names
        self.sources: list[str] = el.sources  # what a batch's "source" numbers name (mixed epochs)
        self.mixed: bool = el.mixed
        self._src: dict[str, tuple[np.dtype, tuple[int, ...]]] = {
            n: (np.dtype(d), (self.batch_size,) + tuple(s)) for n, (d, s) in el.expect.items()}
        self.dev = HostDevice() if _device is None else _device  # the device stage
        out = {n: (self.dev.out_dtype(d, dtype), s) for n, (d, s) in self._src.items()}
        self.shapes: dict[str, tuple[int, ...]] = {n: s for n, (_, s) in self._src.items()}  # of a batch's arrays
        self.floating: list[str] = [n for n, (d, _) in self._src.items() if d.kind == "f"]  # the modalities dtype casts
        self.assembly = Assembly(self.names, self._src, out, self.prefetch, self.threads, self.dev.alloc, self.dev.cast,
                                 self.dev.held, self.dev.reuse)
        self._casting = self.assembly.casting
        self.dev.bind({n: d for n, (d, _) in self._src.items()}, self._casting)
        self.batch_bytes = self.assembly.batch_bytes  # bytes of one batch as handed out
        self.host_bytes = self.assembly.host_bytes(el.drawn is not None)  # at most, held by the loader
        room = memory_limit() or 1 << 47
        if self.host_bytes > room:
            raise ValueError("batch_size %d: batches of %d samples of %s take %d bytes each, and the loader holds up to %d "
                             "(prefetch %d + 2 batches): more than this machine's memory (%d bytes): lower batch_size or "
                             "prefetch, or cut shorter windows" % (self.batch_size, self.batch_size, dict(self.shapes),
                                                                    self.batch_bytes, self.host_bytes, self.prefetch, room))
        if self.dev.eager:
            self.assembly.allocate()
        # current epoch, its resume point (a drawn epoch's: 0 or (the
        # intervals left, done)), last batch handed out
        self._pos, self._start, self._handed = 0, 0, None  # type: tuple[int, Any, Optional[Batch]]
        self._run: Optional[Run] = None

    def __repr__(self) -> str:
        d = self.list.drawn
        src = "drawn from %s" % ", ".join(s.url for s in d.sources) if d is not None else str(self.dir)
        short = ""
        n = sum(d.short_clips.values()) if d is not None else 0
        if d is not None and n:
            short = "; %d clips shorter than the window (%d frames) %s" % (
                n, d.window, "left out (short='skip')" if d.short == "skip" else "padded with zeros past their frames (short='pad')")
        return "clipshard.Loader(%s: epochs %s, rank %d of %d, batches of %d: %s%s)" % (
            src, self.epochs, self.rank, self.world_size, self.batch_size,
            ", ".join("%s %s" % (k, list(v)) for k, v in self.shapes.items()), short)

    def labels(self, name: str) -> list[str]:
        """Label modality name's vocabulary (convert --label NAME): a
        batch's int32 codes batch[name] stand for labels(name)[code]
        (numpy: np.asarray(loader.labels(name))[batch[name]]; torch:
        batch[name].long() as class indices)."""
        return pick_labels(self.list.labels, name, self.dir)

    # -- epochs and state -------------------------------------------------

    @property
    def drawn(self) -> Optional[Drawn]:
        """With dataset=: the Drawn the epochs are drawn by (its sources,
        options, and .read, the read mode "auto" chose); else None."""
        return self.list.drawn

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
        return self.list.left(self._pos, self._start)

    def state_dict(self) -> dict[str, Any]:
        """Where the batches handed out so far end: the epoch and the
        samples of it that all ranks together have consumed (the same on
        every rank), and whether it is done. A dict of ints, strings and
        bools (torch.save, JSON). Save it after the step that trained on
        the last batch. (Drawn epochs: the intervals of the epoch's order
        still to read, see clipshard.draw.DrawnReader.state_dict.)"""
        h = self._handed
        return self.list.state(self._pos, self._start, None if h is None else (h.consumed, h.last))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go on where state says, with this loader's world size and batch
        size (which may differ from those that saved it). Also takes an
        EpochReader's or EpochDataset's state (its virtual epoch)."""
        self._stop()  # (before: a state of another dataset version closes the one the read-ahead reads)
        pos, start = self.list.resume(state)
        self._pos, self._start, self._handed = pos, start, None

    # -- iteration --------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        """This rank's batches of the current epoch, from its resume point
        (after a break: after the last batch handed out); at its end the
        loader moves on to the next epoch of the list."""
        if self._pos >= len(self.epochs):
            return
        pos, start = self._pos, self._start
        if start == 0:
            r = self.list.reader(pos)
            try:
                r.check_fits()  # (an epoch too small for one global batch: refused, not silently empty)
            finally:
                r.close()
        if len(self) == 0:
            self._next_epoch()
            return
        if self.prefetch == 0:
            self.assembly.open_threads()
            source: Generator[Any, None, None] = produce(weakref.ref(self), pos, start, None)
        else:
            run = self._run
            if run is None or not run.alive_at(pos, start):
                self._stop()
                run = self._run = Run(self, pos, start)
            source = run.take(pos)
        finished = False
        try:
            for item in source:
                if item is END:
                    break
                if isinstance(item, Failed):
                    raise item.error
                self._handed = item
                arrays = item.arrays
                if self.mixed and "source" not in arrays:
                    arrays["source"] = source_column(arrays["samples"], len(self.sources),
                                                lambda: "%s: epoch %r" % (self.dir, self.epochs[item.pos]))
                yield self.dev.wrap(arrays)
                if item.last:
                    finished = True
        finally:
            if self.prefetch == 0:
                source.close()  # (its reader's files close)
                self.assembly.close_threads()
            if not finished:
                self._stop()  # a break, an error: the thread ends, the files close
                if self._handed is not None:  # the next iteration goes on after the last batch handed out
                    c = self._handed.consumed
                    self._start, self._handed = c if self.list.drawn is not None else min(c, self.list.len(pos)[0]), None
        self._next_epoch()

    def _next_epoch(self) -> None:
        self._pos, self._start, self._handed = self._pos + 1, 0, None

    def close(self) -> None:
        """Stop the thread and close every file (iterating again reopens)."""
        self._stop()
        self.assembly.clear()
        self.list.close()  # (a drawn list's datasets' files: opened and checked again by the next iteration)

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._stop()
            el = getattr(self, "list", None)
            if el is not None:
                el.close()
        except Exception:
            pass

    def _stop(self) -> None:
        run, self._run = self._run, None
        if run is not None:
            run.stop()


class HostDevice:
    """The device stage of clipshard.Loader: numpy arrays in host buffers
    of the loader's own (private memory, 2 MiB pages where the kernel
    gives them), floating modalities cast by numpy in the read threads
    (the cast releases the GIL), batches handed out as they are.
    clipshard.torch's TorchDevice is the same stage for torch tensors
    (pinned buffers, a copy to a CUDA device). Holds no loader: the
    loader's threads hold the stage, never the loader."""

    # Buffers are the loader's, reused once nothing refers to them (and no
    # copy in flight reads them: Assembly.hold); made with the loader
    # (eager), not by the first batch.
    reuse = True
    eager = True

    def __str__(self) -> str:
        return "HostDevice(numpy)"

    def held(self, nbytes: int) -> int:
        """Bytes of memory a buffer of nbytes holds (its pages)."""
        return -(-max(nbytes, 1) // 4096) * 4096

    def out_dtype(self, src: np.dtype, dtype: Any) -> np.dtype:
        """The dtype a batch holds a modality in: dtype for a floating one
        (None: the shards')."""
        if dtype is None or src.kind != "f":
            return src
        return np.dtype(dtype)

    def bind(self, src: dict[str, np.dtype], casting: list[str]) -> None:
        """Told the shards' dtype of each array, and which are cast."""

    def alloc(self, nbytes: int) -> Any:
        return buffer(nbytes)

    def cast(self, name: str, dst: np.ndarray, src: np.ndarray) -> None:
        np.copyto(dst, src, casting="unsafe")

    def finish(self, arrays: dict[str, np.ndarray], asm: Any) -> Any:
        """What the read-ahead thread makes of a batch it read (e.g. a copy
        to the device, asm.hold of its buffers, asm.take_used(), until the
        copy completes)."""
        asm.take_used()
        return arrays

    def wrap(self, arrays: Any) -> Any:
        """The batch as handed to the user, in the consumer."""
        return arrays
