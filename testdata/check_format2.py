"""A dataset of format 2 (convert --segments) where the Python reader
reads format 1 only so far (#61): usage: check_format2.py DATASET

Dataset and Loader(dataset=...) (drawn epochs) each refuse it with one
ValueError naming the folder, format 2 and the fix (the same convert
without --segments), before any blob is opened."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402

ds = sys.argv[1]
readers = {
    "Dataset": lambda: clipshard.Dataset(ds),
    "Loader(dataset=)": lambda: list(clipshard.Loader(dataset=ds, epochs=[0], window=5, batch_size=4)),
}
for name, read in readers.items():
    try:
        read()
    except ValueError as e:
        msg = str(e)
        assert ds in msg and "format 2" in msg and "without --segments" in msg and "\n" not in msg, (name, msg)
        continue
    raise SystemExit("%s: read a format 2 dataset" % name)
print("ok: format 2 refused (%s)" % ", ".join(readers))
