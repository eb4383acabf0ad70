"""The read-ahead stage of a Loader: a thread that reads the next
batches of this rank (epoch after epoch) into a queue of `prefetch`, and
the steps of each epoch it reads (an epochs folder's, or a drawn
epoch's), each a batch's fill of the loader's Assembly.

The thread holds the loader only while it reads a batch: a loader its
user let go of is collected, and its thread stops.
"""
from __future__ import annotations

import functools
import queue
import threading
import weakref
from typing import Any, Callable, Generator, Iterator, Optional

from ._labels import check_codes

__all__ = ["Batch", "END", "Failed", "Run", "produce", "disk_steps", "drawn_steps"]

END = object()  # the end of an epoch in the queue

# One batch to read: (g, batches of the epoch, fill(assembly) -> arrays, what is consumed once it is)
Step = tuple[int, int, Callable[[Any], Any], Any]


class Batch:
    """What the thread hands over: one batch of one epoch."""

    __slots__ = ("pos", "g", "arrays", "consumed", "last")

    def __init__(self, pos: int, g: int, arrays: Any, consumed: Any, last: bool) -> None:
        self.pos, self.g, self.arrays, self.consumed, self.last = pos, g, arrays, consumed, last


class Failed:
    """An error of the thread, raised again in the consumer."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def disk_steps(r: Any, start: int) -> Iterator[Step]:
    """The batches of an EpochReader r from position start: each asks the
    kernel for the next one while it is read (the disk works on it
    meanwhile), and a bucket's source for the rows of the 4 after it."""
    try:
        r.load_state_dict(dict(r.state_dict(), consumed=start))
        n, s = r.batches_left(), r.stride
        for g in range(n):
            lo = s.first(r.start, g)
            if g + 1 < n:
                nxt = s.first(r.start, g + 1)
                r.files.advise(nxt, nxt + r.batch_size, probe=True)
            ahead = [s.first(r.start, g + h) for h in range(1, 5) if g + h < n]
            yield g, n, functools.partial(_read, r, lo, s.end(lo), ahead), s.consumed(r.start, g)
    finally:
        r.close()


def drawn_steps(r: Any, start: Any, next_epoch: Optional[int]) -> Iterator[Step]:
    """The batches of a DrawnReader r from start (0, or (the intervals
    left, done)); the order of next_epoch computed in the background as
    the last two are read."""
    try:
        r.plan.check_current()  # (a dataset converted again since: refused, not read in two versions)
        if start != 0:
            r._resume(*start)
        n = r.batches_left()
        for g in range(n):
            if g == max(0, n - 2) and next_epoch is not None:
                r.order_ahead(next_epoch)
            yield g, n, functools.partial(_read_drawn, r, g), r.remaining_after(g + 1)
    finally:
        r.close()


def _read(r: Any, lo: int, hi: int, ahead: list[int], asm: Any) -> Any:
    return asm.read(r, lo, hi, ahead)


def _read_drawn(r: Any, g: int, asm: Any) -> Any:
    return asm.read_drawn(r, g)


def produce(ref: "weakref.ref[Any]", pos: int, start: Any, stop: Optional[threading.Event]) -> Generator[Any, None, None]:
    """The batches from epoch pos at start on, then (with stop: the
    thread's) the following epochs' from their beginnings, each epoch
    ended by END. The loader (ref) is held only while a batch is read."""
    steps = None
    try:
        while True:
            loader = ref()
            if loader is None or pos >= len(loader.epochs):
                return
            steps = loader.list.steps(pos, start, stop is not None)
            del loader
            for g, n, fill, consumed in steps:
                loader = ref()
                if loader is None or (stop is not None and stop.is_set()):
                    return
                asm = loader.assembly
                host = fill(asm)
                if loader.list.drawn is None:  # (epochs' shards; drawn codes are the held rows, checked at open)
                    for name, labels in loader.list.labels.items():  # (a code of -1 would name the last label)
                        check_codes(loader.dir, name, host[name], labels, "batch %d's sample" % g)
                arrays = loader.dev.finish(host, asm)
                del loader, asm
                yield Batch(pos, g, arrays, consumed, g + 1 == n)
            steps = None
            yield END
            if stop is None:
                return  # (prefetch=0: one epoch at a time)
            pos, start = pos + 1, 0
    finally:
        if steps is not None:
            steps.close()  # (its reader's files close)


class Run:
    """The read-ahead thread of one stretch of epochs, and its queue."""

    def __init__(self, loader: Any, pos: int, start: int) -> None:
        self.q: queue.Queue[Any] = queue.Queue(maxsize=loader.prefetch)
        self.halt = threading.Event()
        self.next = (pos, start)  # where the first batch not yet taken is
        self.done = False
        self.thread = threading.Thread(target=self._work, args=(weakref.ref(loader), pos, start), daemon=True,
                                       name="clipshard-loader")
        self.thread.start()

    def _work(self, ref: "weakref.ref[Any]", pos: int, start: int) -> None:
        loader = ref()
        if loader is None:
            return
        loader.assembly.open_threads()
        pool = loader.assembly.executor
        del loader  # (the thread does not keep the loader alive)
        gen = produce(ref, pos, start, self.halt)
        try:
            for item in gen:
                if not self._put(item):
                    return
        except BaseException as e:  # everything reaches the consumer
            self._put(Failed(e))
        finally:
            gen.close()  # its reader's files close
            loader = ref()
            if loader is not None and loader.assembly.executor is pool:
                loader.assembly.executor = None
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
            if item is END:
                self.next = (pos + 1, 0)
                return
            if isinstance(item, Failed):
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
