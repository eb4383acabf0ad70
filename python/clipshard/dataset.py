"""Random access to a dataset written by `convert`."""
from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

import numpy as np

from ._segments import blob_entries, check_where
from ._files import MAX_MANIFEST, Npy, clip_starts, confined, dataset_modality, dataset_top, open_regular, pread_all, read_json
from ._labels import check_codes, modality_labels, pick_labels

__all__ = ["Dataset"]


class Dataset:
    """A converted dataset: ds[i] or ds["clip id"] is a dict of the clip's
    rows per modality (views of the memory-mapped blobs, no copy).

    ds.ids lists the clip ids in row order (read from clips.txt, without
    pyarrow); ds.index is int64 [N, 2] (start, length in clip frames); a
    sample's clip row in an epoch (samples[:, 0]) indexes both. A dataset
    in segments (format 2, convert --segments) reads the same: its
    where.npy (ds.where) says which blob of ds.segments holds each clip's
    rows.

        from clipshard import Dataset
        ds = Dataset("/data/ds")
        rows = ds["clip003"]            # {"whisper": float16 [2*T, 64], "motion": ...}
        ds.ids[:3], ds.index[:3]        # clip ids; (start, frames) per clip
        win = ds.window(batch["samples"][0])   # a sample's window, from the blobs
        ds.labels("speaker")[int(rows["speaker"])]   # convert --label speaker: the clip's label

    A label modality (convert --label NAME) holds an int32 code a clip;
    ds.labels(NAME) is its vocabulary (code i is labels[i]), checked at
    open: every clip's code names one of them.
    """

    def __init__(self, path: str) -> None:
        if not os.path.lexists(os.path.join(path, "dataset.json")) and os.path.lexists(os.path.join(path, "epochs.json")):
            raise ValueError("%s is an epochs folder (it holds epochs.json), not a dataset (no dataset.json): read it with "
                             "clipshard.Loader or EpochReader, or give Dataset the folder convert wrote" % path)
        man = read_json(os.path.join(path, "dataset.json"))
        files, mods, clips, frames = dataset_top(path, man, formats=(1, 2))
        self.dir, self.manifest = path, man
        idx = Npy(confined(path, files.get("index"), "files.index"))
        try:
            idx.expect("<i8", [clips, 2])
            self.index = idx.read()
        finally:
            idx.close()
        clip_starts(self.index, frames, idx.path)
        self.modalities: dict[str, Any] = {}  # name -> its entry of dataset.json
        self.blobs: dict[str, np.ndarray] = {}  # format 1: name -> its one blob
        self.segments: dict[str, list[np.ndarray]] = {}  # name -> its blobs (format 1: the one)
        self._rate: dict[str, int] = {}  # name -> rows a frame (0: one row a clip)
        self._k: dict[str, int] = {}  # name -> its column of where
        self._labels: dict[str, list[str]] = {}  # a label modality's name -> its vocabulary
        # Format 2 (convert --segments): where[clip, k] = (blob, first row).
        self.where: Optional[np.ndarray] = None
        if man["version"] == 2:
            w = Npy(confined(path, files.get("where"), "files.where"))
            try:
                w.expect("<i8", [clips, len(mods), 2])
                self.where = w.read()
            finally:
                w.close()
        for k, m in enumerate(mods):
            name, per, rate, frame = dataset_modality(path, m, self.modalities)
            blobs = blob_entries(path, name, m, self.where is not None)
            maps = []
            for b in blobs:
                rows = b["rows"] if self.where is not None else (clips if per else frames * rate)
                f = Npy(confined(path, b.get("file"), "modality %r file" % name))
                try:
                    f.expect(m.get("dtype"), [rows] + frame)
                    if f.offset != b.get("data_offset"):
                        raise ValueError("%s: data at offset %d, dataset.json says %r" % (f.path, f.offset, b.get("data_offset")))
                    maps.append(f.memmap())
                finally:
                    f.close()
            if self.where is not None:
                # Every clip's rows inside the blob where.npy names.
                n = np.ones(clips, np.int64) if per else self.index[:, 1] * rate
                check_where(w.path, name, self.where[:, k, 0], self.where[:, k, 1], n, np.array([len(x) for x in maps], np.int64))
            else:
                self.blobs[name] = maps[0]
            self.segments[name] = maps
            self.modalities[name], self._rate[name], self._k[name] = m, rate, k
            labels = modality_labels(path, "dataset.json", m)
            if labels is not None:
                self._labels[name] = labels
                if self.where is None:
                    codes = maps[0]
                else:
                    codes = np.empty(clips, np.int32)
                    for bi, blob in enumerate(maps):
                        on = self.where[:, k, 0] == bi
                        codes[on] = blob[self.where[on, k, 1]]
                check_codes(path, name, np.asarray(codes), labels)
        self.ids: Optional[list[str]] = None
        self._row: Optional[dict[str, int]] = None
        ids = files.get("ids")
        if ids:
            p = confined(path, ids, "files.ids")
            fd, st = open_regular(p)
            try:
                if st.st_size > MAX_MANIFEST:
                    raise ValueError("%s: %d bytes, more than a manifest may have" % (p, st.st_size))
                text = pread_all(fd, st.st_size, 0, p)
            finally:
                os.close(fd)
            try:
                self.ids = text.decode("utf-8").split("\n")[:-1]
            except UnicodeDecodeError as e:
                raise ValueError("%s: not UTF-8: %s" % (p, e)) from None
            if len(self.ids) != len(self.index):
                raise ValueError("%s: %d clip ids for %d clips" % (p, len(self.ids), len(self.index)))

    def __len__(self) -> int:
        return len(self.index)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Pickled (a DataLoader worker started by spawn or forkserver): the
        # other process maps the blobs again; pickling the maps would copy
        # the whole dataset into the pickle. A dataset.json changed since
        # this one was read is refused there.
        return (_dataset_again, (self.dir, self.manifest))

    def row(self, clip: Union[str, int]) -> int:
        """The row of clip id (a str) or row number (an int)."""
        if isinstance(clip, (int, np.integer)):
            if not -len(self) <= clip < len(self):
                raise IndexError("clip row %d of %d" % (clip, len(self)))
            return int(clip) % len(self)
        if self.ids is None:
            raise KeyError("%s has no clips.txt (made by an older convert): look clips up by row, or convert again" % self.dir)
        if self._row is None:
            self._row = {c: i for i, c in enumerate(self.ids)}
        return self._row[clip]

    def labels(self, name: str) -> list[str]:
        """Label modality name's vocabulary (convert --label NAME): the
        clip's code c in ds[clip][name] (and in every sample of its
        epochs) stands for labels(name)[c]."""
        return pick_labels(self._labels, name, self.dir)

    def _rows(self, name: str, clip: int, off: int, count: int) -> np.ndarray:
        """Clip row clip's rows of modality name: frames [off, off+count)
        of the clip (a per-clip modality: its value)."""
        rate = self._rate[name]
        if self.where is None:
            blob, first = self.segments[name][0], int(self.index[clip][0]) * rate if rate else clip
        else:
            b, first = self.where[clip, self._k[name]].tolist()
            blob = self.segments[name][b]
        if not rate:
            return blob[first]  # the clip's value, of frame_shape
        return blob[first + off * rate: first + (off + count) * rate]

    def __getitem__(self, clip: Union[str, int]) -> dict[str, np.ndarray]:
        """The clip's rows of each modality; a per-clip modality (convert's
        NAME@clip=) gives the clip's value (shape frame_shape)."""
        i = self.row(clip)
        length = int(self.index[i][1])
        return {name: self._rows(name, i, 0, length) for name in self.modalities}

    def window(self, sample: Sequence[int]) -> dict[str, np.ndarray]:
        """The dataset rows of an epoch sample (clip row, start, valid):
        what its shard windows hold before the zero padding (a per-clip
        modality: the clip's value)."""
        clip, start, valid = (int(x) for x in sample)
        return {name: self._rows(name, clip, start, valid) for name in self.modalities}

    def feature_stats(self, names: Optional[Sequence[str]] = None, chunk: int = 8 << 20) -> dict[str, dict[str, Any]]:
        """Per modality (names: those; None: all but labels), per feature "mean",
        "std", "min" and "max" (float64 arrays of frame_shape) over every
        row of every clip (a per-clip modality: each clip's value), and
        "rows", "nan", "inf": for normalisation. One pass over the blobs,
        chunk bytes at a time (each chunk's mean and squared deviations
        merged into the running ones: stable over billions of rows); NaN
        and Inf values are counted and left out of mean and std (Inf kept
        in min and max). The same figures as clipshard inspect --stats.

            st = ds.feature_stats(["w2v"])["w2v"]
            x = (x - st["mean"]) / st["std"]
        """
        out: dict[str, dict[str, Any]] = {}
        for name in [n for n in self.modalities if n not in self._labels] if names is None else names:
            if name not in self._rate:
                raise ValueError("names: %r is not a modality of %s (%s)" % (name, self.dir, ", ".join(self.modalities)))
            rate = self._rate[name]
            first = self._rows(name, 0, 0, 0) if len(self) else None
            shape = tuple(first.shape if not rate else first.shape[1:]) if first is not None else ()
            width = int(np.prod(shape)) if shape else 1
            n, mean, m2 = np.zeros(width), np.zeros(width), np.zeros(width)
            lo, hi = np.full(width, np.inf), np.full(width, -np.inf)
            seen = np.zeros(width, bool)
            counts = {"rows": 0, "nan": 0, "inf": 0}
            step = max(1, chunk // max(1, width * 8))
            for i in range(len(self)):
                length = int(self.index[i][1])
                rows = self._rows(name, i, 0, length).reshape(-1, width)
                for a in range(0, len(rows), step):
                    x = np.asarray(rows[a: a + step], dtype=np.float64)
                    counts["rows"] += len(x)
                    nan, inf = np.isnan(x), np.isinf(x)
                    counts["nan"] += int(nan.sum())
                    counts["inf"] += int(inf.sum())
                    ok = ~(nan | inf)
                    seen |= (~nan).any(axis=0)
                    with np.errstate(invalid="ignore"):
                        lo = np.minimum(lo, np.where(nan, np.inf, x).min(axis=0))
                        hi = np.maximum(hi, np.where(nan, -np.inf, x).max(axis=0))
                    c = ok.sum(axis=0).astype(np.float64)
                    xs = np.where(ok, x, 0.0)
                    mb = np.divide(xs.sum(axis=0), c, out=np.zeros(width), where=c > 0)
                    d2 = (np.where(ok, x - mb, 0.0) ** 2).sum(axis=0)
                    tot = n + c
                    d = mb - mean
                    w = np.divide(c, tot, out=np.zeros(width), where=tot > 0)
                    mean = mean + d * w
                    m2 = m2 + d2 + d * d * n * w
                    n = tot
            with np.errstate(invalid="ignore", divide="ignore"):
                res = {"mean": np.where(n > 0, mean, np.nan), "std": np.where(n > 0, np.sqrt(m2 / n), np.nan),
                       "min": np.where(seen, lo, np.nan), "max": np.where(seen, hi, np.nan)}
            got: dict[str, Any] = {k: v.reshape(shape) for k, v in res.items()}
            got.update(counts)
            out[name] = got
        return out


def _dataset_again(path: str, manifest: Any) -> Dataset:
    d = Dataset(path)
    if d.manifest != manifest:
        raise ValueError("%s: dataset.json changed since the Dataset was made in the process that pickled it (converted "
                         "again?): make it again" % path)
    return d
