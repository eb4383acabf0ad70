"""Epochs drawn at read time from a dataset in segments and versions
(#61): usage: check_drawn_format2.py CLIPSHARD SRC WORK

SRC: a copy of the demo set (its whisper/clip003.npy is rewritten here);
WORK: an empty folder. The dataset grows through five versions by
`CLIPSHARD convert --segments` (8 clips; the other 4 appended; a
modality added; 11 clips reversed, one removed; one clip's source
changed), and each version gets a twin: a full convert of its list.

- Every version, read with Loader(dataset=DS, version=N) (the current
  one without version), gives batches byte-equal to its twin's, in both
  read modes (a memory map of each blob; a pread a window), streamed and
  held modalities, tile and random sampling, several windows, batch
  sizes, blocks, threads; so does DrawnReader on 2 ranks, and a mix of
  sources.
- Pinned versions: a loader that began on version 1 reads on, byte-equal
  to version 1's twin, after versions 2-5 are committed under it; a
  loader state records its versions, and a loader made on the current
  version that loads a state of version 3 reads version 3's remaining
  batches (the same as its twin's); pickled (spawned workers), a Drawn
  opens the version it read. version= of a dropped version is refused
  naming the versions kept; a loader of version 2 when convert --keep
  drops it is refused at its next epoch; a dataset converted again in
  place (no --segments) is refused at the next epoch.
- Hostile: a where.npy pointing outside its blob, a segment's blob
  replaced by a FIFO, a segment linked outside the folder: one
  ValueError naming the file, before any batch.
Prints "ok: ..." or raises.
"""
import hashlib
import itertools
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402
from clipshard.draw import Drawn, DrawnReader  # noqa: E402

BIN, SRC, WORK = sys.argv[1:4]
DS = os.path.join(WORK, "ds")
MODS = ["-m", "motion=motion/{clip}.pkl:exp+pose", "-m", "shape@clip=motion/{clip}.pkl:shape", "-m", "whisper@2=whisper/{clip}.npy"]
EMO = ["-m", "emotion=emotion/{clip}.npy"]


def convert(lst, out, mods, *extra):
    r = subprocess.run([BIN, "convert", "--quiet", "--clips", lst, "--root", SRC, "--out", out] + mods + list(extra),
                       capture_output=True, text=True)
    assert r.returncode == 0, (out, extra, r.stderr)


def clip_list(name, ids):
    p = os.path.join(WORK, name)
    with open(p, "w") as f:
        f.write("".join(c + "\n" for c in ids))
    return p


def same_batches(a, b, what):
    assert len(a) == len(b) and len(a) > 0, (what, len(a), len(b))
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.keys() == y.keys(), (what, x.keys(), y.keys())
        for k in x:
            assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape, (what, i, k)
            assert np.array_equal(np.asarray(x[k]).view(np.uint8), np.asarray(y[k]).view(np.uint8)), (what, i, k)


def batches(ds, **kw):
    ld = clipshard.Loader(dataset=ds, **kw)
    try:
        return [{k: v.copy() for k, v in b.items()} for _ in ld.epochs for b in ld]
    finally:
        ld.close()


def refused(fn, *words):
    try:
        fn()
    except ValueError as e:
        msg = str(e)
        assert all(w in msg for w in words) and "\n" not in msg, (words, msg)
        return msg
    raise SystemExit("not refused: %s" % (words,))


ids = [ln.strip() for ln in open(os.path.join(SRC, "clips.txt")) if ln.strip() and not ln.startswith("#")]
lists = {1: clip_list("l1.txt", ids[:8]), 2: clip_list("l2.txt", ids), 3: clip_list("l3.txt", ids)}
lists[4] = lists[5] = clip_list("l4.txt", [c for c in ids[::-1] if c != ids[5]])
mods = {1: MODS, 2: MODS, 3: MODS + EMO, 4: MODS + EMO, 5: MODS + EMO}
base = dict(epochs=[0, 1], window=5, batch_size=4, hold=0, remainder="pad")

# Version 1, and a loader that begins on it.
convert(lists[1], DS, mods[1])
twins = {}
twins[1] = os.path.join(WORK, "twin1")
convert(lists[1], twins[1], mods[1])
early = clipshard.Loader(dataset=DS, **base)
it = iter(early)
got = [{k: v.copy() for k, v in next(it).items()} for _ in range(3)]
for n in range(2, 6):
    if n == 5:  # one clip's source changed: only its rows written anew
        p = os.path.join(SRC, "whisper", ids[3] + ".npy")
        np.save(p, np.load(p)[::-1].copy() * 2)
    convert(lists[n], DS, mods[n], "--segments")
    twins[n] = os.path.join(WORK, "twin%d" % n)
    convert(lists[n], twins[n], mods[n])
got += [{k: v.copy() for k, v in b.items()} for b in it]
got += [{k: v.copy() for k, v in b.items()} for b in early]
early.close()
same_batches(got, batches(twins[1], **base), "a loader of version 1 while versions 2-5 were committed")
man = clipshard.Dataset(DS).manifest
assert man["version"] == 2 and man["dataset_version"] == 5, man.get("dataset_version")

# Every version byte-equal to its twin, in every read mode.
modes = 0
for n in range(1, 6):
    segs = Drawn(DS, window=5, hold=0, version=None if n == 5 else n)
    assert segs.versions == {"ds": n}, segs.versions
    if n >= 2:
        assert any(not r["runs"].flat for r in segs.sources[0].mods if not r["held"]), "version %d: nothing in segments" % n
    segs.close()
    grid = itertools.product([False, True], [0, "64MiB"], [5, 21], ["tile", "random"]) if n in (3, 4) else \
        [(False, 0, 5, "tile"), (True, 0, 7, "random")]
    for read, hold, W, samp in grid:
        kw = dict(base, window=W, hold=hold, read=read, sampling=samp, threads=3, prefetch=1)
        if samp == "random":
            kw["per_clip"] = 2
        same_batches(batches(DS, version=n, **kw), batches(twins[n], **kw), (n, read, hold, W, samp))
        modes += 1
kw = dict(base, block=1 << 10, batch_size=5)
same_batches(batches(DS, **kw), batches(twins[5], **kw), "small blocks")

# Two ranks of DrawnReader, and a mix of sources.
for ds, tw in ((DS, twins[4]),):
    a, b = Drawn(ds, window=6, hold=0, version=4), Drawn(tw, window=6, hold=0)
    for rank in (0, 1):
        ra = list(DrawnReader(a, 1, rank=rank, world_size=2, batch_size=3, threads=2))
        rb = list(DrawnReader(b, 1, rank=rank, world_size=2, batch_size=3, threads=2))
        same_batches(ra, rb, ("rank", rank))
    a.close()
    b.close()
mix = dict(base, window=5)
same_batches(batches({"a": DS, "b": twins[3]}, version={"a": 3}, **mix), batches({"a": twins[3], "b": twins[3]}, **mix), "mixed")

# A state of version 3 loaded into a loader made on version 5.
kw = dict(base, epochs=[0, 1, 2])
ld = clipshard.Loader(dataset=DS, version=3, **kw)
it = iter(ld)
for _ in range(2):
    next(it)
st = ld.state_dict()
ld.close()
assert st["versions"] == {"ds": 3}, st
ld = clipshard.Loader(dataset=DS, **kw)
assert ld.list.drawn.versions == {"ds": 5}
ld.load_state_dict(st)
rest = [{k: v.copy() for k, v in b.items()} for e in range(3) for b in ld]
ld.close()
tw = clipshard.Loader(dataset=twins[3], **kw)
tw.load_state_dict(dict(st, id=tw.list.drawn.identity))
same_batches(rest, [{k: v.copy() for k, v in b.items()} for e in range(3) for b in tw], "resumed on version 3")
tw.close()
p = Drawn(DS, window=5, version=2)
q = pickle.loads(pickle.dumps(p))
assert q.versions == {"ds": 2} and q.identity == p.identity
r = DrawnReader(Drawn(DS, window=5), 0)
refused(lambda: r.load_state_dict(DrawnReader(p, 0).state_dict()), "version=2", "2 of ds", "5 of ds")
q.close()

# Dropped versions; a dataset converted again in place.
on2 = clipshard.Loader(dataset=DS, version=2, **base)
it = iter(on2)
next(it)
subprocess.run([BIN, "convert", "--quiet", "--keep", "2", "--out", DS], check=True, capture_output=True)
for _ in it:  # (the epoch begun is read on: its files are open)
    pass
refused(lambda: [None for _ in on2], "version 2", "kept: 4, 5")
on2.close()
refused(lambda: Drawn(DS, window=5, version=2), "version 2 is not kept", "kept: 4, 5")
same_batches(batches(DS, version=4, **base), batches(twins[4], **base), "version 4 after the drop")
on5 = clipshard.Loader(dataset=DS, **base)
it = iter(on5)
next(it)
back = os.path.join(WORK, "grown")
shutil.copytree(DS, back, symlinks=True)
convert(lists[5], DS, mods[5])  # (without --segments: one segment again, the versions dropped)
for _ in it:
    pass
refused(lambda: [None for _ in on5], "converted again")
on5.close()

# Hostile datasets in segments.
def hostile(edit, *words):
    bad = os.path.join(WORK, "bad")
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(back, bad, symlinks=True)
    edit(bad, clipshard.Dataset(back).manifest)
    refused(lambda: Drawn(bad, window=5, hold=0), *words)


def far_where(d, m):
    wp = os.path.join(d, m["files"]["where"])
    w = np.load(wp)
    w[len(w) // 2, 0, 1] = 1 << 40
    np.save(wp, w)
    sums = os.path.join(d, m["files"]["sha256sums"])  # (the range is checked, not only the sum)
    h = hashlib.sha256(open(wp, "rb").read()).hexdigest()
    lines = [(h + "  " + ln[66:]) if ln.endswith(m["files"]["where"]) else ln for ln in open(sums).read().splitlines()]
    open(sums, "w").write("".join(ln + "\n" for ln in lines))


def blob_of(m):
    return next(b["file"] for x in m["modalities"] for b in x["blobs"] if b["file"].startswith("segments/"))


def fifo(d, m):
    os.unlink(os.path.join(d, blob_of(m)))
    os.mkfifo(os.path.join(d, blob_of(m)))


def linked(d, m):
    seg = os.path.dirname(os.path.join(d, blob_of(m)))
    shutil.move(seg, os.path.join(WORK, "outside"))
    os.symlink(os.path.join(WORK, "outside"), seg)


hostile(far_where, "where.npy", "outside")
hostile(fifo, "not a regular file")
hostile(linked, "outside the folder")
print("ok: drawn epochs of 5 versions in segments byte-equal to their twins (%d modes), pinned, resumed, dropped, refused" % modes)
