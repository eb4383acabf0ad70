"""The source stage of epochs drawn at read time: a dataset read by
blocks (Source: dataset.json, index.npy and every blob's header checked,
the small modalities held in memory and checked against SHA256SUMS, the
streamed blobs' fds kept, or mapped, for the block reads), on disk or in
a bucket through a node-local cache entry.
"""
from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING, Any, Mapping, Optional

import numpy as np

from . import _remote
from ._segments import Runs, blob_entries, check_where
from ._versions import check_current, kept, open_version
from ._files import MAX_MANIFEST, Npy, clip_starts, confined, dataset_modality, dataset_top, open_regular, pread_all
from ._labels import modality_labels

if TYPE_CHECKING:
    from .draw import Drawn

__all__ = ["Source"]

READ = 8 << 20  # bytes of the widest modality a block holds at most with block="auto"
MIN_READ = 256 << 10  # and at least (a read the disk, the network or the bucket does well)
CLIPS = 2048  # blocks a group holds with block="auto", within those bounds


class Source:
    """A dataset read by blocks: checked (dataset.json, index.npy, every
    blob's header), its small modalities held in memory (checked against
    SHA256SUMS), its fds kept for the block reads. A bucket's (s3://) is
    read through a node-local cache entry."""

    def __init__(self, i: int, name: str, where: str, plan: "Drawn", version: Optional[int] = None) -> None:
        self.i, self.name, self.url = i, name, where
        self.remote: Any = None
        path = where
        if _remote.is_url(where):
            self.remote = _remote.Remote(where, plan.cache_dir, plan.cache_limit, manifest="dataset.json", version=version)
            path = self.remote.root
        elif plan.cache_dir is not None or plan.cache_limit is not None:
            raise ValueError("%s: cache_dir and cache_limit are for a bucket (s3://...); a folder is read as it is" % where)
        self.dir = path
        if not os.path.lexists(os.path.join(path, "dataset.json")) and os.path.lexists(os.path.join(path, "epochs.json")):
            raise ValueError("%s is an epochs folder (it holds epochs.json), not a dataset: give Loader(edir) the epochs "
                             "folder, or Loader(dataset=...) the folder convert wrote" % where)
        self.sha, self.manifest_rel = "", "dataset.json"  # (of the version read: open_version)
        self.version: Optional[int] = None
        man = open_version(self, version)
        files, mods, clips, frames = dataset_top(where, man, formats=(1, 2))
        self.clips, self.frames = clips, frames
        segmented = man["version"] == 2
        if self.remote is not None:
            self._room(files, mods)
        self.sums = self._sums(files.get("sha256sums"))
        rel = files.get("index")
        idx = self._open(rel, "files.index")
        try:
            idx.expect("<i8", [clips, 2])
            index = self._whole(idx, str(rel))
        finally:
            idx.close()
        self.starts, self.lengths = clip_starts(index, frames, idx.path)
        # The modalities: (name, dtype, frame shape, rate, per_clip), each
        # blob's header checked, where their rows are (format 2: where.npy,
        # checked against the blobs); the small ones read whole.
        self.mods: list[dict[str, Any]] = []
        self.files: dict[str, list[Npy]] = {}  # name -> its blobs (format 1: the one)
        self.held: dict[str, np.ndarray] = {}  # name -> rows in clip order (and a zero row past the end)
        self.maps: dict[str, list[np.ndarray]] = {}  # name -> its blobs' rows mapped, uint8 [rows, row bytes] (read=False)
        hold = plan.hold
        try:
            at = self._where(files.get("where"), clips, len(mods)) if segmented else None
            for k, m in enumerate(mods):
                self.mods.append(self._modality(k, m, at, hold))
            if all(r["per_clip"] for r in self.mods):
                raise ValueError("%s: every modality is per clip: no frames to cut windows from" % where)
            for rec in self.mods:
                if rec["held"]:
                    self.held[rec["name"]] = self._held(rec)
        except BaseException:
            self.close()
            raise
        self.block_frames, self.group_blocks = self._geometry(plan, frames)
        self.blocks = -(-frames // self.block_frames) if frames else 0

    def _modality(self, k: int, m: Any, at: Optional[tuple[np.ndarray, str]], hold: int) -> dict[str, Any]:
        """Modality k's record (m: its entry of dataset.json): its blobs
        opened and their headers checked, where its rows are (format 2:
        at, where.npy and its path; checked against the blobs), whether
        it is held."""
        name, per, rate, frame = dataset_modality(self.url, m, self.files, ("samples",))
        try:
            dtype = np.dtype(m.get("dtype"))
        except (TypeError, ValueError) as e:
            raise ValueError("%s: dataset.json: modality %r: dtype: %s" % (self.url, name, e)) from None
        clips = self.clips
        rows = clips if per else self.frames * rate
        blobs = blob_entries(self.url, name, m, at is not None)
        fs: list[Npy] = []
        self.files[name] = fs
        for b in blobs:
            f = self._open(b.get("file"), "modality %r file" % name)
            fs.append(f)
            f.expect(m.get("dtype"), [b["rows"] if at is not None else rows] + frame)
            if f.offset != b.get("data_offset"):
                raise ValueError("%s: data at offset %d, dataset.json says %r" % (f.path, f.offset, b.get("data_offset")))
        if dtype.byteorder == ">":
            raise ValueError("%s: dtype %s: big-endian (convert writes little-endian)" % (fs[0].path, dtype.str))
        runs = Runs.one(rows)
        if at is not None:
            n = np.ones(clips, np.int64) if per else self.lengths * rate
            check_where(at[1], name, at[0][:, k, 0], at[0][:, k, 1], n, np.array([f.shape[0] for f in fs], np.int64))
            runs = Runs.of(n, at[0][:, k, 0], at[0][:, k, 1])
        row = fs[0].row
        rec = dict(name=name, dtype=dtype.str, frame=tuple(frame), rate=rate, per_clip=per, file=blobs[0].get("file"),
                   files=[b.get("file") for b in blobs], sha256=[b.get("sha256") if at is not None else None for b in blobs],
                   row=row, frame_bytes=row * max(rate, 1), runs=runs, rows=rows,
                   labels=modality_labels(self.url, "dataset.json", m))
        # (held or streamed by the version's bytes, as its one-segment twin: the same blocks, the same order)
        rec["held"] = per or rows * row <= hold
        if not per and row == 0:
            raise ValueError("%s: modality %r: frame shape %s holds no values (windows of nothing; not a file "
                             "convert wrote)" % (fs[0].path, name, frame))
        return rec

    def _where(self, rel: Any, clips: int, mods: int) -> tuple[np.ndarray, str]:
        """where.npy (format 2): [clips, modalities, 2] (blob, first row)."""
        w = self._open(rel, "files.where")
        try:
            w.expect("<i8", [clips, mods, 2])
            return self._whole(w, str(rel)), w.path
        finally:
            w.close()

    def _held(self, rec: dict[str, Any]) -> np.ndarray:
        """A held modality's rows in clip order (each blob read whole and
        checked), and a zero row past them."""
        fs = self.files[rec["name"]]
        arrs = [self._whole(f, rel, sha) for f, rel, sha in zip(fs, rec["files"], rec["sha256"])]
        runs, a = rec["runs"], arrs[0]
        out = np.zeros((rec["rows"] + 1,) + a.shape[1:], dtype=a.dtype)
        if runs.flat:
            out[: rec["rows"]] = a[: rec["rows"]]
        else:
            runs.assemble(arrs, out)
        return out

    def _geometry(self, plan: "Drawn", frames: int) -> tuple[int, int]:
        """(frames per block, blocks per group) (FORMAT.md)."""
        streamed = [r["frame_bytes"] for r in self.mods if not r["held"]]
        if not streamed:
            return max(1, frames), 1  # everything held: one block
        per_frame, widest = sum(streamed), max(streamed)
        group_frames = plan.buffer // 2 // per_frame
        if plan.block is None:  # "auto": many blocks a group, reads of at most READ bytes, a window at least
            bf = max(plan.window, min(-(-READ // widest), max(-(-MIN_READ // widest), group_frames // CLIPS)))
        else:
            bf = -(-plan.block // widest)
        bf = max(1, bf)
        return bf, plan.group if plan.group else max(1, group_frames // bf)

    # -- checked reading of the dataset's files ----------------------------

    def _room(self, files: Mapping[str, Any], mods: list[Any]) -> None:
        """A bucket's dataset: its files are kept in the cache while epochs
        are drawn (published as read: never evicted), so the cache must
        hold them all."""
        rels = [r for r in (files.get("index"), files.get("ids")) if isinstance(r, str)]
        rels += [str(m["file"]) for m in mods if isinstance(m, dict) and isinstance(m.get("file"), str)]
        rels += [str(b["file"]) for m in mods if isinstance(m, dict) and isinstance(m.get("blobs"), list)
                 for b in m["blobs"] if isinstance(b, dict) and isinstance(b.get("file"), str)]
        rels += [r for r in (files.get("where"),) if isinstance(r, str)]
        for r in rels:
            self._path(r, "file")
        need = self.remote.manifest_bytes + sum(_remote.blocks(self.remote.listing.object(r)[0]) for r in rels)
        if self.remote.cache.limit < need:
            raise ValueError("cache_limit %d bytes cannot hold %s's files (%d bytes with the manifests): epochs drawn from a "
                             "bucket keep the dataset's blocks in the node-local cache as they are read (none is evicted "
                             "while epochs are drawn): give cache_limit >= %d" % (self.remote.cache.limit, self.url, need, need))
        self.remote.at(rels, [])

    def _path(self, rel: Any, what: str) -> str:
        """The path of the dataset's file rel (a bucket's: of its cache
        entry, whose names are by content), confined to the folder."""
        p = confined(self.dir, rel, what)
        if self.remote is not None and self.remote.entry.mapping is not None:
            p = confined(self.dir, self.remote.entry.mapping(rel), what)
        return p

    def _bytes(self, rel: str) -> bytes:
        if self.remote is not None:
            self.remote.ensure(rel)
        p = self._path(rel, rel)
        fd, st = open_regular(p)
        try:
            if st.st_size > MAX_MANIFEST:
                raise ValueError("%s: %d bytes, more than a manifest may have" % (p, st.st_size))
            return pread_all(fd, st.st_size, 0, p)
        finally:
            os.close(fd)

    def _sums(self, rel: Any) -> dict[str, str]:
        if not rel:
            return {}
        out = {}
        for line in self._bytes(rel).decode("utf-8", "replace").splitlines():
            h, _, n = line.partition("  ")
            if len(h) == 64 and n:
                out[n] = h
        return out

    def _open(self, rel: Any, what: str) -> Npy:
        p = self._path(rel, what)
        if self.remote is not None:
            self.remote.ensure_head(rel)
        return Npy(p)

    def _whole(self, f: Npy, rel: str, want: Optional[str] = None) -> np.ndarray:
        """f's whole array, read once (a bucket's: fetched, checked), and
        checked against its sha256 (want: format 2's blob entry), or
        SHA256SUMS when the dataset lists it."""
        if self.remote is not None:
            self.remote.ensure_range(rel, 0, None)
        b = pread_all(f.fd, f.size, 0, f.path)
        if len(b) != f.size:
            raise ValueError("%s: shorter than when it was checked" % f.path)
        what = "dataset.json's sha256 of it" if want else "the dataset's SHA256SUMS"
        want = want or self.sums.get(rel)
        if want is not None and hashlib.sha256(b).hexdigest() != want:
            raise ValueError("%s: sha256 %s, %s says %s (changed since convert wrote it)" % (
                f.path, hashlib.sha256(b).hexdigest(), what, want))
        return np.frombuffer(b, dtype=f.dtype, offset=f.offset).reshape(f.shape)

    def streamed_bytes(self) -> int:
        """Bytes of the blobs a drawn epoch reads (not held)."""
        return sum(f.size for r in self.mods if not r["held"] for f in self.files[r["name"]])

    def map_streamed(self, strict: bool) -> None:
        """The streamed blobs' rows mapped (read=False). A blob the file
        system cannot map (some FUSE and network mounts: ENODEV) is read a
        pread a window instead, or with strict (read=False given) raises,
        naming it."""
        for rec in self.mods:
            if not rec["held"] and rec["name"] not in self.maps:
                maps = []
                for f in self.files[rec["name"]]:
                    try:
                        # (through the fd checked: the file checked is the file mapped)
                        m = f.memmap()
                    except OSError as e:  # (named: Npy.memmap)
                        if strict:
                            raise ValueError("%s; read=False was given" % e.strerror) from None
                        break
                    maps.append(m.view(np.uint8).reshape(f.shape[0], f.row))
                else:
                    self.maps[rec["name"]] = maps

    def kept(self) -> str:
        return kept(self.dir)

    def check_current(self) -> None:
        """Refuse a version changed or dropped since it was checked
        (_versions.check_current)."""
        check_current(self)

    def signature(self) -> list[Any]:
        return [(r["name"], r["dtype"], list(r["frame"]), r["rate"], r["per_clip"], r["labels"] is not None) for r in self.mods]

    def close(self) -> None:
        self.maps = {}  # (unmapped when the last batch being filled lets go of them)
        for fs in self.files.values():
            for f in fs:
                f.close()
        self.files = {}
        if self.remote is not None:
            self.remote.close()

