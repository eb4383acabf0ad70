"""Read clipshard epoch shards with numpy alone.

    from clipshard_reader import EpochShards
    shards = EpochShards("/data/epochs", epoch=3, rank=rank)
    for batch in shards.batches(256):
        batch["whisper"]   # float16 [B, W*rate, 64]
        batch["samples"]   # int64 [B, 3]: clip, start, valid

Shard files are memory-mapped and read strictly in order, so each batch is
one sequential read. `replay_seed` reuses one materialised epoch for later
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

    def batches(self, batch_size, drop_last=False):
        """Yield dicts of numpy arrays, batch_size samples each, in order."""
        pending, have = [], 0
        for shard in self.shards:
            arrays = self._open(shard)
            n, i = shard["samples"], 0
            while i < n:
                take = min(batch_size - have, n - i)
                pending.append({k: v[i : i + take] for k, v in arrays.items()})
                have += take
                i += take
                if have == batch_size:
                    yield _join(pending)
                    pending, have = [], 0
        if pending and not drop_last:
            yield _join(pending)


def _join(parts):
    # One part: views of the memory-mapped shard (no copy; the consumer's
    # copy, e.g. into pinned memory, is the one sequential read). Several:
    # a batch that spans shards is concatenated.
    if len(parts) == 1:
        return dict(parts[0])
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
