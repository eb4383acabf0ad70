"""Two datasets that hold the same version: usage:
check_same_dataset.py DS TWIN

clipshard.Dataset reads DS clip by clip and modality by modality
byte-equal to TWIN (either may be of format 1 or 2), and the epochs drawn
from both (Loader(dataset=...), a streamed and a held modality, in both
read modes) are the same batches. Prints "ok: ..." or raises."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402

ds, twin = sys.argv[1], sys.argv[2]
a, b = clipshard.Dataset(ds), clipshard.Dataset(twin)
assert a.ids == b.ids and (a.index == b.index).all(), "clip lists differ"


def same(x, y, what):
    assert x.dtype == y.dtype and x.shape == y.shape and (np.asarray(x).view(np.uint8) == np.asarray(y).view(np.uint8)).all(), what


for c in a.ids:
    x, y = a[c], b[c]
    assert x.keys() == y.keys(), (c, x.keys(), y.keys())
    for m in x:
        same(x[m], y[m], (c, m))
for read in (False, True):
    kw = dict(epochs=[0], window=5, batch_size=4, remainder="pad", hold=0, read=read)
    got = [[{k: v.copy() for k, v in bt.items()} for bt in clipshard.Loader(dataset=d, **kw)] for d in (ds, twin)]
    assert len(got[0]) == len(got[1]) > 0
    for x, y in zip(*got):
        for m in x:
            same(x[m], y[m], ("drawn", read, m))
print("ok: %d clips, the same rows and drawn batches" % len(a.ids))
