"""The assembly stage: a batch's arrays filled by read threads into
buffers the loader owns, from the files the source stage opened, in the
ranges the order stage names.

A materialised epoch's batch is a few runs of rows of each shard file:
read with os.preadv straight into the batch's buffer (the reads split
among the threads in parts of about equal bytes), a modality cast a
SCRATCH at a time through the thread's own scratch. A drawn epoch's
batch is cut from the page cache by its reader's jobs (DrawnReader.jobs),
then cast. A buffer handed out is never written again: it is reused only
once nothing refers to it.
"""
from __future__ import annotations

import functools
import math
import mmap
import sys
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Optional

import numpy as np

from ._files import pread_into

__all__ = ["Assembly", "buffer"]


class Assembly:
    """The buffers of a loader's batches and the threads that fill them.

    names: the arrays of a batch; src, out: name -> (dtype, shape of a
    whole batch) as the files hold it and as the batch hands it out (a
    floating modality cast when they differ); prefetch: batches read
    ahead (the pool holds prefetch + 2 buffers of each array); threads:
    the read threads; alloc(nbytes): a new buffer (pinned memory for
    torch); cast(name, dst, src): the cast of a piece.

        asm = Assembly(["x", "samples"], src, out, prefetch=4, threads=2, alloc=buffer, cast=copy)
        asm.open_threads(); arrays = asm.read(reader, lo, hi); asm.close_threads()
    """

    def __init__(self, names: list[str], src: dict[str, tuple[np.dtype, tuple[int, ...]]],
                 out: dict[str, tuple[np.dtype, tuple[int, ...]]], prefetch: int, threads: int,
                 alloc: Callable[[int], Any], cast: Callable[[str, np.ndarray, np.ndarray], None],
                 held: Callable[[int], int] = int, reuse: bool = True) -> None:
        self.names, self.src, self.out, self.prefetch, self.threads = names, src, out, prefetch, threads
        self.alloc, self.cast, self.held, self.reuse = alloc, cast, held, reuse
        # The buffers of the batch being filled (take_used), and the copies
        # reading a buffer that the device stage has in flight (hold): a
        # buffer is reused once nothing refers to it and its copy completed.
        self.used: list[Any] = []
        self._busy: dict[int, tuple[Any, Any]] = {}  # id(buffer) -> (weakref to it, its copy's event)
        # Each modality's arrays have buffers of their own: a batch's
        # "samples" kept by the user (say) holds on to its own few bytes,
        # not to the whole batch.
        self.sizes = {n: math.prod(s) * d.itemsize for n, (d, s) in out.items()}
        self.batch_bytes = sum(self.sizes.values())  # bytes of one batch as handed out
        self.casting = [n for n in names if out[n][0] != src[n][0]]
        self.pool: dict[str, list[Any]] = {n: [] for n in names}  # per modality; free when nothing else refers to it
        self.refs: dict[str, list[int]] = {n: [] for n in names}
        self.raw: dict[str, Any] = {}  # a drawn batch's scratch of the shards' dtype, when casting
        self.executor: Optional[ThreadPoolExecutor] = None  # the read threads while reading

    def __str__(self) -> str:
        return "Assembly(%d arrays, %d bytes a batch, prefetch %d, %d threads, casting %s)" % (
            len(self.names), self.batch_bytes, self.prefetch, self.threads, self.casting)

    def host_bytes(self, drawn: bool) -> int:
        """Host memory held at most: prefetch + 2 batches, and the casts'
        scratch (a drawn batch of the shards' dtype, or SCRATCH a thread)."""
        raw = (sum(math.prod(self.src[n][1]) * self.src[n][0].itemsize for n in self.casting)
               if drawn else SCRATCH * self.threads * bool(self.casting))
        return (self.prefetch + 2) * sum(self.held(b) for b in self.sizes.values()) + raw

    def allocate(self) -> None:
        """Every buffer made now (not by the first epoch's reads)."""
        for n in self.names if self.prefetch and self.reuse else ():
            for _ in range(self.prefetch + 2):
                self.pool[n].append(self.alloc(self.sizes[n]))
                self.refs[n].append(sys.getrefcount(self.pool[n][-1]))

    def clear(self) -> None:
        for got in list(self._busy.values()):
            got[1].synchronize()  # (no buffer let go of while a copy of ours reads it)
        self._busy, self.used = {}, []
        self.pool, self.refs = {n: [] for n in self.names}, {n: [] for n in self.names}
        self.raw = {}

    def open_threads(self) -> None:
        if self.threads > 1 and self.executor is None:
            self.executor = ThreadPoolExecutor(self.threads, thread_name_prefix="clipshard-read")

    def close_threads(self) -> None:
        pool, self.executor = self.executor, None
        if pool is not None:
            pool.shutdown(wait=True)

    def buffer(self, name: str) -> Any:
        """A buffer of name's array that nothing refers to and no copy in
        flight reads (hold), or a new one (at most prefetch + 2 of each are
        kept; when they are all free but read by copies in flight, the
        oldest copy is waited for). Without reuse (the device stage hands
        out blocks of an allocator that guards them itself), a new one."""
        if not self.reuse:
            b = self.alloc(self.sizes[name])
            self.used.append(b)
            return b
        pool, refs = self.pool[name], self.refs[name]
        waiting = -1
        for i in range(len(pool)):
            if sys.getrefcount(pool[i]) <= refs[i]:
                ev = self._event(pool[i])
                if ev is None or ev.query():
                    return self._use(pool[i])
                waiting = i if waiting < 0 else waiting
        if waiting >= 0 and len(pool) >= self.prefetch + 2:
            self._event(pool[waiting]).synchronize()  # (the pool is full: its copy completes first)
            return self._use(pool[waiting])
        if len(pool) >= self.prefetch + 2:
            # The user holds on to every buffer: that one is theirs now
            # (once no copy of ours reads it).
            ev = self._event(pool[0])
            if ev is not None:
                ev.synchronize()
            self._busy.pop(id(pool[0]), None)
            del pool[0], refs[0]
        pool.append(self.alloc(self.sizes[name]))
        # (measured as the check above measures it: no other reference)
        refs.append(sys.getrefcount(pool[-1]))
        return self._use(pool[-1])

    def _use(self, b: Any) -> Any:
        self._busy.pop(id(b), None)
        self.used.append(b)
        return b

    def _event(self, b: Any) -> Any:
        """The event of the copy in flight that reads buffer b (None: none)."""
        got = self._busy.get(id(b))
        return got[1] if got is not None and got[0]() is b else None

    def take_used(self) -> list[Any]:
        """The buffers of the batch just filled (then forgotten here)."""
        used, self.used = self.used, []
        return used

    def hold(self, buffers: list[Any], event: Any) -> None:
        """These buffers are read by a copy in flight until event (query():
        done; synchronize(): wait for it) says it is done: not reused
        before."""
        for b in buffers:
            self._busy[id(b)] = (weakref.ref(b), event)

    def _array(self, name: str, n: int) -> np.ndarray:
        """name's array of a batch of n rows, in a free buffer."""
        dtype, shape = self.out[name]
        return np.frombuffer(self.buffer(name), dtype=np.uint8, count=self.sizes[name]).view(dtype).reshape(shape)[:n]

    def read(self, r: Any, lo: int, hi: int, ahead: Iterable[int] = ()) -> dict[str, np.ndarray]:
        """The batch of positions [lo, hi) of an EpochReader r's epoch: its
        rows read straight into the batch's buffers (a partial last batch:
        the first hi - lo rows)."""
        self.used = []
        files = r.files
        files.rows_ready(lo, hi, ahead)  # (a bucket's: the rows fetched into the cache first)
        out: dict[str, np.ndarray] = {}
        pieces: list[tuple[Any, Any, int]] = []
        segs = r.order.segments(lo, hi)
        files.hold(segs)  # (the pieces are read after every shard of the batch is opened)
        for name in self.names:
            arr = self._array(name, hi - lo)
            # A modality cast is read a cache-sized piece at a time into the
            # reading thread's scratch and cast from there into the batch
            # (the shards' bytes never go to memory and back).
            view: Any = arr.data.cast("B") if name not in self.casting else _CastInto(arr.reshape(-1), self.src[name][0], self.cast, name)
            at = 0
            for k, a, b in segs:
                f = files.shard(k)[name]
                n = (b - a) * f.row
                pieces.append((f, view[at: at + n], f.offset + a * f.row))
                at += n
            out[name] = arr
        if self.executor is None or self.threads < 2:
            _pread_pieces(pieces)
        else:
            # The reads (and casts) shared among the read threads in parts
            # of about equal bytes.
            list(self.executor.map(_pread_pieces, _split(pieces, self.threads)))
        return out

    def read_drawn(self, r: Any, g: int) -> dict[str, np.ndarray]:
        """Batch g of a DrawnReader r's epoch: its groups' blocks read (or
        being read ahead), the windows cut from them into the batch's
        buffers by the read threads (rows split among them), each piece
        cast as it is cut."""
        self.used = []
        n = len(r.batch_positions(g))
        r.prepare(g)
        out, dsts, casts = {}, {}, []
        for name in self.names:
            arr = dst = self._array(name, n)
            if name in self.casting:
                src_dtype, src_shape = self.src[name]
                raw = self.raw.get(name)
                if raw is None:
                    raw = self.raw[name] = np.empty(src_shape, dtype=src_dtype)
                dst = raw[:n]
                casts.append((name, arr, dst))
            out[name], dsts[name] = arr, dst
        if not casts:
            jobs = [job for _, _, job in r.pieces(g, dsts, self.threads)]
        else:
            # Each stretch of rows cut (into the shards' dtype) and cast by
            # the same thread, one after the other, in pieces of at most 8
            # SCRATCH of the cast modalities' bytes (at least one a thread):
            # 1.15x (0.95-1.36) the drawn float32 rate of cutting the whole
            # batch, then casting it in a second round of the threads (10
            # interleaved rounds, bench_ab.py speed drawn); pieces of one
            # SCRATCH, each cast while in the core's cache, were 0.68x
            # (their many small copies' calls).
            per_row = sum(raw[:1].nbytes for _, _, raw in casts)
            parts = max(self.threads, -(-n * per_row // (8 * SCRATCH)))
            jobs = [functools.partial(self._cut_and_cast, job, i, k, casts) for i, k, job in r.pieces(g, dsts, parts)]
        if self.executor is None or self.threads < 2:
            for job in jobs:
                job()
        else:
            list(self.executor.map(_call, jobs))
        return out

    def _cut_and_cast(self, cut: Callable[[], None], i: int, k: int, casts: list[tuple[str, np.ndarray, np.ndarray]]) -> None:
        """Rows i..k of a drawn batch: cut, then cast."""
        cut()
        for name, arr, raw in casts:
            self.cast(name, arr[i:k], raw[i:k])


def _call(job: Callable[[], None]) -> None:
    job()


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

