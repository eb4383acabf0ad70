"""clipshard epochs as a PyTorch IterableDataset (torch is imported only
here)."""
from __future__ import annotations

import ctypes
import functools
import os
import threading
from typing import Any, Callable, Iterator, Mapping, Optional

import numpy as np
import torch
import torch.utils.data

from . import loader as _loader
from ._epochlist import check_keywords
from .draw import Drawn, DrawnReader
from .epochs import EpochReader

__all__ = ["EpochDataset", "Loader"]


class EpochDataset(torch.utils.data.IterableDataset):
    """One rank's batches of one epoch (see clipshard.EpochReader, which
    takes the same keyword arguments), as dicts of tensors, for
    DataLoader(ds, batch_size=None, num_workers=N): the workers share the
    rank's batches round-robin, and they arrive in the order of a single
    process.

    rank and world_size default to torch.distributed's when it is
    initialised. Each batch also holds "consumed": the samples of the epoch
    that all ranks have consumed once it is trained on. To checkpoint,
    save ds.state_dict(batch) with the last batch trained on (it is a dict
    of ints: torch.save or JSON); to resume, even with another world size
    or batch size, ds.load_state_dict(state) before iterating.

        from clipshard.torch import EpochDataset
        ds = EpochDataset("/data/epochs", epoch, batch_size=256)
        ds.load_state_dict(saved)               # optional: resume
        for batch in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2):
            step(batch); saved = ds.state_dict(batch)

    With dataset= instead of edir, an epoch drawn at read time from a
    dataset (clipshard.draw; window= required, and seed, sampling, ...
    as clipshard.Loader(dataset=...)): "consumed" is then the batches
    this rank has trained on since the resume point, and the state the
    intervals of the epoch still to read. Each DataLoader worker reads
    the groups of blocks its batches need (one copy per worker).

    Workers may be forked, spawned or started by a fork server
    (multiprocessing_context; Python 3.14's default on Linux): a spawned
    worker gets the dataset pickled and opens the epoch, or the dataset's
    sources, itself, refusing a version other than the one checked here.
    """

    def __init__(self, edir: Optional[str] = None, epoch: int = 0, rank: Optional[int] = None, world_size: Optional[int] = None,
                 batch_size: int = 256, dataset: Any = None, **kw: Any) -> None:
        super().__init__()
        if world_size is None:
            dist = torch.distributed
            ok = dist.is_available() and dist.is_initialized()
            world_size = dist.get_world_size() if ok else 1
            rank = (dist.get_rank() if ok else 0) if rank is None else rank
        self.drawn: Optional[Drawn] = None
        self.state: Optional[dict[str, Any]] = None
        self._yielded = False  # a batch was yielded in this process (num_workers=0)
        self._at: Optional[dict[str, Any]] = None  # where this process's iteration is (a worker's state)
        if dataset is not None:
            if edir is not None:
                raise ValueError("edir %r and dataset %r: give one" % (edir, dataset))
            remainder = kw.pop("remainder", "drop")
            check_keywords(list(kw) + ["remainder"], Drawn, DrawnReader)
            self.drawn = Drawn(dataset, **kw)
            self.args = dict(epoch=epoch, rank=rank, world_size=world_size, batch_size=batch_size, remainder=remainder)
            self.reader: Any = DrawnReader(self.drawn, **self.args)
            return
        if edir is None:
            raise ValueError("give an epochs folder (edir), or dataset= to draw the epoch from a dataset")
        # (a world_size without a rank is refused by EpochReader)
        check_keywords(kw, EpochReader)
        self.args = dict(edir=edir, epoch=epoch, rank=rank, world_size=world_size, batch_size=batch_size, **kw)
        self.reader = EpochReader(**self.args)  # checks the arguments now
        # The epoch's version is pinned here, in the process that made the
        # dataset: its DataLoader workers read that one or raise.
        self.reader.files.pinned()

    def __len__(self) -> int:
        return len(self.reader)

    def labels(self, name: str) -> list[str]:
        """Label modality name's vocabulary (convert --label NAME): a
        batch's code c in batch[name] is labels(name)[c]."""
        return self.reader.labels(name)  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if self.drawn is not None:
            return self._drawn_iter()
        r = EpochReader(**self.args, _manifest=self.reader.manifest, _pin=self.reader.files.pin)
        first = None
        st = self.state
        if st is not None and "worker" in st:
            # A DataLoader worker's own state (torchdata's StatefulDataLoader
            # keeps one per worker): this worker goes on from its next batch.
            if list(st["worker"]) != list(_worker_info()):
                raise ValueError("a state of DataLoader worker %s, loaded in worker %s: resume with the same "
                                 "num_workers" % (list(st["worker"]), list(_worker_info())))
            r.load_state_dict(dict(st, consumed=st["resume"]))
            first = st["next"]
        elif st is not None:
            r.load_state_dict(st)
        wid, nw = _worker_info()
        # (set when the iterator is made, before its first batch: the
        # process iterating is known at once)
        self._at = {"resume": r.start, "next": wid if first is None else first, "worker": [wid, nw]}
        return self._batches(r, first, nw)

    def _batches(self, r: EpochReader, first: Optional[int], nw: int) -> Iterator[dict[str, torch.Tensor]]:
        assert self._at is not None
        for b in r.batches(first=first):
            out = {k: _tensor(v) for k, v in b.items()}
            out["consumed"] = torch.tensor(r.consumed, dtype=torch.int64)
            self.reader.consumed = r.consumed  # (num_workers=0: the same process)
            self._at["next"] += nw
            self._yielded = True
            yield out

    def _drawn_iter(self) -> Iterator[dict[str, torch.Tensor]]:
        assert self.drawn is not None
        r = DrawnReader(self.drawn, **self.args)
        st = self.state
        first = None
        if st is not None and "worker" in st:
            if list(st["worker"]) != list(_worker_info()):
                raise ValueError("a state of DataLoader worker %s, loaded in worker %s: resume with the same "
                                 "num_workers" % (list(st["worker"]), list(_worker_info())))
            r.load_state_dict(st["resume"])
            first = st["next"]
        elif st is not None:
            r.load_state_dict(st)
        wid, nw = _worker_info()
        self._at = {"resume": r.state_after(0), "next": wid if first is None else first, "worker": [wid, nw]}
        for b in r.batches(first=first):
            out = {k: torch.from_numpy(v) for k, v in b.items()}
            out["consumed"] = torch.tensor(r.consumed_batches, dtype=torch.int64)
            self.reader = r  # (num_workers=0: the same process)
            self._at["next"] += nw
            self._yielded = True
            yield out

    def state_dict(self, batch: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
        """The state after batch (the last one trained on), or, without it,
        after the last batch this process yielded (num_workers=0). Inside
        a DataLoader worker (as torchdata's StatefulDataLoader asks it),
        that worker's own place, which only that worker can load."""
        if self.drawn is not None:
            if batch is not None:
                return self.reader.state_after(int(batch["consumed"]))
            if torch.utils.data.get_worker_info() is not None and self._at is not None:
                return dict(self.reader.state_dict(), **self._at)
            if self._at is None:
                raise ValueError("state_dict() without a batch, and this process did not iterate: pass the last batch "
                                 "trained on, state_dict(batch)")
            return self.reader.state_dict()
        st = self.reader.state_dict()
        if batch is not None:
            st["consumed"] = int(batch["consumed"])
        elif torch.utils.data.get_worker_info() is not None:
            at = self._at if self._at is not None else {
                "resume": self.reader.start, "next": _worker_info()[0], "worker": list(_worker_info())}
            st.update(at)
        elif self._at is None:
            # With DataLoader workers the batches are read in other
            # processes: this one cannot know how far they got.
            raise ValueError("state_dict() without a batch, and this process did not iterate (DataLoader workers "
                             "read in other processes, or nothing was read yet): pass the last batch trained on, "
                             "state_dict(batch)")
        elif not self._yielded:
            st["consumed"] = self._at["resume"]  # iterating here, nothing handed out yet
        return st

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.drawn is not None:
            self.reader.load_state_dict(state if "worker" not in state else state["resume"])
        else:
            self.reader.load_state_dict(state if "worker" not in state else dict(state, consumed=state["resume"]))
        self.state = dict(state)


def _worker_info() -> tuple[int, int]:
    info = torch.utils.data.get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def _tensor(a: np.ndarray) -> torch.Tensor:
    if not a.flags.writeable:  # a view of a memory-mapped shard: copied out
        a = np.array(a)
    return torch.from_numpy(a)


class Loader(_loader.Loader):
    """clipshard.Loader delivering torch tensors: this rank's batches of a
    list of epochs, read ahead by a thread into preallocated buffers (see
    clipshard.Loader for the epochs, the state and the memory held).

        loader = Loader("/data/epochs", epochs=range(10), batch_size=256, dtype=torch.float32)
        for epoch in loader.epochs:
            loader.set_epoch(epoch)
            for batch in loader:                 # {"whisper": float32 tensor [256, 30, 64], ..., "samples": int64 [256, 3]}
                step(batch); save(loader.state_dict())

    rank and world_size default to torch.distributed's when it is
    initialised.
    dtype: a torch floating dtype (torch.float32, torch.bfloat16, ...) for
        the floating-point modalities; None keeps the shards' dtype.
    device: None (host tensors) or a device. A CUDA device gets pinned host
        buffers; the thread copies each batch to it with non_blocking=True
        on a side stream and casts there (half the bytes over PCIe), and
        the consumer's stream waits for that copy.
    pin_memory: pinned host buffers (default: when device is CUDA).
    Without a device the cast is done in the thread (torch's copy releases
    the GIL).
    """

    def __init__(self, edir: Optional[str] = None, epochs: Any = None, *, rank: Optional[int] = None, world_size: Optional[int] = None,
                 device: Any = None, dtype: Optional[torch.dtype] = None, pin_memory: Optional[bool] = None,
                 **kw: Any) -> None:
        if world_size is None:
            dist = torch.distributed
            ok = dist.is_available() and dist.is_initialized()
            world_size = dist.get_world_size() if ok else 1
            rank = (dist.get_rank() if ok else 0) if rank is None else rank
        if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
            raise ValueError("dtype %r: want a torch floating-point dtype (torch.float32, torch.bfloat16, ...)" % (dtype,))
        self.device = None if device is None else torch.device(device)
        cuda = self.device is not None and self.device.type == "cuda"
        if self.device is not None and self.device.type not in ("cpu", "cuda"):
            raise ValueError("device %r: want cpu or a CUDA device" % (device,))
        self.pin_memory = cuda if pin_memory is None else bool(pin_memory)
        # On a device the cast is done there: the host keeps the shards' dtype.
        super().__init__(edir, epochs, rank=rank, world_size=world_size, dtype=None if cuda else dtype,
                         _device=TorchDevice(self.device, dtype, self.pin_memory), **kw)
        if self._casting and self.threads >= 2:
            # The OpenMP runtime's lookup (parallel_info, /proc/self/maps:
            # 2-3 ms) made now, not by the read threads' first casts: the
            # first batch of float32, warm, waited 14-22 ms, 9-12 after.
            _omp_set_num_threads()


# Arrays that stay on the host on a device: read there (the samples'
# clips and frames, the source numbers), never worth a copy and a sync.
HOST_ONLY = ("samples", "source")


class TorchDevice(_loader.HostDevice):
    """The device stage of clipshard.torch.Loader: batches as torch
    tensors; floating modalities cast by torch in the read threads, or, on
    a CUDA device, copied there and cast there (half the bytes over PCIe).

    - On a CUDA device: host buffers of torch's pinned memory, reused by
      the loader; the read thread enqueues batch k's copies on a side
      stream, records an event after them, and goes on reading batch k+1
      (no wait); a buffer is reused only once nothing refers to it and the
      event of the last copy that read it has completed (Assembly.hold,
      FFCV's rule). The consumer's current stream waits for the event when
      the batch is handed out, and the device tensors are recorded on it
      (record_stream: the caching allocator keeps them until that
      stream's work is done). A consumer that uses them on another stream
      must make that stream wait on the current one (or call
      t.record_stream(s)). "samples" and "source" stay on the host.
    - pin_memory without a device: each batch's arrays are blocks of
      torch's caching host allocator (a new block a batch, none reused by
      the loader), handed out as tensors over those blocks: a user's
      x.to("cuda", non_blocking=True) then has torch record an event on
      the copy's stream, and the allocator reuses the block only once it
      has completed, as for DataLoader(pin_memory=True) batches.
    - Nothing of CUDA is touched before the first batch: the stream, the
      device of the read thread (set explicitly) and the pinned blocks
      are made then, in the process that reads; a loader that did so and
      crossed a fork refuses in the child, in one line.
    - host_bytes counts the pinned blocks as torch's caching host
      allocator holds them (each rounded up to a power of two).
    """

    def __init__(self, device: Optional[torch.device], dtype: Optional[torch.dtype], pin_memory: bool) -> None:
        self.device, self.dtype, self.pin_memory = device, dtype, pin_memory
        self.cuda = device is not None and device.type == "cuda"
        self.reuse = not (pin_memory and not self.cuda)
        self.eager = not pin_memory  # (pinned blocks are made by the first batch, in the process that reads)
        self.stream: Any = None  # the side stream (made by the first batch)
        self._pid: Optional[int] = None  # the process that touched CUDA
        self._lock = threading.Lock()
        self._thread = threading.local()
        self.types: dict[str, torch.dtype] = {}  # name -> the tensor dtype a batch's array is viewed as

    def __str__(self) -> str:
        return "TorchDevice(%s, %s%s)" % (self.device or "host", self.dtype, ", pinned" if self.pin_memory else "")

    def __getstate__(self) -> dict[str, Any]:
        st = dict(self.__dict__)
        st["stream"], st["_pid"], st["_lock"], st["_thread"] = None, None, None, None
        return st

    def __setstate__(self, st: dict[str, Any]) -> None:
        self.__dict__.update(st)
        self._lock, self._thread = threading.Lock(), threading.local()

    def held(self, nbytes: int) -> int:
        if not self.pin_memory:
            return super().held(nbytes)
        return 1 << max(0, nbytes - 1).bit_length()  # (a block of torch's caching host allocator)

    def out_dtype(self, src: np.dtype, dtype: Any) -> np.dtype:
        if dtype is None or src.kind != "f":
            return src
        # numpy has no bfloat16: the buffer holds its bytes as int16 (torch
        # 1.x takes no uint16 array).
        return np.dtype(_NUMPY.get(dtype, "<i2"))

    def bind(self, src: dict[str, np.dtype], casting: list[str]) -> None:
        self.types = {n: self.dtype if n in casting else _tensor_type(d) for n, d in src.items()}  # type: ignore[misc]

    def enter(self) -> None:
        """CUDA, in this process and thread: refused in a child forked
        after the loader used it; the thread's device set explicitly; the
        side stream made once."""
        pid = os.getpid()
        with self._lock:
            if self._pid is None:
                if not torch.cuda.is_available():
                    raise ValueError("%s: CUDA is not available here (torch %s): give device=None and pin_memory=False, "
                                     "or run where a GPU and its driver are" % (
                                         "device %s" % self.device if self.cuda else "pin_memory=True", torch.__version__))
                self._pid = pid
            elif self._pid != pid:
                raise ValueError("this clipshard Loader used CUDA in process %d and crossed a fork into process %d, "
                                 "where CUDA cannot be used: make the Loader in the process that iterates it (or "
                                 "start workers with the 'spawn' method)" % (self._pid, pid))
            if self.cuda and self.stream is None:
                self.stream = torch.cuda.Stream(self.device)
        if self.cuda and getattr(self._thread, "device", None) != self.device:
            if self.device is not None and self.device.index is not None:
                torch.cuda.set_device(self.device)
            self._thread.device = self.device

    def alloc(self, nbytes: int) -> Any:
        if not self.pin_memory:
            return super().alloc(nbytes)
        self.enter()
        return torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=True).numpy()[:nbytes]

    def cast(self, name: str, dst: np.ndarray, src: np.ndarray) -> None:
        if not getattr(_here, "serial", False):
            _serial_here()
        torch.from_numpy(dst).view(self.types[name]).copy_(torch.from_numpy(src))

    def _tensor(self, name: str, a: np.ndarray) -> torch.Tensor:
        """Array a of a batch as a tensor: over the storage of its pinned
        block where it is one (so that torch's copies record their
        events on that block), else over a's memory."""
        root = a
        while isinstance(root.base, np.ndarray):
            root = root.base
        t = root.base
        if self.pin_memory and isinstance(t, torch.Tensor) and a.flags.c_contiguous:
            off = a.__array_interface__["data"][0] - t.data_ptr()
            if 0 <= off and off + a.nbytes <= t.numel():
                return t[off: off + a.nbytes].view(self.types[name]).view(a.shape)
        return torch.from_numpy(a).view(self.types[name])

    def finish(self, arrays: dict[str, np.ndarray], asm: Any) -> Any:
        used = asm.take_used()
        out = {n: self._tensor(n, a) for n, a in arrays.items()}
        if not self.cuda:
            if self.device is not None:
                out = {n: t.to(self.device) for n, t in out.items()}
            return out
        self.enter()
        dev = _OnDevice()
        with torch.cuda.stream(self.stream):
            for n, t in out.items():
                if n in HOST_ONLY:
                    dev[n] = t
                    continue
                d = t.to(self.device, non_blocking=True)
                if self.dtype is not None and t.dtype.is_floating_point and t.dtype != self.dtype:
                    d = d.to(self.dtype)
                dev[n] = d
            dev.done = torch.cuda.Event()
            dev.done.record(self.stream)
        # The host buffers are free once nothing refers to them and this
        # copy completed; the thread reads the next batch meanwhile.
        asm.hold([b for b in used if not _only_host(b, arrays)], dev.done)
        return dev

    def wrap(self, arrays: Any) -> Any:
        done = getattr(arrays, "done", None)
        if done is None:
            return arrays
        now = torch.cuda.current_stream(self.device)
        now.wait_event(done)  # (the consumer's work on the batch after its copy, on the device: no host wait)
        for n, t in arrays.items():
            if t.is_cuda:
                t.record_stream(now)  # allocated on the side stream, used on this one
        return dict(arrays)


class _OnDevice(dict):  # type: ignore[type-arg]
    """A batch on the device, and the event recorded after its copies."""
    done: Any = None


def _only_host(b: Any, arrays: dict[str, np.ndarray]) -> bool:
    """Whether buffer b holds an array that stays on the host (HOST_ONLY)."""
    for n in HOST_ONLY:
        a = arrays.get(n)
        while isinstance(a, np.ndarray):
            if a is b:
                return True
            a = a.base
    return False


_here = threading.local()


def _serial_here() -> None:
    """In one of the Loader's read threads (threads >= 2), torch's casts
    run on that thread alone: the read threads already share the cores
    among them, and each cast of a piece spread over torch's intra-op
    OpenMP threads as well put 2 x 2 threads on 2 cores (float32 torch,
    warm, 2 cores: 43-51k samples/s and 8.9-11.6 ms of CPU a batch,
    against 52-63k and 7.6-9.1 with OMP_NUM_THREADS=1, docs/BENCHMARKS.md).
    Only this thread's count is set (OpenMP's is per thread: the
    trainer's threads keep torch.get_num_threads()); after torch's own
    first setting of it in this thread, which it makes once a thread. The
    consumer's thread, and the Loader's one thread with threads=1, keep
    torch's setting. Without an OpenMP runtime in the process (another
    parallel backend), nothing is changed."""
    _here.serial = True
    if threading.current_thread().name.startswith("clipshard-read"):
        _one_thread()


def _one_thread() -> None:
    """This thread's torch casts on this thread alone (OpenMP's count is
    per thread; bench_peers.py's floor casts as the read threads do)."""
    f = _omp_set_num_threads()
    if f is not None and torch.get_num_threads() > 1:  # (torch's per-thread setting made first)
        f(1)


@functools.lru_cache(maxsize=None)
def _omp_set_num_threads() -> Optional[Callable[[int], None]]:
    """omp_set_num_threads of the OpenMP runtime torch loaded, or None."""
    if "OpenMP" not in torch.__config__.parallel_info().split("parallel backend:")[-1]:
        return None
    try:
        with open("/proc/self/maps") as m:
            paths = {p for p in (line.split()[-1] for line in m)
                     if os.path.basename(p).startswith(("libgomp", "libiomp5", "libomp"))}
    except OSError:
        return None
    own = os.path.dirname(os.path.abspath(torch.__file__))
    # (torch's own copy first, where it ships one: another library's
    # OpenMP runtime in the same process would take the count, not torch)
    for p in sorted(paths, key=lambda p: (not p.startswith(own + os.sep), p)):
        try:
            f = ctypes.CDLL(p).omp_set_num_threads
        except (OSError, AttributeError):
            continue
        f.argtypes, f.restype = [ctypes.c_int], None
        return f  # type: ignore[no-any-return]
    return None


_NUMPY = {torch.float16: "<f2", torch.float32: "<f4", torch.float64: "<f8"}


def _tensor_type(d: np.dtype) -> torch.dtype:
    if d.byteorder == ">":
        raise ValueError("shard dtype %s: big-endian, torch has no such tensors" % d.str)
    try:
        return torch.from_numpy(np.empty(0, dtype=d)).dtype
    except TypeError:
        raise ValueError("shard dtype %s: no torch dtype for it" % d.str) from None
