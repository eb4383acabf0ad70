"""The node-local cache folder of bucket folders' files (Cache): its
mark, its usage ledger and its lock, and the file operations every entry
in it is made and read with, each from an open folder's fd, following no
link and opening no FIFO or device (see _remote for the whole design).
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import random
import re
import stat
import struct
import time
from typing import Any, Iterator, Optional, Union

from ._bucket import MAX_MANIFEST, size_of
from ._files import kind_of

__all__ = ["Cache", "blocks"]

MARK = "CLIPSHARD-CACHE"
LEDGER = ".usage"  # the cache's usage as last counted (Cache.counted)
LEDGER_AGE = 2.0  # seconds a count is trusted before the cache is walked again
LEDGER_BYTES = 96  # the ledger's size: its JSON, padded with spaces
SLACK = 256 << 10  # kept free under the limit: readers' position files, the extent blocks of sparse files
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _range_lock(fd: int, start: int, length: int, kind: int) -> None:
    """An open-file-description lock (Linux) on bytes [start, start+length)
    of fd: F_WRLCK waits for it, F_UNLCK releases it. It belongs to this
    open of the file: another thread's open, or another process's,
    conflicts; it goes when the fd closes (a process that dies)."""
    fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, struct.pack("hhxxxxqqixxxx", kind, 0, start, length, 0))


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def _what_is(dfd: int, name: str) -> str:
    try:
        return kind_of(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
    except OSError as e:
        return e.strerror or "cannot be read"


def _cache_error(where: str, e: OSError) -> ValueError:
    """A ValueError of an OSError of the cache's own files: what went wrong
    there, and what to do."""
    fix = {errno.ENOSPC: "the cache's disk is full: free space on it, lower cache_limit to what it holds, or give another cache_dir",
           errno.EDQUOT: "the disk quota is spent: free some of it, lower cache_limit, or give another cache_dir",
           errno.EROFS: "a read-only file system: give a cache_dir on a writable, node-local disk",
           errno.EACCES: "permission denied: give a cache_dir this user may write",
           errno.EPERM: "not permitted: give a cache_dir this user may write"}.get(e.errno or 0, "")
    return ValueError("%s: %s%s" % (where, e.strerror or e, "; " + fix if fix else ""))


def _open_file(dfd: int, name: str, flags: int, where: str, mode: int = 0o666) -> int:
    """An fd of the regular file name in the open folder dfd: a symbolic
    link is never followed, a FIFO never waited on, a device never used
    (ValueError, naming where); FileNotFoundError if it is not there (and
    flags do not make it), FileExistsError if it is and flags have O_EXCL."""
    try:
        fd = os.open(name, flags | _O_NOFOLLOW | os.O_NONBLOCK | _O_CLOEXEC, mode, dir_fd=dfd)
    except (FileNotFoundError, FileExistsError):
        raise
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENOTDIR, errno.EWOULDBLOCK):
            raise ValueError("%s: %s, where the cache keeps a file of its own: refusing to use this cache (it never follows "
                             "a link out of its folder, nor opens a FIFO or device): remove it" % (where, _what_is(dfd, name))) from None
        raise _cache_error(where, e) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ValueError("%s: %s, where the cache keeps a file of its own: refusing to use this cache (it never opens a "
                         "FIFO or device): remove it" % (where, kind_of(st.st_mode)))
    return fd


def _read_file(dfd: int, name: str, where: str, limit: int = MAX_MANIFEST) -> bytes:
    """The bytes of the regular file name in dfd (see _open_file), at most
    limit of them."""
    fd = _open_file(dfd, name, os.O_RDONLY, where)
    try:
        n = os.fstat(fd).st_size
        if n > limit:
            raise ValueError("%s: %d bytes, more than the cache writes there (%d): remove it" % (where, n, limit))
        out = bytearray()
        while len(out) < n:
            got = os.pread(fd, n - len(out), len(out))
            if not got:
                break
            out += got
        return bytes(out)
    finally:
        os.close(fd)


def _open_dir(dfd: Optional[int], name: str, where: str, create: bool = False) -> int:
    """An fd of the folder name in the open folder dfd (made if create),
    never through a symbolic link: anything but a real folder there is
    refused (ValueError, naming where)."""
    if create:
        try:
            os.mkdir(name, 0o777, dir_fd=dfd)  # (less the umask, as makedirs made them)
        except FileExistsError:
            pass
        except OSError as e:
            raise _cache_error(where, e) from None
    try:
        return os.open(name, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | os.O_NONBLOCK | _O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ValueError("%s: %s, where the cache keeps a folder of its own: refusing to use this cache (it never follows "
                             "a link out of its folder): remove it" % (where, _what_is(dfd, name) if dfd is not None else "not a folder")) from None
        raise _cache_error(where, e) from None


def _write_new(dfd: int, name: str, b: bytes, where: str) -> None:
    """Write b to name in dfd by a temporary file of this process's
    (name.tmp.PID.RAND, made create-only) renamed over it."""
    tmp = "%s.tmp.%d.%d" % (name, os.getpid(), random.getrandbits(32))
    fd = _open_file(dfd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, where)
    try:
        try:
            view, done = memoryview(b), 0
            while done < len(view):
                done += os.write(fd, view[done:])
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException as e:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise _cache_error(where, e) from None
        raise


def _listdir(dfd: int) -> list[str]:
    """The names in the open folder dfd, read through an open of its own
    (os.listdir(fd) reads through a dup of fd, whose position the threads
    listing it at once would share: each would see part of it)."""
    fd = os.open(".", os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC, dir_fd=dfd)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def _regular(dfd: int, name: str) -> bool:
    """Whether name in dfd is a regular file (what the cache deletes: a
    link, a FIFO or a device is never its own)."""
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def _is_file(dfd: int, name: str, where: str) -> bool:
    """Whether name in dfd is there (a regular file: anything else there,
    a link followed by no one, is refused, naming where)."""
    try:
        mode = os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(mode):
        raise ValueError("%s: %s, where the cache keeps a file of its own: refusing to use this cache (it never follows "
                         "a link out of its folder, nor opens a FIFO or device): remove it" % (where, kind_of(mode)))
    return True


class Cache:
    """A node-local cache folder of bucket folders' files (see the module
    doc). Safe for several processes (ranks, workers) at once. Every open
    and walk inside it starts from its folder's fd and follows no link:
    nothing outside it is ever opened for writing or deleted."""

    def __init__(self, path: str, limit: Union[str, int]) -> None:
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise ValueError("cache_dir %r: want a folder's path" % (path,))
        self.path = os.path.abspath(path)
        self.limit = size_of(limit)
        if self.limit <= 0:
            raise ValueError("cache_limit %r: want a size > 0" % (limit,))
        try:
            os.makedirs(self.path, exist_ok=True)
        except FileExistsError:
            raise ValueError("cache_dir %s: not a folder (%s): give a folder of its own for the cache" % (
                self.path, kind_of(os.stat(self.path).st_mode))) from None
        except OSError as e:
            raise _cache_error("cache_dir " + self.path, e) from None
        self._fd: Optional[int] = None
        self._fd_pid = -1
        names = _listdir(self.fd)
        if MARK not in names:
            if names:
                raise ValueError("%s: not a clipshard cache (it holds %s, and no %s): give an empty or new folder, "
                                 "never a folder of your own files (a cache deletes what it evicts)" % (self.path, sorted(names)[:5], MARK))
            # Made create-only: readers starting at once on an empty folder
            # (ranks, workers) all find it a cache, whoever made the mark.
            try:
                fd = _open_file(self.fd, MARK, os.O_WRONLY | os.O_CREAT | os.O_EXCL, os.path.join(self.path, MARK), 0o644)
            except FileExistsError:
                pass
            else:
                try:
                    os.write(fd, b"clipshard cache: every file here may be deleted at any time\n")
                except OSError as e:
                    raise _cache_error(os.path.join(self.path, MARK), e) from None
                finally:
                    os.close(fd)
        os.close(_open_file(self.fd, MARK, os.O_RDONLY, os.path.join(self.path, MARK)))  # (a regular file: else refused)
        for n in _listdir(self.fd):
            where = os.path.join(self.path, n)
            if n in (MARK, LEDGER) or n.startswith(LEDGER + ".tmp."):
                continue
            if not re.fullmatch(r"[0-9a-f]{32}", n):
                raise ValueError("%s: holds %r, which is not a cache entry: refusing to use it as a cache" % (self.path, n))
            try:
                mode = os.stat(n, dir_fd=self.fd, follow_symlinks=False).st_mode
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(mode):
                raise ValueError("%s: %s, where the cache keeps an entry (a folder of its own): refusing to use this cache "
                                 "(a cache never follows a link out of its folder): remove it" % (where, kind_of(mode)))

    @property
    def fd(self) -> int:
        """An fd of the cache's folder (opened again in a process other than
        the one that opened it, and after close)."""
        if self._fd is None or self._fd_pid != os.getpid():
            try:
                self._fd = os.open(self.path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
            except OSError as e:
                raise _cache_error("cache_dir " + self.path, e) from None
            self._fd_pid = os.getpid()
        return self._fd

    def __del__(self) -> None:
        # (closed only when nothing can use it: a fetch thread still
        # running after a reader's close would otherwise use a number a
        # later open took)
        fd = getattr(self, "_fd", None)
        if fd is not None and self._fd_pid == os.getpid():
            os.close(fd)

    def _walk(self) -> Iterator[tuple[str, list[str], int]]:
        """(folder relative to the cache, its file names, its fd) of every
        folder of the cache, from its fd, following no link."""
        for root, _, names, rfd in os.fwalk(".", dir_fd=self.fd, follow_symlinks=False):
            yield os.path.normpath(root), names, rfd

    def usage(self) -> int:
        """The bytes the cache takes on disk, as du counts them (a walk of
        it; also recorded in the ledger, see counted)."""
        total = 0
        for _, names, rfd in self._walk():
            for n in names:
                try:
                    total += os.stat(n, dir_fd=rfd, follow_symlinks=False).st_blocks * 512
                except FileNotFoundError:
                    pass
        self.record(total)
        return total

    def counted(self) -> Optional[int]:
        """The usage the ledger (LEDGER: the last walk, plus what was
        reserved since, minus what was evicted) holds, if it was walked
        within the last LEDGER_AGE seconds; else None (walk). Under the
        lock: every reservation and eviction goes through it, and what
        grows outside it (position files, extent blocks) is within SLACK."""
        try:
            fd = self._ledger(create=False)
            try:
                v = json.loads(os.pread(fd, LEDGER_BYTES + 1, 0))
            finally:
                os.close(fd)
            if time.time() - float(v["walked"]) < LEDGER_AGE:
                return int(v["usage"])
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            pass
        return None

    def _ledger(self, create: bool) -> int:
        """An fd of the ledger, a regular file of this cache's: a symlink,
        a FIFO or a device planted under its name is never followed,
        opened for long or written (ValueError, naming it)."""
        return _open_file(self.fd, LEDGER, os.O_RDWR | (os.O_CREAT if create else 0), os.path.join(self.path, LEDGER), 0o644)

    def record(self, usage: int, walk: bool = True) -> None:
        """Write the ledger (under the lock): usage, as a walk found it
        now, or (walk False) as counted since the last walk."""
        # Written in place, one pwrite of LEDGER_BYTES (JSON padded with
        # spaces): under the lock no reader sees it half written, and one
        # that a death left torn is not JSON (counted: walk). (A temporary
        # file renamed over it cost a new inode a fetched piece.)
        fd = self._ledger(create=True)
        try:
            walked = time.time()
            if not walk:
                try:
                    walked = float(json.loads(os.pread(fd, LEDGER_BYTES, 0))["walked"])
                except (OSError, ValueError, KeyError, TypeError, RecursionError):
                    walked = 0.0
            body = json.dumps({"usage": usage, "walked": walked}).encode()
            os.pwrite(fd, body.ljust(LEDGER_BYTES), 0)
            if os.fstat(fd).st_size > LEDGER_BYTES:
                os.ftruncate(fd, LEDGER_BYTES)  # (an older version's, longer)
        except OSError as e:
            raise _cache_error(os.path.join(self.path, LEDGER), e) from None
        finally:
            os.close(fd)

    def locked(self) -> "_Flock":
        """The cache's own lock (flock of the mark): room is made and
        taken under it."""
        return _Flock(self.fd, MARK, os.path.join(self.path, MARK))


class _Flock:
    """flock of the regular file name in the open folder dfd (made if it is
    not there), while in the with block."""

    def __init__(self, dfd: int, name: str, where: str, exclusive: bool = True) -> None:
        self.dfd, self.name, self.where = dfd, name, where
        self.mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH

    def __enter__(self) -> "_Flock":
        self.fd = _open_file(self.dfd, self.name, os.O_RDONLY | os.O_CREAT, self.where)
        fcntl.flock(self.fd, self.mode)
        return self

    def __exit__(self, *exc: Any) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _name_lock(dfd: int, name: str, where: str) -> int:
    """An fd holding flock of NAME.lock (made if it is not there): the
    lock of making NAME. A lock file is removed by whoever holds it once
    NAME is made (or evicted): a holder then checks that the file it
    locked is still the one at the name, and takes the new one if not."""
    while True:
        fd = _open_file(dfd, name + ".lock", os.O_RDWR | os.O_CREAT, where + ".lock", 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.stat(name + ".lock", dir_fd=dfd, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            return fd
        os.close(fd)  # (removed or replaced while waited for: the lock is the file there now)


def _name_unlock(dfd: int, name: str, fd: int, remove: bool = True) -> None:
    """Release _name_lock's fd, with remove first removing the lock file
    (it is still the one locked: nothing piles up in the cache)."""
    try:
        if remove:
            try:
                if os.stat(name + ".lock", dir_fd=dfd, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                    os.unlink(name + ".lock", dir_fd=dfd)
            except OSError:
                pass
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def blocks(n: int) -> int:
    """What a file of n bytes may take on disk: n rounded up to whole 4
    KiB blocks, and one more (an extent block, or ext4's one past the end)."""
    return -(-n // 4096) * 4096 + 4096


def _sweep(dfd: int, base: str) -> None:
    """Remove the temporary files of cache file base in the open folder
    dfd (base.tmp.PID.*, base.have.tmp.PID.*) that dead processes, or this
    one, left, and the folder's lock files nobody holds (a fetcher killed
    after making its file, before removing its lock, left one that no
    reader of the made file would take). Called holding base's lock."""
    for n in _listdir(dfd):
        if n.endswith(".lock") and n != base + ".lock":
            _drop_free_lock(dfd, n)
            continue
        for head in (base + ".tmp.", base + ".have.tmp."):
            if n.startswith(head):
                pid = n[len(head):].split(".")[0]
                if pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))) and _regular(dfd, n):
                    try:
                        os.unlink(n, dir_fd=dfd)
                    except FileNotFoundError:
                        pass


def _sweep_locks(dfd: int) -> None:
    """Remove the lock files (NAME.lock, of _name_lock) of the open folder
    dfd that nobody holds: a fetcher killed between making NAME and
    removing its lock left one that no reader of NAME would take."""
    for n in _listdir(dfd):
        if n.endswith(".lock"):
            _drop_free_lock(dfd, n)


def _drop_free_lock(dfd: int, n: str) -> None:
    """Remove the lock file n of the open folder dfd if nobody holds it,
    as its holder would (still the file at the name once locked: a
    process waiting for it takes the next). Anything but a regular file
    is left as it is (a reader needing it refuses it)."""
    try:
        fd = os.open(n, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # (held: its file is being made)
        try:
            if os.stat(n, dir_fd=dfd, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                os.unlink(n, dir_fd=dfd)
        except OSError:
            pass
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _runs(marks: bytes, first: int) -> list[tuple[int, int]]:
    """The runs [a, b) of unmarked blocks (a zero byte) in marks, whose
    first byte is block first's."""
    out, i, n = [], 0, len(marks)
    while i < n:
        if marks[i]:
            i += 1
            continue
        j = i
        while j < n and not marks[j]:
            j += 1
        out.append((first + i, first + j))
        i = j
    return out
