"""A cache entry's folder (cache_dir/<key>: one bucket folder's version):
its sub-folders reached from the cache's fd one real folder at a time
and kept open by the process, the manifests written into it, the
.boot that says which boot's marks it trusts, and this reader's
position file (what it keeps, for the other readers' eviction).
"""
from __future__ import annotations

import json
import os
import threading
from typing import Callable, Optional

from ._bucket import BLOCKSUMS
from ._cache import Cache, _boot_id, _cache_error, _open_dir, _read_file, _regular, _sweep_locks, _write_new

__all__ = ["Entry"]


class Entry:
    """The entry key of cache (root: its folder, made if it is not
    there).

        e = Entry(cache, "3f2a...")
        dfd, name = e.place("epoch-0003/shard-000000.whisper.npy")
    """

    def __init__(self, cache: Cache, key: str) -> None:
        self.cache, self.key = cache, key
        self.root = os.path.join(cache.path, key)
        self._lock = threading.Lock()
        self._dirs: dict[str, int] = {}  # folder of the entry ("" itself) -> its fd, of this process
        self._dirs_pid = -1
        self._pos_name = ".pos-%d-%d" % (os.getpid(), id(self))
        # The entry's name of a bucket file (None: its own name; a dataset
        # in segments: by content, _remote.Remote._name).
        self.mapping: Optional[Callable[[str], str]] = None
        self.dir("")  # (made, a real folder)

    def __str__(self) -> str:
        return "Entry(%s)" % self.root

    def dir(self, folder: str) -> int:
        """An fd of the entry's folder (e.g. "epoch-0003"; "" the entry
        itself), made if it is not there, reached from the cache's fd one
        real folder at a time (a link is refused, never followed); kept
        open by this process."""
        with self._lock:
            if self._dirs_pid != os.getpid():
                self._dirs, self._dirs_pid = {}, os.getpid()  # (a fork's copies: the parent's to close)
            fd = self._dirs.get(folder)
        if fd is not None:
            return fd
        if folder == "":
            fd = _open_dir(self.cache.fd, self.key, self.root, create=True)
        else:
            parent, _, name = folder.rpartition("/")
            if name in ("", ".", "..") or "\0" in name:
                raise ValueError("%s: %r is not a folder of the entry" % (self.root, folder))
            fd = _open_dir(self.dir(parent), name, os.path.join(self.root, *folder.split("/")), create=True)
        with self._lock:
            old = self._dirs.setdefault(folder, fd)
        if old != fd:
            os.close(fd)
        else:
            _sweep_locks(fd)  # (what dead fetchers left there: once a folder, a process)
        return old

    def place(self, rel: str) -> tuple[int, str]:
        """(the fd of rel's folder, rel's name) in the entry."""
        if self.mapping is not None:
            rel = self.mapping(rel)
        folder, _, name = rel.rpartition("/")
        if name in ("", ".", "..") or "\0" in name:
            raise ValueError("%s: %r is not a file of the entry" % (self.root, rel))
        return self.dir(folder), name

    def fresh_boot(self) -> None:
        """Marks of fetched blocks are trusted within the boot that wrote
        them (after a crash, a page the disk never got may read as zeros):
        an entry of another boot has its shard files removed."""
        now = _boot_id()
        root = self.dir("")
        where = os.path.join(self.root, ".boot")

        def same() -> bool:
            try:
                return _read_file(root, ".boot", where, 4096).decode("utf-8", "replace") == now
            except FileNotFoundError:
                return False
        if same():
            return
        with self.cache.locked():
            if same():
                return
            try:
                for _, _, names, rfd in os.fwalk(".", dir_fd=root, follow_symlinks=False):
                    for n in names:
                        if (n.endswith((".npy", ".have")) or n == BLOCKSUMS or ".tmp." in n) and _regular(rfd, n):
                            try:
                                os.unlink(n, dir_fd=rfd)
                            except FileNotFoundError:
                                pass
            except OSError as e:
                raise _cache_error(self.root, e) from None
            _write_new(root, ".boot", now.encode(), where)

    def put(self, rel: str, b: bytes) -> None:
        dfd, name = self.place(rel)
        try:
            if _read_file(dfd, name, self.local(rel), max(len(b), 1) * 2) == b:
                return
        except FileNotFoundError:
            pass
        _write_new(dfd, name, b, self.local(rel))


    def local(self, rel: str) -> str:
        if self.mapping is not None:
            rel = self.mapping(rel)
        return os.path.join(self.root, *rel.split("/"))

    def publish(self, reading: list[str], ahead: list[str]) -> None:
        """This reader is at these files (its current shard group) and
        reads ahead to those: published for the other local readers'
        eviction (what one reads is never evicted; what it reads ahead to
        only when nothing else can go)."""
        if self.mapping is not None:
            reading, ahead = [self.mapping(r) for r in reading], [self.mapping(r) for r in ahead]
        body = json.dumps({"pid": os.getpid(), "reading": reading, "ahead": ahead})
        _write_new(self.dir(""), self._pos_name, body.encode(), os.path.join(self.root, self._pos_name))

    def close(self) -> None:
        try:
            os.unlink(self._pos_name, dir_fd=self.dir(""))
        except (OSError, ValueError):
            pass

    def __del__(self) -> None:
        # (the folders' fds closed only when nothing can use them: a fetch
        # thread still running after close would otherwise use a number a
        # later open took, writing into another folder)
        if getattr(self, "_dirs_pid", None) == os.getpid():
            for fd in self._dirs.values():
                os.close(fd)
