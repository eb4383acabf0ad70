"""A dataset of format 2 (convert --segments, #61): usage:
check_format2.py DATASET TWIN

clipshard.Dataset reads DATASET clip by clip and modality by modality,
byte-equal to TWIN (a full convert of the same clip list), windows of
samples too, and again after a pickle round trip; a where.npy that
points outside its blobs, and a segment's blob that is a FIFO, are
refused with one ValueError naming them. Drawn
epochs (Loader(dataset=...)) of it are TWIN's, batch for batch
(check_drawn_format2.py checks them through five versions)."""
import os
import pickle
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402

ds, twin = sys.argv[1], sys.argv[2]
a, b = clipshard.Dataset(ds), clipshard.Dataset(twin)
assert a.manifest["version"] == 2 and b.manifest["version"] == 1, (a.manifest["version"], b.manifest["version"])
assert a.ids == b.ids and (a.index == b.index).all()
assert any(len(v) > 1 for v in a.segments.values()), "the dataset is one segment: nothing checked"


def same(x, y, what):
    assert x.dtype == y.dtype and x.shape == y.shape and (x.view(np.uint8) == y.view(np.uint8)).all(), what


back = pickle.loads(pickle.dumps(a))
for c in a.ids:
    x, y, z = a[c], b[c], back[c]
    assert x.keys() == y.keys()
    for m in x:
        same(x[m], y[m], (c, m))
        same(z[m], y[m], ("pickled", c, m))
    i = a.row(c)
    n = int(a.index[i][1])
    for s in sorted({(0, n), (n // 3, max(0, n - n // 3 - 1)), (max(0, n - 2), min(2, n))}):
        x, y = a.window((i, s[0], s[1])), b.window((i, s[0], s[1]))
        for m in x:
            same(x[m], y[m], ("window", c, s, m))

def refused(edit, words, what):
    """A copy of the dataset, edited, refused by Dataset with one
    ValueError holding every word."""
    with tempfile.TemporaryDirectory() as t:
        bad = os.path.join(t, "ds")
        shutil.copytree(ds, bad)
        words = edit(bad) + words
        try:
            clipshard.Dataset(bad)
        except ValueError as e:
            assert all(w in str(e) for w in words) and "\n" not in str(e), e
        else:
            raise SystemExit("%s was read" % what)


def far_where(bad):  # a where.npy pointing past a blob's rows
    wp = os.path.join(bad, a.manifest["files"]["where"])
    w = np.load(wp)
    w[len(w) // 2, 0, 1] = 1 << 40
    np.save(wp, w)
    return [wp]


def fifo(bad):  # a segment's blob replaced by a FIFO: never opened for reading (no hang)
    seg = next(b["file"] for m in a.manifest["modalities"] for b in m["blobs"] if b["file"].startswith("segments/"))
    os.unlink(os.path.join(bad, seg))
    os.mkfifo(os.path.join(bad, seg))
    return [seg]


refused(far_where, ["outside"], "a where.npy pointing outside its blob")
refused(fifo, ["not a regular file"], "a FIFO blob")

kw = dict(epochs=[0], window=5, batch_size=4, remainder="pad", hold=0)
drawn = [list(clipshard.Loader(dataset=d, **kw)) for d in (ds, twin)]
assert len(drawn[0]) == len(drawn[1]) > 0
for x, y in zip(*drawn):
    for m in x:
        same(x[m], y[m], ("drawn", m))
print("ok: format 2 read by Dataset and drawn epochs (%d clips, equal to a full convert)" % len(a.ids))
