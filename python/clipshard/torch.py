"""clipshard epochs as a PyTorch IterableDataset (torch is imported only
here)."""
from __future__ import annotations

from typing import Any, Iterator, Mapping, Optional

import numpy as np
import torch
import torch.utils.data

from .epochs import EpochReader

__all__ = ["EpochDataset"]


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
    """

    def __init__(self, edir: str, epoch: int, rank: Optional[int] = None, world_size: Optional[int] = None,
                 batch_size: int = 256, **kw: Any) -> None:
        super().__init__()
        if world_size is None:
            dist = torch.distributed
            ok = dist.is_available() and dist.is_initialized()
            world_size = dist.get_world_size() if ok else 1
            rank = (dist.get_rank() if ok else 0) if rank is None else rank
        # (a world_size without a rank is refused by EpochReader)
        self.args = dict(edir=edir, epoch=epoch, rank=rank, world_size=world_size, batch_size=batch_size, **kw)
        self.reader = EpochReader(**self.args)  # checks the arguments now
        self.state: Optional[dict[str, Any]] = None
        self._yielded = False  # a batch was yielded in this process (num_workers=0)

    def __len__(self) -> int:
        return len(self.reader)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        r = EpochReader(**self.args)
        if self.state is not None:
            r.load_state_dict(self.state)
        for b in r.batches():
            out = {k: _tensor(v) for k, v in b.items()}
            out["consumed"] = torch.tensor(r.consumed, dtype=torch.int64)
            self.reader.consumed = r.consumed  # (num_workers=0: the same process)
            self._yielded = True
            yield out

    def state_dict(self, batch: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
        """The state after batch (the last one trained on), or, without it,
        after the last batch this process yielded (num_workers=0)."""
        st = self.reader.state_dict()
        if batch is not None:
            st["consumed"] = int(batch["consumed"])
        elif not self._yielded:
            # With DataLoader workers the batches are read in other
            # processes: this one cannot know how far they got.
            raise ValueError("state_dict() without a batch, and no batch was yielded in this process (DataLoader "
                             "workers read in other processes, or nothing was read yet): pass the last batch trained "
                             "on, state_dict(batch)")
        return st

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.reader.load_state_dict(state)
        self.state = dict(state)


def _tensor(a: np.ndarray) -> torch.Tensor:
    if not a.flags.writeable:  # a view of a memory-mapped shard: copied out
        a = np.array(a)
    return torch.from_numpy(a)
