"""File access for the readers: never trust a file of a folder that the
reader did not write. Paths are confined to their folder, files are opened
without blocking and must be regular files, manifests are bounded before
they are parsed, and .npy headers are checked against what the manifest
says before the first read. Every error is a ValueError naming the file
and what differs.
"""
from __future__ import annotations

import ast
import io
import json
import math
import os
import re
import stat
from typing import Any, Optional, Sequence

import numpy as np

from ._labels import modality_labels

MAX_MANIFEST = 256 << 20  # bytes of a JSON manifest read at most
MAX_HEADER = 1 << 16  # bytes of a .npy header read at most
MAX_SAMPLE = 1 << 40  # bytes of one sample of one modality at most (a manifest saying more lies)


def confined(root: str, rel: Any, what: str = "path") -> str:
    """root/rel, refusing an absolute rel, a '..' or empty component, and a
    path whose symlinks resolve outside root."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or "\0" in rel:
        raise ValueError("%s: %s %r is not a relative path inside the folder" % (root, what, rel))
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError("%s: %s %r escapes the folder (or is not clean)" % (root, what, rel))
    path = os.path.join(root, *parts)
    top = os.path.realpath(root)
    if os.path.commonpath([os.path.realpath(path), top]) != top:
        raise ValueError("%s: %s %r resolves outside the folder (a symlink to %s)" % (root, what, rel, os.path.realpath(path)))
    return path


def open_regular(path: str, dir_fd: Optional[int] = None, name: Optional[str] = None) -> tuple[int, os.stat_result]:
    """An fd of path opened read-only without blocking (a FIFO does not
    hang the open), and its stat; anything but a regular file is refused.
    With dir_fd, the file opened is name in that open folder (path only
    names it in errors)."""
    try:
        if dir_fd is None:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        else:
            fd = os.open(name or os.path.basename(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
    except OSError as e:
        raise ValueError("%s: cannot open: %s" % (path, e.strerror)) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ValueError("%s: not a regular file (%s)" % (path, kind_of(st.st_mode)))
    return fd, st


def kind_of(mode: int) -> str:
    """What a file of st_mode mode is, for a message."""
    return ("a FIFO" if stat.S_ISFIFO(mode) else "a symbolic link" if stat.S_ISLNK(mode) else "a directory" if stat.S_ISDIR(mode)
            else "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a regular file" if stat.S_ISREG(mode) else "not a file")


def pread_into(fd: int, view: memoryview, off: int) -> int:
    """Bytes of fd at off read into view: all of it, fewer only at the end
    of the file."""
    n, got = len(view), 0
    while got < n:
        k = os.preadv(fd, [view[got:]], off + got)
        if not k:
            break
        got += k
    return got


def pread_all(fd: int, n: int, off: int, path: str) -> bytes:
    """n bytes at off (fewer only at the end of the file)."""
    out = bytearray(n)
    return bytes(out[:pread_into(fd, memoryview(out), off)])


def read_json(path: str, limit: int = MAX_MANIFEST) -> dict[str, Any]:
    """The JSON object in path, a regular file of at most limit bytes."""
    fd, st = open_regular(path)
    try:
        if st.st_size > limit:
            raise ValueError("%s: %d bytes, more than a manifest may have (%d)" % (path, st.st_size, limit))
        b = pread_all(fd, st.st_size, 0, path)
    finally:
        os.close(fd)
    try:
        v = json.loads(b.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # (RecursionError: nested too deep)
        raise ValueError("%s: not JSON: %s" % (path, e)) from None
    if not isinstance(v, dict):
        raise ValueError("%s: not a JSON object" % path)
    return v


def _json_int(where: str, key: str, v: Any) -> int:
    """dataset.json's value v of key as an int, or a ValueError naming the
    folder and the key (int() of 1e999, JSON's infinity, is OverflowError)."""
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError("%s: dataset.json: %s %r: not an int (%s)" % (where, key, v, e)) from None


def dataset_top(where: str, man: Any, formats: Sequence[int] = (1,)) -> tuple[dict[str, Any], list[Any], int, int]:
    """dataset.json's files, modalities, clips and frames (of the dataset
    at where), as convert writes them: an object, a list of at least one
    modality, two ints; of a format version in formats (format 2, a
    dataset in segments from convert --segments, where the reader reads
    it)."""
    if not isinstance(man, dict) or man.get("format") != "clipshard.dataset":
        raise ValueError("%s: not a clipshard dataset (dataset.json's format)" % where)
    if man.get("version") == 2 and 2 not in formats:
        raise ValueError("%s: dataset.json is format 2 (a dataset in segments and versions, from convert --segments): this "
                         "reader reads format 1 (clipshard.Dataset, drawn epochs and epochs cut from it read format 2); run "
                         "the same clipshard convert without --segments to write it as one segment again" % where)
    if man.get("version") not in formats or type(man.get("version")) is not int:
        raise ValueError("%s: dataset.json: format version %r, this reader knows %s" % (
            where, man.get("version"), " and ".join("version %d" % f for f in formats)))
    for k in ("files", "modalities", "clips", "frames"):
        if k not in man:
            raise ValueError("%s: dataset.json: no %r" % (where, k))
    files, mods = man["files"], man["modalities"]
    if not isinstance(files, dict) or not isinstance(mods, list):
        raise ValueError("%s: dataset.json: files a %s, modalities a %s: not what convert writes" % (
            where, type(files).__name__, type(mods).__name__))
    if not mods:
        raise ValueError("%s: dataset.json: no modalities" % where)
    return files, mods, _json_int(where, "clips", man["clips"]), _json_int(where, "frames", man["frames"])


def dataset_modality(where: str, m: Any, seen: Any, reserved: Sequence[str] = ()) -> tuple[str, bool, int, list[int]]:
    """A modality's entry of dataset.json (of the dataset at where) checked
    as convert writes it, before any file it names is opened: an object,
    a name (not in seen, nor reserved), a rate of at least 1 unless it is
    per clip (then 0), a frame shape of ints >= 0. (name, per clip, rate,
    frame shape)."""
    if not isinstance(m, dict):
        raise ValueError("%s: dataset.json: modality %r: not an object" % (where, m))
    name = m.get("name")
    if not isinstance(name, str) or not name or name in reserved:
        raise ValueError("%s: dataset.json: modality name %r: not a name%s" % (
            where, name, " (%s is reserved)" % ", ".join(reserved) if reserved else ""))
    if name in seen:
        raise ValueError("%s: dataset.json: modality %r named twice" % (where, name))
    per = bool(m.get("per_clip"))
    shape = m.get("frame_shape", [])
    if not isinstance(shape, list):
        raise ValueError("%s: dataset.json: modality %r: frame_shape %r: not a list" % (where, name, shape))
    rate = 0 if per else _json_int(where, "modality %r rate" % name, m.get("rate", 0))
    frame = [_json_int(where, "modality %r frame_shape" % name, x) for x in shape]
    if (not per and rate < 1) or any(x < 0 for x in frame):
        raise ValueError("%s: dataset.json: modality %r: rate %r, frame shape %r: not what convert writes" % (
            where, name, m.get("rate"), m.get("frame_shape")))
    modality_labels(where, "dataset.json", m)
    return name, per, rate, frame


def clip_starts(index: np.ndarray, frames: int, path: str) -> tuple[np.ndarray, np.ndarray]:
    """The clips' starts and lengths of a dataset's index ([clips, 2] int64,
    read from path), checked: the clips one after the other from row 0,
    adding up to the frames (a start of -100 would slice from the end of
    a blob)."""
    lengths = index[:, 1].copy()
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(lengths) else np.zeros(0, np.int64)
    bad = (lengths < 0) | (index[:, 0] != starts)
    if bad.any() or (len(lengths) and int(lengths.sum()) != frames) or (not len(lengths) and frames):
        c = int(np.argmax(bad)) if bad.any() else max(len(lengths) - 1, 0)
        raise ValueError("%s: clip %d: start %d length %d; want the clips contiguous from 0 adding up to %d frames" % (
            path, c, int(index[c, 0]) if len(lengths) else 0, int(index[c, 1]) if len(lengths) else 0, frames))
    return starts, lengths


# A .npy header exactly as numpy and clipshard write it (keys in order, one
# space after each colon and comma, padded with spaces to a newline); only
# integers numpy's own parser takes (no leading zeros), simple dtypes.
_HEADER = re.compile(r"\{'descr': '([<>|][biuf][1-8])', 'fortran_order': (False|True), "
                     r"'shape': \(((?:(?:0|[1-9][0-9]{0,18}), )*(?:0|[1-9][0-9]{0,18})(?:,)?|)\), \} *\n\Z")


def _fast_header(head: bytes) -> Optional[tuple[int, tuple[int, ...], bool, np.dtype]]:
    """(data offset, shape, fortran order, dtype) of a version 1.0 or 2.0
    header of the form above, as numpy's parser gives them, or None for
    numpy's parser to read (or refuse): it takes a millisecond a file
    (tokenize, ast), which a loader opening thousands of small shards
    felt."""
    if len(head) < 12 or head[:6] != b"\x93NUMPY" or head[7] != 0 or head[6] not in (1, 2):
        return None
    at = 10 if head[6] == 1 else 12
    n = int.from_bytes(head[8:at], "little")
    if at + n > len(head) or n > 10000:  # (numpy refuses a longer header)
        return None
    m = _HEADER.match(head[at: at + n].decode("latin-1"))
    if m is None:
        return None
    dims = m.group(3).rstrip(",")
    shape = tuple(int(x) for x in dims.split(", ")) if dims else ()
    if len(shape) == 1 and not m.group(3).endswith(","):  # "(5)" is an int, not a tuple: numpy refuses it
        return None
    try:
        dtype = np.dtype(m.group(1))
    except TypeError:
        return None
    return at + n, shape, m.group(2) == "True", dtype


def _literal(head: bytes, version: tuple[int, int]) -> None:
    """Raise unless a header numpy's parser would take is a Python literal.
    (numpy's parser tokenizes one that is not, looking for Python 2's 1L:
    a double quote among 2000 spaces took it 1.4 s, quadratic in the
    header's length; clipshard reads no file Python 2 wrote.)"""
    at = 10 if version == (1, 0) else 12
    n = int.from_bytes(head[8:at], "little")
    if n > 10000:
        return  # (numpy refuses it before parsing)
    text = head[at: at + n].decode("utf-8" if version >= (3, 0) else "latin-1")
    try:
        ast.literal_eval(text)
    except Exception as e:  # (SyntaxError, ValueError, MemoryError, RecursionError: nested too deep)
        raise ValueError("its header is not a Python literal: %s" % (str(e).split("\n")[0] or type(e).__name__)) from None


class Npy:
    """An open, checked .npy file: fd (owned: close it), data offset,
    shape, dtype, bytes per row (of axis 0)."""

    def __init__(self, path: str, dir_fd: Optional[int] = None) -> None:
        self.path = path
        self.fd, st = open_regular(path, dir_fd)
        self.size = st.st_size
        try:
            head = pread_all(self.fd, min(self.size, MAX_HEADER), 0, path)
            fast = _fast_header(head)
            if fast is not None:
                offset, shape, fortran, dtype = fast
            else:
                f = io.BytesIO(head)
                try:
                    version = np.lib.format.read_magic(f)
                    _literal(head, version)
                    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                    shape, fortran, dtype = read(f)
                except Exception as e:  # numpy raises ValueError, EOFError, SyntaxError... for a bad header
                    raise ValueError("%s: not a .npy file: %s" % (path, e)) from None
                offset = f.tell()
            if fortran:
                raise ValueError("%s: Fortran order: not a file clipshard wrote" % path)
            if dtype.hasobject or dtype.fields is not None:
                raise ValueError("%s: dtype %s: not a file clipshard wrote" % (path, dtype))
            self.offset, self.shape, self.dtype = offset, tuple(int(x) for x in shape), dtype
            self.row = math.prod(self.shape[1:]) * dtype.itemsize if self.shape else dtype.itemsize
            data = (self.shape[0] if self.shape else 1) * self.row
            if self.offset + data != self.size:
                raise ValueError("%s: %d bytes, but its header (%s %s at offset %d) makes %d" % (
                    path, self.size, dtype.str, self.shape, self.offset, self.offset + data))
        except BaseException:
            os.close(self.fd)
            raise

    def expect(self, dtype: Any, shape: Sequence[int]) -> None:
        """Refuse a dtype or shape other than those the manifest gives."""
        if self.dtype.str != dtype or self.shape != tuple(shape):
            raise ValueError("%s: holds %s %s, the manifest says %s %s" % (
                self.path, self.dtype.str, list(self.shape), dtype, list(shape)))

    def memmap(self) -> np.ndarray:
        """A read-only memory map of the data, through this fd (not the
        path again: the file checked is the file mapped)."""
        if self.size == self.offset:
            return np.empty(self.shape, dtype=self.dtype)
        with os.fdopen(os.dup(self.fd), "rb") as f:
            try:
                return np.memmap(f, dtype=self.dtype, mode="r", offset=self.offset, shape=self.shape)
            except OSError as e:  # (a file system that cannot map: some FUSE and network mounts, ENODEV)
                raise OSError(e.errno, "%s: cannot be memory-mapped here: %s (read=True reads it instead)"
                              % (self.path, e.strerror or e)) from None

    def read(self) -> np.ndarray:
        """The whole array, read."""
        b = pread_all(self.fd, self.size - self.offset, self.offset, self.path)
        if len(b) != self.size - self.offset:
            raise ValueError("%s: shorter than when it was checked" % self.path)
        return np.frombuffer(b, dtype=self.dtype).reshape(self.shape).copy()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def memory_limit(proc: str = "/proc", cgroup: str = "/sys/fs/cgroup") -> Optional[int]:
    """Bytes of memory this process, its page cache included, may use: the
    least of the machine's (MemTotal) and its cgroup's limits (v2:
    memory.max of its cgroup and each above it; v1: memory.limit_in_bytes,
    likewise); None where none can be read (not Linux). (proc, cgroup:
    where those are mounted.)"""
    limits = []
    try:
        with open(os.path.join(proc, "meminfo")) as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    limits.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(os.path.join(proc, "self", "cgroup")) as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, ctrls, path = parts
        if hid == "0" and ctrls == "":
            root, name = os.path.normpath(cgroup), "memory.max"
        elif "memory" in ctrls.split(","):
            root, name = os.path.join(os.path.normpath(cgroup), "memory"), "memory.limit_in_bytes"
        else:
            continue
        d = os.path.normpath(root + "/" + path.lstrip("/"))
        while d.startswith(root):
            try:
                with open(os.path.join(d, name)) as f:
                    v = f.read().strip()
                if v.isdigit():
                    limits.append(int(v))
            except OSError:
                pass
            if d == root:
                break
            d = os.path.dirname(d)
    return min(limits) if limits else None


_PROBE = bytearray(1)


def cached(fd: int, off: int, n: int) -> bool:
    """Whether the page cache holds [off, off+n), as far as 1-byte reads
    that never wait (preadv2 RWF_NOWAIT) tell: at its middle, then at the
    first and the last page wholly inside it. Not at its ends: a range
    beside it, or overlapping it (a drawn block's last W-1 frames are the
    next one's first), may have brought those pages in when this range's
    middle is not cached (a cold drawn epoch in groups of 32 MiB found
    132-144 of 479 blocks "cached" by their ends). (Asking the kernel to read
    ahead what it holds costs a walk of every page: the callers probe
    first.)"""
    flag = getattr(os, "RWF_NOWAIT", None)
    if flag is None or n <= 0:
        return False
    first = -(-off // 4096) * 4096  # the first whole page's first byte
    last = (off + n) // 4096 * 4096 - 1  # the last whole page's last byte
    at = [off + n // 2] + ([first, last] if first < last else [])
    try:
        for a in at:
            if os.preadv(fd, [_PROBE], a, flag) != 1:
                return False
    except (BlockingIOError, OSError):
        return False
    return True


def human(n: int, up: bool = False) -> str:
    """n bytes in words (binary units, 3 significant digits); up: rounded
    up (a bound to give, never below n)."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            v = n / size
            digits = 2 if v < 10 else 1 if v < 100 else 0
            q = 10 ** digits
            v = (math.ceil(v * q) if up else round(v * q)) / q
            return ("%." + str(digits) + "f %s") % (v, unit)
    return "%d bytes" % n
