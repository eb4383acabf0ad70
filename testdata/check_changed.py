"""Epochs whose dataset was converted again in place (#60.5): usage:
check_changed.py EDIR DATASET [ok]

Without "ok": EpochReader, Loader (numpy, and torch's where it imports)
and torch's EpochDataset each refuse EDIR with one ValueError naming the
epochs folder and the dataset. With "ok": each reads it through (the
dataset is the one the epochs were cut from, or is not there)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402

edir, ds = sys.argv[1], sys.argv[2]
ok = len(sys.argv) > 3 and sys.argv[3] == "ok"
readers = {
    "EpochReader": lambda: list(clipshard.EpochReader(edir, 0, batch_size=4)),
    "Loader": lambda: list(clipshard.Loader(edir, batch_size=4, epochs=[0])),
}
try:
    import clipshard.torch as ct
    readers["torch Loader"] = lambda: list(ct.Loader(edir, batch_size=4, epochs=[0]))
    readers["torch EpochDataset"] = lambda: list(ct.EpochDataset(edir, 0, batch_size=4))
except ImportError:
    pass
for name, read in readers.items():
    try:
        read()
    except ValueError as e:
        if ok:
            raise SystemExit("%s: refused epochs whose dataset is theirs (or gone): %s" % (name, e))
        msg = str(e)
        assert edir in msg and ds in msg and "converted again" in msg and "\n" not in msg, (name, msg)
        continue
    if not ok:
        raise SystemExit("%s: read epochs whose dataset was converted again" % name)
print("ok: changed %s (%s)" % ("read" if ok else "refused", ", ".join(readers)))
