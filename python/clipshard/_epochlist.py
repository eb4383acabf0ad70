"""The training epochs a Loader reads, in order, and the reader of each:
an epochs folder's materialised epochs (read as they are, or replayed in a
seeded shard order), or epochs drawn at read time from datasets.

Every materialised epoch's reader is made (and so checked) when the list
is: a bad shard list or argument is an error then, not epochs later. A
drawn epoch's order is computed when it is first needed.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, Optional, Union

import numpy as np

from ._manifest import STATE_VERSION, check_datasets, check_state, epoch_identity, epoch_labels, load_epochs
from ._order import Stride
from ._prefetch import disk_steps, drawn_steps
from ._shards import open_epochs
from ._versions import pinned
from .draw import STATE_FORMAT as DRAWN_STATE, Drawn, DrawnReader
from .epochs import STATE_FORMAT as READER_STATE, EpochReader

__all__ = ["EpochList", "STATE_FORMAT"]

STATE_FORMAT = "clipshard.loader"


class EpochList:
    """The epochs of a Loader (see clipshard.Loader for the arguments):
    epochs[pos] is read by reader(pos), of len(pos) = (samples, batches
    from its start).

        el = EpochList("/data/epochs", range(10), replay_seed=7, rank=0, world_size=1, batch_size=256, remainder="drop")
        el.epochs, el.len(0), el.names
    """

    def __init__(self, edir: Optional[str], epochs: Union[int, Iterable[int], None], *, rank: Optional[int], world_size: int,
                 batch_size: int, remainder: str, replay_seed: Optional[int] = None, mix_shards: int = 1, mix_seed: int = 0,
                 mix_mem: Union[str, int, None] = None, cache_dir: Optional[str] = None,
                 cache_limit: Union[str, int, None] = None, dataset: Any = None, draw: Optional[Mapping[str, Any]] = None) -> None:
        draw = dict(draw or {})
        self.drawn: Optional[Drawn] = None
        self.remote: Any = None  # a bucket's entry in the node-local cache, shared by the readers
        if dataset is not None:
            _check_drawn_args(edir, dataset, epochs, replay_seed, mix_shards, mix_mem, draw)
            self.draw_args: dict[str, Any] = dict(dataset=dataset, cache_dir=cache_dir, cache_limit=cache_limit, **draw)
            self.drawn = Drawn(**self.draw_args)
            self.draw_args["version"] = self.drawn._made[1]["version"]  # (opened again after close(): the version read)
            self.manifest: dict[str, Any] = {"seed": self.drawn.seed}
            on_disk: list[int] = []
            edir = str(dataset)
        else:
            if edir is None:
                raise ValueError("give an epochs folder (edir), or dataset= to draw epochs from a dataset")
            if draw:
                raise ValueError("%s: unexpected arguments %s%s (window, seed, sampling, ... are for dataset=)" % (
                    edir, sorted(draw), _meant(draw)))
            local, self.remote = open_epochs(edir, cache_dir, cache_limit)
            self.manifest = load_epochs(local)
            check_datasets(self.manifest, edir)
            entries = self.manifest.get("epochs")
            if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
                raise ValueError("%s: epochs.json: 'epochs' is not a list of epochs" % edir)
            on_disk = sorted(e.get("epoch") for e in entries if isinstance(e.get("epoch"), int))
        self.dir = edir
        self.epochs = _epoch_list(on_disk if epochs is None else epochs)
        self.kw: dict[str, Any] = dict(rank=rank, world_size=world_size, batch_size=batch_size, remainder=remainder,
                                       mix_seed=mix_seed, prefetch=1, cache_dir=cache_dir, cache_limit=cache_limit)
        mixing: dict[str, Any] = {"mix_shards": mix_shards} if mix_mem is None else {"mix_mem": mix_mem}
        # Which epoch on disk each training epoch reads, and how.
        self.plans = [self._plan(e, on_disk, replay_seed, mixing) for e in self.epochs]
        self.lens: list[Optional[tuple[int, int]]] = [None] * len(self.plans)
        for pos in range(len(self.plans) if self.drawn is None else 0):
            self.len(pos)
        if not on_disk and self.drawn is None:
            raise ValueError("%s: no materialised epoch" % edir)
        self._first(on_disk)

    def _plan(self, e: int, on_disk: list[int], replay_seed: Optional[int], mixing: dict[str, Any]) -> dict[str, Any]:
        if self.drawn is not None or e in on_disk:
            return dict(epoch=e)  # (already shuffled whole: no replay order, no mixing)
        if replay_seed is None:
            raise ValueError("%s: epoch %d is not materialised (have %s): give replay_seed to replay one" % (self.dir, e, on_disk))
        if not on_disk:
            raise ValueError("%s: no materialised epoch to replay" % self.dir)
        return dict(epoch=on_disk[e % len(on_disk)], replay_seed=replay_seed, virtual_epoch=e, **mixing)

    def _first(self, on_disk: list[int]) -> None:
        """What every epoch's batches share, from the first's reader (a
        drawn list's: its arguments checked, no order computed)."""
        kw = self.kw
        if self.drawn is not None:
            first: Any = DrawnReader.__new__(DrawnReader)
            DrawnReader._check_args(first, kw["rank"], kw["world_size"], kw["batch_size"], kw["remainder"])
            first.names, first.sources, first.mixed = self.drawn.modalities + ["samples"], self.drawn.names, self.drawn.mixed
            self.expect = {n: (d, s) for n, (d, s) in self.drawn.shapes().items()}
            self.labels: dict[str, list[str]] = self.drawn.labels
        else:
            self.labels = epoch_labels(self.dir, self.manifest)
            first = self._reader(self.plans[0] if self.plans else dict(epoch=on_disk[0]))
            self.expect = first.expect
            first.close()
        self.rank, self.world_size, self.batch_size, self.remainder = first.rank, first.world_size, first.batch_size, first.remainder
        self.names: list[str] = first.names
        self.sources: list[str] = first.sources  # what a batch's "source" numbers name (mixed epochs)
        self.mixed: bool = first.mixed

    def __len__(self) -> int:
        return len(self.epochs)

    def reader(self, pos: int) -> Any:
        """A new reader of epoch pos (an EpochReader, or a DrawnReader),
        from its start."""
        return self._reader(self.plans[pos])

    def _reader(self, plan: Mapping[str, Any]) -> Any:
        if self.drawn is None:
            # (a bucket's readers share the loader's connection and cache entry)
            return EpochReader(self.dir, **plan, **self.kw, _manifest=self.manifest, _remote=self.remote)
        if self.drawn.closed:  # (closed by close(): opened and checked again)
            again = Drawn(**self.draw_args)
            if again.identity != self.drawn.identity:
                again.close()
                raise ValueError("%s: the datasets changed since this loader was made (converted again?): make the "
                                 "loader again" % self.dir)
            self.drawn = again
        kw = self.kw
        return DrawnReader(self.drawn, plan["epoch"], rank=kw["rank"], world_size=kw["world_size"],
                           batch_size=kw["batch_size"], remainder=kw["remainder"])

    def len(self, pos: int) -> tuple[int, int]:
        """(samples, batches) of epoch pos, read from its start."""
        got = self.lens[pos]
        if got is None:
            r = self.reader(pos)
            got = self.lens[pos] = (r.samples, r.batches_left())
            r.close()
        return got

    def steps(self, pos: int, start: Any, ahead: bool) -> Iterator[Any]:
        """The steps of epoch pos from start (_prefetch); ahead: the next
        epoch's drawn order computed in the background near the end."""
        r = self.reader(pos)
        if self.drawn is None:
            return disk_steps(r, start)
        nxt = self.plans[pos + 1]["epoch"] if ahead and pos + 1 < len(self.plans) else None
        return drawn_steps(r, start, nxt)

    def identity(self, pos: int) -> str:
        """What identifies the epoch on disk epoch pos reads (its
        epoch_identity: a state carries it)."""
        return epoch_identity(self.manifest, self.plans[pos]["epoch"])

    # -- where a loader is in the list, as a state --------------------------
    # (pos: the epoch read next, len(self) once all are done; start: its
    # resume point, a drawn epoch's 0 or (the intervals left, done);
    # handed: (consumed, last) of the last batch handed out, or None)

    def left(self, pos: int, start: Any) -> int:
        """Batches of this rank left of epoch pos from start."""
        if pos >= len(self.epochs):
            return 0
        if self.drawn is not None:
            if start == 0:
                return self.len(pos)[1]
            r = self.reader(pos)
            r._resume(*start)
            return r.batches_left()
        return Stride(self.len(pos)[0], self.rank, self.world_size, self.batch_size, self.remainder).left(start)

    def state(self, at: int, start: Any, handed: Optional[tuple[Any, bool]]) -> dict[str, Any]:
        """The state of a loader at epoch position at (see Loader.state_dict)."""
        if self.drawn is not None:
            return self._drawn_state(at, start, handed)
        if at >= len(self.epochs):
            pos, consumed, done = len(self.epochs) - 1, self.len(len(self.epochs) - 1)[0] if self.epochs else 0, True
        elif handed is not None:
            pos, (consumed, done) = at, handed
        else:
            pos, consumed, done = at, start, self.left(at, start) == 0 and start > 0
        plan = self.plans[pos] if self.plans else {}
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "epoch": self.epochs[pos] if self.epochs else None,
                "source_epoch": plan.get("epoch"), "replay_seed": plan.get("replay_seed"),
                "seed": self.manifest.get("seed"), "samples": self.len(pos)[0] if self.lens else 0,
                "consumed": int(consumed), "done": bool(done), "epoch_id": self.identity(pos) if plan else ""}

    def resume(self, state: Mapping[str, Any]) -> tuple[int, Any]:
        """(epoch position, resume point) of state, checked against this
        list (see Loader.load_state_dict)."""
        fmt = state.get("format") if isinstance(state, Mapping) else None
        if self.drawn is not None or fmt == DRAWN_STATE:
            return self._resume_drawn(state)
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
        plan = self.plans[pos]
        for k, mine in (("seed", self.manifest.get("seed")), ("samples", self.len(pos)[0])):
            if state.get(k) != mine:
                raise ValueError("state of epoch %r has %s %r, this loader's is %r (another epochs folder?)" % (
                    e, k, state.get(k), mine))
        if state.get("source_epoch") != plan["epoch"]:
            raise ValueError("state of epoch %r read epoch %r on disk, this loader reads %r" % (
                e, state.get("source_epoch"), plan["epoch"]))
        if fmt == STATE_FORMAT and state.get("replay_seed") != plan.get("replay_seed"):
            raise ValueError("state of epoch %r replayed with seed %r, this loader's is %r" % (
                e, state.get("replay_seed"), plan.get("replay_seed")))
        if state["version"] >= 2 and state.get("epoch_id") != self.identity(pos):
            raise ValueError("state of epoch %r is of another version of it (epoch_id %r, this folder's %r: other "
                             "weights, sources or options)" % (e, state.get("epoch_id"), self.identity(pos)))
        if c < 0:
            raise ValueError("state consumed %r: want an int >= 0" % (c,))
        samples = self.len(pos)[0]
        # A padded epoch's last batch counts past the end; a done epoch
        # has nothing left, whatever the new world size and batch size.
        return pos, samples if state.get("done") else min(c, samples)

    def _drawn_state(self, at: int, start: Any, handed: Optional[tuple[Any, bool]]) -> dict[str, Any]:
        assert self.drawn is not None
        if not self.epochs:
            raise ValueError("no epochs")
        if at >= len(self.epochs):
            pos, rem, done = len(self.epochs) - 1, [], True
        elif handed is not None:
            pos, (rem, done) = at, handed[0]
        elif start == 0:
            n = self.len(at)[0]
            pos, rem, done = at, [(0, n)] if n else [], False
        else:
            pos, (rem, done) = at, start
        return {"format": DRAWN_STATE, "version": 1, "epoch": self.epochs[pos], "id": self.drawn.identity,
                "samples": self.len(pos)[0], "remaining": [[int(a), int(b)] for a, b in rem], "done": bool(done),
                "versions": dict(self.drawn.versions)}

    def _resume_drawn(self, state: Mapping[str, Any]) -> tuple[int, Any]:
        if self.drawn is None:
            raise ValueError("a state of epochs drawn from a dataset, loaded into a loader of an epochs folder")
        if not isinstance(state, Mapping) or state.get("format") != DRAWN_STATE:
            raise ValueError("not a state of drawn epochs (%r): this loader draws its epochs from %s" % (
                state.get("format") if isinstance(state, Mapping) else state, self.dir))
        e = state.get("epoch")
        if type(e) is not int or e not in self.epochs:
            raise ValueError("state is of epoch %r, not one of this loader's epochs %s" % (e, self.epochs))
        pos = self.epochs.index(e)
        # (a state of another dataset version: that version read from now on)
        self.drawn, self.draw_args = pinned(self.drawn, self.draw_args, state.get("versions"), state.get("id"))
        r = self.reader(pos)
        r.load_state_dict(state)  # (checks the identity, the size and the intervals)
        fresh = r.remaining == ([(0, r.samples)] if r.samples else []) and not r.done
        return pos, 0 if fresh else (r.remaining, r.done)

    def close(self) -> None:
        if self.drawn is not None:
            self.drawn.close()  # (its datasets' files: opened and checked again by the next reader)


def _check_drawn_args(edir: Optional[str], dataset: Any, epochs: Any, replay_seed: Optional[int], mix_shards: int,
                      mix_mem: Any, draw: Mapping[str, Any]) -> None:
    if edir is not None:
        raise ValueError("edir %r and dataset %r: give one (an epochs folder, or a dataset to draw epochs from)" % (edir, dataset))
    if replay_seed is not None or mix_shards != 1 or mix_mem is not None:
        raise ValueError("replay_seed, mix_shards and mix_mem replay materialised epochs; epochs drawn from a dataset "
                         "are fresh every epoch")
    if epochs is None:
        raise ValueError("epochs: give the epochs to draw from %s (e.g. epochs=range(10))" % (dataset,))
    unknown = sorted(set(draw) - set(_keywords(Drawn)))
    if unknown:
        raise ValueError("unexpected arguments %s%s (a Loader's: %s; of epochs drawn from a dataset: %s)" % (
            unknown, _meant(unknown), ", ".join(_keywords(loader_class())), ", ".join(_keywords(Drawn))))
    if "window" not in draw:
        raise ValueError("window: give the frames of each window to draw from %s" % (dataset,))


def _keywords(f: Any) -> list[str]:
    """The keyword arguments of f (a class: its __init__'s), public ones."""
    import inspect
    params = inspect.signature(f).parameters.values()
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and not p.name.startswith("_")
            and p.name not in ("self", "dataset")]


def loader_class() -> Any:
    from .loader import Loader
    return Loader


def check_keywords(given: Any, *fs: Any) -> None:
    """Refuse keywords that none of fs takes with one ValueError naming
    the keyword meant (a misspelt batchsize= was a TypeError of a class
    the user never called)."""
    known = [k for f in fs for k in _keywords(f)]
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError("unexpected arguments %s%s (known: %s)" % (unknown, _meant(unknown, known), ", ".join(known)))


def _meant(names: Any, known: Optional[list[str]] = None) -> str:
    """", did you mean ...?" for misspelt keywords (batchsize=)."""
    import difflib
    known = known or _keywords(loader_class()) + _keywords(Drawn) + ["dataset"]
    got = []
    for n in sorted(names):
        close = difflib.get_close_matches(n, known, n=1, cutoff=0.7)
        if close:
            got.append("%s=, not %s=" % (close[0], n))
    return ": did you mean %s?" % ", ".join(got) if got else ""


def _epoch_list(epochs: Any) -> list[int]:
    """epochs (an int, or an iterable of ints) as a list, checked."""
    if isinstance(epochs, (int, np.integer)):
        epochs = [int(epochs)]
    try:
        out = [int(e) for e in epochs]
    except (TypeError, ValueError):
        raise ValueError("epochs %r: want an int or an iterable of ints" % (epochs,)) from None
    if any(e < 0 for e in out) or len(set(out)) != len(out):
        raise ValueError("epochs %r: want distinct ints >= 0" % (out,))
    return out
