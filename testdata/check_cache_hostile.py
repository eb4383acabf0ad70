"""The node-local cache of a bucket's epochs, against a hostile folder
(#60.3, .4, .6): usage: check_cache_hostile.py URL WORK [RO_DIR FULL_DIR]

URL is an epochs folder pushed to a bucket (the demo's), WORK an empty
folder of the check's own; RO_DIR an empty read-only file system and
FULL_DIR an empty small one (tmpfs mounts the test made), if given.

Each case plants something in a cache folder, reads the epoch through it,
and must end in one ValueError naming the planted path (or the argument)
within 20 s, with nothing outside the cache opened for writing or deleted:

- an entry (cache_dir/KEY) or an epoch folder in it that is a symbolic
  link to a folder of the user's own (with *.npy, *.have and BLOCKSUMS
  files, as the cache makes them): refused; every file of the user's
  folder left as it was (before: all deleted, then the cache written
  there);
- a FIFO at the mark, at an entry's epochs.json, SHA256SUMS or .boot, at
  a shard file, at its marks and lock, and at the ledger: refused, no
  wait for a writer (before: plain blocking opens hung; a FIFO at a shard
  file gave a bare OSError: Illegal seek);
- a cache_dir that is a regular file; cache_limit '9' * 400 (before:
  OverflowError), '1..2GiB' (before: a ValueError not naming
  cache_limit), -1, 2**70, True; a read-only cache_dir (before: bare
  EROFS), a full one (before: bare ENOSPC).
"""
import hashlib
import os
import shutil
import signal
import stat
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402
from clipshard import _bucket, _cache  # noqa: E402

url, work = sys.argv[1], sys.argv[2]
ro_dir, full_dir = (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else (None, None)
man, _ = _bucket.Bucket(url).read_all("epochs.json")
KEY = hashlib.sha256(url.encode() + b"\0" + man).hexdigest()[:32]
checks = 0


def hung(*_):
    raise SystemExit("hung: a blocking open or read of something planted in the cache")


signal.signal(signal.SIGALRM, hung)


def read(cache, limit="1GiB"):
    signal.alarm(20)
    try:
        n = 0
        for b in clipshard.EpochReader(url, 0, rank=0, world_size=1, batch_size=5, cache_dir=cache, cache_limit=limit):
            n += len(b["samples"])
        return n
    finally:
        signal.alarm(0)


def refused(what, cache, *named, limit="1GiB"):
    """Reading through cache raises one ValueError naming each of named."""
    try:
        read(cache, limit)
    except ValueError as e:
        msg = str(e)
        for n in named:
            assert n in msg, (what, "the refusal does not name", n, msg)
        assert "\n" not in msg, (what, msg)
        return msg
    raise SystemExit("%s: read through, not refused" % what)


def users_folder(p):
    """A folder of the user's own holding files named as the cache names
    its own: their bytes, to check after."""
    os.makedirs(os.path.join(p, "sub"))
    files = {}
    for rel in ("a.npy", "a.npy.have", "BLOCKSUMS", os.path.join("sub", "b.npy"), "notes.txt.tmp.1.2"):
        with open(os.path.join(p, rel), "wb") as f:
            f.write(b"the user's own " + rel.encode())
        files[rel] = b"the user's own " + rel.encode()
    return files


def unchanged(p, files, what):
    got = {}
    for root, _, names in os.walk(p):
        for n in names:
            with open(os.path.join(root, n), "rb") as f:
                got[os.path.relpath(os.path.join(root, n), p)] = f.read()
    assert got == files, (what, "the user's folder changed", sorted(got), sorted(files))


k = 0


def fresh():
    """A cache folder of its own, filled by one good read, in a process
    of its own (its fetch threads, which may run on after the last batch,
    end with it: nothing writes into the folder after)."""
    global k
    k += 1
    c = os.path.join(work, "cache-%d" % k)
    subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); import clipshard; "
                    "assert sum(len(b['samples']) for b in clipshard.EpochReader(%r, 0, rank=0, world_size=1, batch_size=5, "
                    "cache_dir=%r, cache_limit='1GiB'))" % (sys.path[0], url, c)], check=True, timeout=120)
    return c


# -- links -----------------------------------------------------------------

mine = os.path.join(work, "users-own")
files = users_folder(mine)
c = os.path.join(work, "linked-entry")
os.makedirs(c)
with open(os.path.join(c, _cache.MARK), "w") as f:
    f.write("clipshard cache\n")
os.symlink(mine, os.path.join(c, KEY))
refused("a symlinked entry", c, os.path.join(c, KEY), "symbolic link")
unchanged(mine, files, "a symlinked entry")
checks += 1

c = fresh()
ed = os.path.join(c, KEY, "epoch-0000")
shutil.rmtree(ed)
mine2 = os.path.join(work, "users-own-2")
files2 = users_folder(mine2)
os.symlink(mine2, ed)
refused("a symlinked epoch folder", c, os.path.join(c, KEY), "epoch-0000")
unchanged(mine2, files2, "a symlinked epoch folder")
# ... and every later reader of that cache, whatever it reads first
refused("a symlinked epoch folder, again", c, os.path.join(c, KEY), "epoch-0000")
unchanged(mine2, files2, "a symlinked epoch folder, read again")
checks += 1

# A symlink at a file of the entry, to a file of the user's.
c = fresh()
outside = os.path.join(work, "users-file")
with open(outside, "wb") as f:
    f.write(b"mine")
p = os.path.join(c, KEY, "SHA256SUMS")
os.unlink(p)
os.symlink(outside, p)
refused("a symlinked SHA256SUMS", c, p)
with open(outside, "rb") as f:
    assert f.read() == b"mine"
checks += 1

# -- FIFOs -----------------------------------------------------------------

shard = sorted(n for n in os.listdir(os.path.join(fresh(), KEY, "epoch-0000")) if n.endswith(".samples.npy"))[0]
for rel in (_cache.MARK, os.path.join(KEY, "epochs.json"), os.path.join(KEY, "SHA256SUMS"), os.path.join(KEY, ".boot"),
            os.path.join(KEY, "epoch-0000", shard), os.path.join(KEY, "epoch-0000", shard + ".have"),
            os.path.join(KEY, "epoch-0000", shard + ".lock"), _cache.LEDGER):
    c = fresh()
    p = os.path.join(c, rel)
    if rel.endswith((".npy", ".have", ".lock")):
        # (the shard's files left as a killed fetch leaves them: fetched again)
        for q in (".have", ""):
            try:
                os.unlink(os.path.join(c, KEY, "epoch-0000", shard + q))
            except FileNotFoundError:
                pass
    if os.path.lexists(p):
        os.unlink(p)
    os.mkfifo(p)
    if rel == _cache.LEDGER:
        # (the ledger is read only when room is made: a limit the cache is
        # over makes the reader walk and write it)
        limit = 64 << 10
        try:
            read(c, limit)
        except ValueError as e:
            assert p in str(e) or "cache_limit" in str(e), e
        signal.alarm(20)
        try:
            _cache.Cache(c, "1GiB").record(1)
            raise SystemExit("a FIFO ledger was written")
        except ValueError as e:
            assert p in str(e) and "FIFO" in str(e), e
        finally:
            signal.alarm(0)
    else:
        msg = refused("a FIFO at " + rel, c, p)
        assert "FIFO" in msg, msg
    assert stat.S_ISFIFO(os.lstat(p).st_mode), (rel, "the FIFO was replaced")
    checks += 1

# -- arguments and the cache's disk ------------------------------------------

f = os.path.join(work, "a-file")
with open(f, "wb") as fh:
    fh.write(b"mine")
refused("a regular file as cache_dir", f, f, "not a folder")
with open(f, "rb") as fh:
    assert fh.read() == b"mine"
checks += 1
for limit in ("9" * 400, "1..2GiB", -1, 2 ** 70, True, "12XB", 1.5):
    msg = refused("cache_limit %r" % (limit,), os.path.join(work, "limits"), "cache_limit", limit=limit)
    checks += 1
if ro_dir is not None:
    msg = refused("a read-only cache_dir", ro_dir, ro_dir, "read-only")
    sub = os.path.join(ro_dir, "sub")
    refused("a folder to make in a read-only file system", sub, sub, "read-only")
    checks += 2
if full_dir is not None:
    msg = refused("a full cache disk", full_dir, full_dir, "full")
    checks += 1
print("ok: cache_hostile %d checks (links, FIFOs, arguments%s)" % (checks, ", a read-only and a full disk" if ro_dir else ""))
