"""How well an order of samples is shuffled, measured (the same figures
as `shuffle --json` reports per epoch).

samples: int64 [n, 3] (clip row, start, valid) in the order they are read.
"""
from __future__ import annotations

from typing import Any, Union

import numpy as np

__all__ = ["measure"]


def measure(samples: Any, batch_size: int) -> dict[str, Union[int, float]]:
    """A dict of:
    distinct_clips_mean / _min: distinct clips in each batch of batch_size
        consecutive samples (whole batches only);
    same_clip_neighbours: the share of neighbouring samples from one clip;
    mean_displacement: mean |position - position in clip order| over n
        (clip order: by clip, then start; about 1/3 for a uniform shuffle);
    spearman: Spearman's rank correlation of position and clip order
        (about 0 for a uniform shuffle, 1 for clip order).

        from clipshard import EpochReader, quality
        r = EpochReader("/data/epochs", epoch=0, batch_size=256)
        order = np.concatenate([b["samples"] for b in r])
        q = quality.measure(order, 256)
        q["distinct_clips_mean"], q["spearman"]   # e.g. 250.3, 0.002
    """
    s = np.asarray(samples)
    n = len(s)
    out: dict[str, Union[int, float]] = {"samples": n, "batch": batch_size}
    if n == 0:
        return out
    clips = s[:, 0]
    whole = n // batch_size * batch_size
    if whole:
        b = np.sort(clips[:whole].reshape(-1, batch_size), axis=1)
        distinct = 1 + (b[:, 1:] != b[:, :-1]).sum(axis=1)
        out["distinct_clips_mean"] = float(distinct.mean())
        out["distinct_clips_min"] = int(distinct.min())
    out["same_clip_neighbours"] = float((clips[1:] == clips[:-1]).mean()) if n > 1 else 0.0
    rank = np.empty(n, dtype=np.int64)
    rank[np.lexsort((s[:, 1], clips))] = np.arange(n)
    pos = np.arange(n)
    out["mean_displacement"] = float(np.abs(pos - rank).mean() / n)
    if n > 1:
        d = (pos - rank).astype(np.float64)
        out["spearman"] = float(1 - 6 * (d * d).sum() / (n * (n * n - 1.0)))
    return out
