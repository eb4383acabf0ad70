"""A dataset's modality in segments (format 2, convert --segments):
its blobs as dataset.json lists them, where.npy's rows of it checked
against them, and the map from the modality's logical rows (the clips
one after the other, as index.npy numbers them) to a blob and its rows
(Runs). A format 1 dataset's modality is one blob whose rows are the
logical rows: one run.
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

__all__ = ["Runs", "blob_entries", "check_where"]


def blob_entries(where: str, name: str, m: dict[str, Any], segmented: bool) -> list[dict[str, Any]]:
    """The blobs of modality m (its entry of dataset.json): format 2's
    "blobs", format 1's entry itself."""
    blobs = m.get("blobs") if segmented else [m]
    if not isinstance(blobs, list) or not blobs or not all(isinstance(b, dict) for b in blobs):
        raise ValueError("%s: dataset.json: modality %r: blobs %r: not what convert writes" % (where, name, blobs))
    for j, b in enumerate(blobs):
        if segmented and (type(b.get("rows")) is not int or b["rows"] < 0):
            raise ValueError("%s: dataset.json: modality %r blob %d: rows %r" % (where, name, j, b.get("rows")))
    return blobs


def check_where(path: str, name: str, blob: np.ndarray, first: np.ndarray, n: np.ndarray, sizes: np.ndarray) -> None:
    """Every clip's rows (first row `first`, `n` of them) inside the blob
    where.npy (path) names (blob: an index of sizes, each blob's rows)."""
    bad = (blob < 0) | (blob >= len(sizes)) | (first < 0)
    bad |= ~bad & (first > sizes[np.clip(blob, 0, len(sizes) - 1)] - n)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError("%s: clip row %d, modality %r: blob %d rows %d.. (%d rows): outside the modality's %d blobs "
                         "or that blob's rows" % (path, i, name, int(blob[i]), int(first[i]), int(n[i]), len(sizes)))


class Runs:
    """Where a modality's logical rows are: stretches (runs) of them that
    lie one after the other in one blob, in logical order: run i holds
    logical rows [lo[i], lo[i+1]) (the last: to rows) at blob[i]'s rows
    from at[i]. flat: one run, blob 0 from row 0 (format 1, or a
    modality whose rows never moved): logical row = the blob's row.

        r = Runs.of(n_rows, blob, first)   # per clip: where.npy's, and each clip's rows
        r.locate(np.array([10, 500]))      # (blob, row there) of logical rows
    """

    def __init__(self, lo: np.ndarray, blob: np.ndarray, at: np.ndarray, rows: int) -> None:
        self.lo, self.blob, self.at, self.rows = lo, blob, at, rows
        self.flat = len(lo) <= 1 and (not len(lo) or (int(blob[0]) == 0 and int(at[0]) == 0))

    @classmethod
    def one(cls, rows: int) -> "Runs":
        z = np.zeros(1, np.int64)
        return cls(z, z, z, rows)

    @classmethod
    def of(cls, n: np.ndarray, blob: np.ndarray, first: np.ndarray) -> "Runs":
        """The runs of clips of n rows each (logical order), clip i's at
        blob[i] from row first[i] (checked: check_where). Clips of no rows
        are in no run."""
        keep = n > 0
        lo = (np.cumsum(n) - n)[keep]
        n, blob, first = n[keep], blob[keep], first[keep]
        if not len(n):
            return cls.one(0)
        new = np.ones(len(n), bool)
        new[1:] = (blob[1:] != blob[:-1]) | (first[1:] != first[:-1] + n[:-1])
        k = np.flatnonzero(new)
        return cls(lo[k].astype(np.int64), blob[k].astype(np.int64), first[k].astype(np.int64), int(lo[-1] + n[-1]))

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(blob, its row) of each logical row (int64 arrays)."""
        if self.flat:
            return np.zeros(len(rows), np.int64), rows.astype(np.int64)
        r = np.searchsorted(self.lo, rows, side="right") - 1
        r = np.maximum(r, 0)
        return self.blob[r], self.at[r] + (rows - self.lo[r])

    def pieces(self, a: int, b: int) -> Iterator[tuple[int, int, int]]:
        """Logical rows [a, b) as (blob, first row there, rows), in order."""
        if self.flat:
            if b > a:
                yield 0, a, b - a
            return
        i = max(0, int(np.searchsorted(self.lo, a, side="right")) - 1)
        while a < b and i < len(self.lo):
            end = int(self.lo[i + 1]) if i + 1 < len(self.lo) else self.rows
            if end > a:
                stop = min(b, end)
                yield int(self.blob[i]), int(self.at[i]) + a - int(self.lo[i]), stop - a
                a = stop
            i += 1

    def assemble(self, blobs: list[np.ndarray], out: np.ndarray) -> None:
        """out[:rows] = the logical rows, copied from blobs."""
        ends = np.r_[self.lo[1:], self.rows].tolist()
        for lo, end, j, at in zip(self.lo.tolist(), ends, self.blob.tolist(), self.at.tolist()):
            out[lo:end] = blobs[j][at: at + end - lo]
