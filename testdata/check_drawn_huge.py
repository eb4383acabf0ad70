"""Epochs drawn from a dataset with a clip of 4.6 GB (#38): a window's rows
past 2**31 and 2**32 bytes of the blob, and past 2**31 bytes of the clip,
come back as the rows the index says, through the memory map and through
preads (read=True), exactly once; and again with the dataset in two
blobs (format 2, #61: where.npy pointing past 2**32 bytes of the second).

    python check_drawn_huge.py

The blob is sparse: zeros except the rows the epochs' windows read, each
of which holds its own row number (int64) in its first and last 8 bytes.
Which rows those are comes from the plan's order (clip, start, valid: what
the batches' "samples" say too); where they are in the blob, from
index.npy and the header, computed here with Python's integers. A reader
that got an offset wrong reads zeros or another row's number."""

import json
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402
from clipshard.draw import Drawn  # noqa: E402

W, ROW = 15, 512  # float16 x 256 a frame: 512 bytes a row
LENGTHS = [1000, 9_000_000, 1000, 700]  # clip 1: 4.6 GB, from byte 0.5 MB of the blob
EPOCHS, PER_CLIP, B = [0, 1], 96, 40

d = tempfile.mkdtemp(prefix="clipshard-huge-")
try:
    lengths = np.array(LENGTHS, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    np.save(os.path.join(d, "index.npy"), np.stack([starts, lengths], axis=1))
    rows = int(lengths.sum())
    blob = os.path.join(d, "feat.npy")
    mm = np.lib.format.open_memmap(blob, mode="w+", dtype="<f2", shape=(rows, 256))  # (sparse: numpy writes its last byte)
    HDR = mm.offset
    assert os.path.getsize(blob) > 1 << 32
    man = {"format": "clipshard.dataset", "version": 1, "clips": len(LENGTHS), "frames": rows,
           "files": {"index": "index.npy"},
           "modalities": [{"name": "feat", "file": "feat.npy", "dtype": "<f2", "frame_shape": [256], "rate": 1,
                           "data_offset": HDR, "rows": rows, "size": os.path.getsize(blob)}]}
    with open(os.path.join(d, "dataset.json"), "w") as f:
        json.dump(man, f)

    kw = dict(window=W, seed=7, sampling="random", per_clip=PER_CLIP)
    plan = Drawn(d, **kw)
    want = {}
    for e in EPOCHS:
        o = plan.order(e)
        want[e] = sorted(zip(o.clip.tolist(), o.start.tolist()))
    plan.close()
    far = [s for e in EPOCHS for c, s in want[e] if c == 1 and (int(starts[1]) + s) * ROW > 1 << 31]
    farther = [s for s in far if (int(starts[1]) + s) * ROW > 1 << 32]
    assert len(far) > PER_CLIP // 2 and len(farther) >= 3, ("too few windows past 2 and 4 GiB to tell", len(far), len(farther))
    u = mm.view(np.uint8).reshape(rows, ROW)
    for e in EPOCHS:
        for c, s in want[e]:
            r = np.arange(int(starts[c]) + s, int(starts[c]) + s + W, dtype=np.int64)
            u[r, :8] = u[r, -8:] = r[:, None].view(np.uint8)
    # Format 2 (#61): clips 0 and 2 in a small first blob, clips 1 and 3
    # where they are in the huge one (its rows of clips 0 and 2 dead):
    # where.npy's rows past 2**32 bytes of the second blob.
    small = np.lib.format.open_memmap(os.path.join(d, "small.npy"), mode="w+", dtype="<f2", shape=(2000, 256))
    sv = small.view(np.uint8).reshape(2000, ROW)
    sv[:1000] = u[int(starts[0]): int(starts[0]) + 1000]
    sv[1000:] = u[int(starts[2]): int(starts[2]) + 1000]
    small.flush()
    SHDR = small.offset
    del sv, small
    mm.flush()
    del u, mm
    where = np.array([[[0, 0]], [[1, int(starts[1])]], [[0, 1000]], [[1, int(starts[3])]]], dtype=np.int64)
    np.save(os.path.join(d, "where.npy"), where)
    man2 = dict(man, version=2, dataset_version=2, files={"index": "index.npy", "where": "where.npy"})
    m2 = {k: v for k, v in man["modalities"][0].items() if k not in ("file", "data_offset", "size")}
    m2["blobs"] = [{"file": "small.npy", "rows": 2000, "data_offset": SHDR, "size": os.path.getsize(os.path.join(d, "small.npy"))},
                   {"file": "feat.npy", "rows": rows, "data_offset": HDR, "size": os.path.getsize(blob)}]
    man2["modalities"] = [m2]

    for fmt, read in ((1, False), (1, True), (2, False), (2, True)):
        if fmt == 2:
            with open(os.path.join(d, "dataset.json"), "w") as f:
                json.dump(man2, f)
        L = clipshard.Loader(dataset=d, epochs=EPOCHS, batch_size=B, remainder="partial", read=read, **kw)
        got = {e: [] for e in EPOCHS}
        for e in EPOCHS:
            L.set_epoch(e)
            for batch in L:
                smp = batch["samples"]
                x = np.ascontiguousarray(batch["feat"]).view(np.uint8).reshape(len(smp), W, ROW)
                for i, (c, s, v) in enumerate(smp[:, :3].tolist()):
                    assert v == W, (c, s, v)
                    got[e].append((c, s))
                    first = int(starts[c]) + s
                    tags = x[i, :, :8].copy().view(np.int64)[:, 0]
                    ends = x[i, :, -8:].copy().view(np.int64)[:, 0]
                    rows_ = np.arange(first, first + W, dtype=np.int64)
                    if not (np.array_equal(tags, rows_) and np.array_equal(ends, rows_) and not x[i, :, 8:-8].any()):
                        raise AssertionError("format %d read=%s epoch %d clip %d start %d (blob byte %d): rows %s, want %s"
                                             % (fmt, read, e, c, s, HDR + first * ROW, tags.tolist(), rows_.tolist()))
            assert sorted(got[e]) == want[e], ("format %d read=%s epoch %d: windows not exactly once" % (fmt, read, e))
        L.close()
    print("ok: drawn huge clip: %d windows an epoch; of two epochs' %d in the 4.6 GB clip, %d past 2 GiB of the blob and %d past 4 "
          "GiB; the map and preads, one blob and two (format 2)" % (len(want[0]), 2 * PER_CLIP, len(far), len(farther)))
finally:
    shutil.rmtree(d, ignore_errors=True)
