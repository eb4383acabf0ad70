"""The bound of a node-local cache (Room): room made for a fetch by
evicting files no live local reader keeps (what one reads never; what it
reads ahead to last, farthest first), and taken (the blocks allocated)
under the cache's lock, so that the fetchers of every process together
stay under cache_limit. Readers publish what they keep in position files
of their entries (.pos-PID-ID); a dead reader's are ignored and removed.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import stat
import time
from typing import Any

from ._bucket import BLOCKSUMS
from ._cache import SLACK, Cache, _alive, _cache_error, _listdir, _open_dir, _open_file, _read_file, _regular

__all__ = ["Room"]


class Room:
    """The bound of cache (a Cache), shared by the entries read through it.

        room = Room(cache)
        room.reserve(4096, lambda: os.posix_fallocate(fd, 0, 4096))
    """

    def __init__(self, cache: Cache) -> None:
        self.cache = cache

    def __str__(self) -> str:
        return "Room(%s, limit %d)" % (self.cache.path, self.cache.limit)

    def kept(self) -> tuple[set[str], set[str]]:
        """The files live local readers are at, and those they read ahead
        to (of every version in the cache), as paths relative to the
        cache's folder."""
        keep: set[str] = set()
        ahead: set[str] = set()
        top = self.cache.fd
        for key in _listdir(top):
            if not re.fullmatch(r"[0-9a-f]{32}", key):
                continue
            try:
                d = _open_dir(top, key, os.path.join(self.cache.path, key))
            except (OSError, ValueError):
                continue  # (gone, or not a folder: the cache refuses it when next opened)
            try:
                for n in _listdir(d):
                    if not n.startswith(".pos-") or n.endswith(".tmp") or ".tmp." in n:
                        continue
                    try:
                        pid = int(n.split("-")[1])
                        v = json.loads(_read_file(d, n, os.path.join(self.cache.path, key, n), 1 << 24))
                    except (ValueError, OSError, RecursionError, IndexError):
                        continue
                    if not _alive(pid):
                        try:
                            os.unlink(n, dir_fd=d)
                        except OSError:
                            pass
                        continue
                    if not isinstance(v, dict):
                        continue
                    for into, what in ((keep, v.get("reading")), (ahead, v.get("ahead"))):
                        if isinstance(what, list):  # (a reader's, or anything: each a name inside the entry)
                            into.update(os.path.join(key, *r.split("/")) for r in what if isinstance(r, str) and ".." not in r.split("/"))
            finally:
                os.close(d)
        return keep, ahead - keep

    def reserve(self, need: int, allocate: Any) -> None:
        """Make room for need more bytes under the limit (less SLACK) and
        take it (allocate(): the blocks allocated, a file made), under the
        cache's lock, so that fetchers of every process together stay
        under the limit. While the local readers keep all of it, wait for
        them to move on (without the lock) for a minute, then raise."""
        limit = self.cache.limit - SLACK
        if need > limit:
            raise ValueError("%s: cache_limit %d cannot hold %d bytes more: raise cache_limit" % (self.cache.path, self.cache.limit, need + SLACK))
        deadline = time.monotonic() + 60
        while True:
            with self.cache.locked():
                used = self._make_room(need, limit)
                if used + need <= limit:
                    try:
                        allocate()
                    except OSError as e:
                        raise _cache_error("cache_dir %s (taking %d bytes of cache_limit %d)" % (self.cache.path, need, self.cache.limit), e) from None
                    self.cache.record(used + need, walk=False)
                    return
            if time.monotonic() > deadline:
                raise ValueError("%s: %d bytes in use of cache_limit %d, and the local readers keep all of it: raise cache_limit"
                                 % (self.cache.path, used, self.cache.limit))
            time.sleep(0.05)

    def _make_room(self, need: int, limit: int) -> int:
        """Evict shard files (and BLOCKSUMS) no live local reader keeps
        until need more bytes fit under limit, if they can; the usage
        then. Under the cache's lock."""
        used = self.cache.counted()
        if used is not None and used + need <= limit:
            return used
        used = self.cache.usage()  # (walked: exact)
        if used + need <= limit:
            return used
        keep, ahead = self.kept()
        victims = []
        for root, names, rfd in self.cache._walk():
            if root == ".":
                continue  # (the mark and the ledger)
            for n in names:
                p = os.path.join(root, n)
                if not _regular(rfd, n):
                    continue  # (not the cache's: a reader refuses it, naming it)
                if (n.endswith(".npy") or n == BLOCKSUMS) and p not in keep:
                    try:
                        # What no reader needs first, oldest first; then
                        # what readers read ahead to, farthest first.
                        t = os.stat(n, dir_fd=rfd, follow_symlinks=False).st_mtime
                        victims.append((p in ahead, -t if p in ahead else t, p))
                    except FileNotFoundError:
                        pass
                elif ".tmp." in n:
                    pid = n.split(".tmp.")[1].split(".")[0]
                    if pid.isdigit() and not _alive(int(pid)):
                        try:
                            used -= os.stat(n, dir_fd=rfd, follow_symlinks=False).st_blocks * 512
                            os.unlink(n, dir_fd=rfd)  # a dead fetcher's
                        except FileNotFoundError:
                            pass
        victims.sort()
        for _, _, p in victims:
            if used + need <= limit:
                break
            used -= self._evict(p)
        return used

    def _evict(self, p: str) -> int:
        """Remove cache file p (relative to the cache's folder) and its
        marks, unless it is being made (its NAME.lock held); the bytes
        freed."""
        folder, name = os.path.split(p)
        try:
            dfd = self.cache.fd
            opened = []
            for part in folder.split(os.sep):
                dfd = _open_dir(dfd, part, os.path.join(self.cache.path, folder))
                opened.append(dfd)
        except (OSError, ValueError):
            for d in opened:
                os.close(d)
            return 0
        freed = 0
        lock = None
        try:
            if name.endswith(".npy"):
                try:
                    lock = _open_file(dfd, name + ".lock", os.O_RDONLY, os.path.join(self.cache.path, p) + ".lock")
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(lock) if lock is not None else None
                    return 0
                except FileNotFoundError:
                    lock = None
            try:
                for q in (name, name + ".have"):  # the data first: a file is never without its marks
                    try:
                        st = os.stat(q, dir_fd=dfd, follow_symlinks=False)
                        if stat.S_ISREG(st.st_mode):
                            os.unlink(q, dir_fd=dfd)
                            freed += st.st_blocks * 512
                    except FileNotFoundError:
                        pass
            finally:
                if lock is not None:
                    try:  # (the lock file too, still the one locked: a waiter for it takes the next)
                        if os.stat(name + ".lock", dir_fd=dfd, follow_symlinks=False).st_ino == os.fstat(lock).st_ino:
                            os.unlink(name + ".lock", dir_fd=dfd)
                    except OSError:
                        pass
                    fcntl.flock(lock, fcntl.LOCK_UN)
                    os.close(lock)
        finally:
            for d in opened:
                os.close(d)
        return freed

