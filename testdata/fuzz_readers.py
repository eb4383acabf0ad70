#!/usr/bin/env python3
"""Fuzz the Python readers with mutated copies of the folders they read.

    python3 testdata/fuzz_readers.py CASES SEED DATASET_DIR EPOCHS_DIR...

Each case copies one of the folders (DATASET_DIR, a dataset convert wrote;
each EPOCHS_DIR, epochs shuffle wrote, plain or mixed), changes one file
of it at random, and reads the copy the way a trainer does: load_epochs,
an EpochReader over every batch of epoch 0, a Loader (read-ahead thread,
2 read threads) over epoch 0 and over a replay of it with shards mixed;
for the dataset, Dataset (every clip, and a window of each) and epochs
drawn from it (a Loader with dataset=, mapped and read a window a pread;
in a quarter of the cases mixed with an unchanged copy); where torch
imports (FUZZ_TORCH=0: not), also clipshard.torch's EpochDataset through
a DataLoader and its Loader casting to float32. A change is
one of:

- in a JSON manifest (epochs.json, dataset.json): a value somewhere in it
  replaced (by another type, a number out of range, a path out of the
  folder, a dtype numpy reads otherwise, ...), a key dropped or added, a
  list cut or an element repeated; or its bytes cut or flipped;
- in a .npy file (a shard, a blob, index.npy): bytes of its header flipped
  or set, its header length changed, the file cut or lengthened; in
  index.npy and a shard's samples, any byte (they are the offsets and
  counts the readers index with).

A twentieth of the cases change a BLOCKSUMS file instead (made here, as
FORMAT.md says push makes it, of DATASET_DIR's blobs), which the bucket
reader's parser (clipshard._bucket.BlockSums) must take or refuse with a
ValueError naming it. A tenth change a Loader's state_dict (saved after
its first batch; a value replaced, a key dropped, ...) and load it into a
new Loader, which must read on or raise ValueError.

Every case must end within FUZZ_TIMEOUT seconds (20) with the copy read through or
a ValueError whose message names the copy's folder (a file in it); any
other exception, a hang, a crash (the last line printed names the case) or
an allocation past the address-space cap (RLIMIT_AS, 8 GiB: a reader
trusting a size it read) fails. Prints "ok: fuzz N cases (R read through,
V refused)" or the failing case and its traceback, exit 1. The copies
are hard links (a change writes a new file in place of the link), and
the original folders are checked against their SHA256SUMS at the end.
Deterministic for a SEED: case k's change is drawn from SEED and k alone, so
FUZZ_ONLY=k reruns case k by itself; FUZZ_VERBOSE=1 prints each case's
outcome (read through, or the refusal); FUZZ_REPORT=1 prints each kind
of failure once and reads on.
"""
import functools
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from clipshard import Dataset, EpochReader, Loader, _bucket, load_epochs  # noqa: E402

TIMEOUT = float(os.environ.get("FUZZ_TIMEOUT", "20"))
_torch: Any = None
_ct: Any = None
if os.environ.get("FUZZ_TORCH", "1") != "0":
    try:
        import torch as _torch  # noqa: E402
    except ImportError:
        _torch = None
    else:
        import clipshard.torch as _ct  # noqa: E402


class Hung(Exception):
    pass


def _alarm(*_):
    raise Hung()


HOSTILE = [None, True, False, 0, -1, 1, 2, 7, 255, 2 ** 31, 2 ** 32 + 1, 2 ** 53 + 1, 2 ** 63 - 1, 2 ** 63, -2 ** 63, 2 ** 64,
           10 ** 30, 0.5, -0.0, 1e308, float("nan"), float("inf"), "", "x", "0", "-1", "../x", "/etc/passwd", "a/../../b",
           "a\u0000b", "<f2", "<f4", ">f2", "|u1", "<i8", "|O", "<U4", "V8", "<c8", "epoch-0000", "whisper.npy", "index.npy",
           "x" * 5000, [], {}, [[]], [0], [-1], [2 ** 40], [0, 0, 0], {"a": 1}, list(range(300))]


def _nodes(v, path=()):
    """Every (path, value) in a JSON tree."""
    yield path, v
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _nodes(x, path + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _nodes(x, path + (i,))


def _get(v, path):
    for p in path:
        v = v[p]
    return v


def mutate_json(rng, b):
    """One change of a JSON manifest's bytes b; (new bytes, what)."""
    if rng.random() < 0.15:
        return mutate_bytes(rng, b, len(b), anywhere=True)
    m = json.loads(b)
    nodes = list(_nodes(m))
    path, v = rng.choice(nodes[1:])
    parent, key = _get(m, path[:-1]), path[-1]
    r = rng.random()
    if r < 0.5:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and rng.random() < 0.5:
            new = rng.choice([v + 1, v - 1, v * 2, -v, v // 2 if isinstance(v, int) else v / 2, v + 4096])
        else:
            new = rng.choice(HOSTILE)
        parent[key] = new
        what = "%s = %r" % ("/".join(map(str, path)), new if not isinstance(new, (str, list)) or len(new) < 40 else type(new).__name__ + " of %d" % len(new))
    elif r < 0.65 and isinstance(parent, dict):
        del parent[key]
        what = "%s dropped" % "/".join(map(str, path))
    elif r < 0.75 and isinstance(v, list) and v:
        n = rng.randrange(len(v))
        del v[n:]
        what = "%s cut to %d" % ("/".join(map(str, path)), n)
    elif r < 0.85 and isinstance(v, list) and v:
        i = rng.randrange(len(v))
        v.insert(rng.randrange(len(v) + 1), json.loads(json.dumps(v[i])))
        what = "%s: element %d repeated" % ("/".join(map(str, path)), i)
    elif isinstance(v, dict):
        k = rng.choice(["extra", "name", "file", "epoch", "shards", "size", "rows"])
        v[k] = rng.choice(HOSTILE)
        what = "%s/%s = %r (added or replaced)" % ("/".join(map(str, path)), k, v[k] if not isinstance(v[k], (str, list)) or len(v[k]) < 40 else "...")
    else:
        # (swap with another node of the same manifest: a consistent-looking lie)
        other = rng.choice(nodes[1:])[1]
        parent[key] = json.loads(json.dumps(other))
        what = "%s = another node's value" % "/".join(map(str, path))
    return json.dumps(m, indent=1).encode(), what


def header_len(b):
    if len(b) >= 10 and b[:6] == b"\x93NUMPY":
        at = 10 if b[6] == 1 else 12
        return min(len(b), at + int.from_bytes(b[8:at], "little"))
    return min(len(b), 128)


def mutate_bytes(rng, b, region, anywhere=False):
    """One change of a file's bytes: in its first `region` bytes (all of
    them with anywhere), or its length."""
    b = bytearray(b)
    r = rng.random()
    if r < 0.45 and len(b):
        n = rng.choice([1, 1, 2, 4])
        at = []
        for _ in range(n):
            # (in a header most often among its first 128 bytes, the dict:
            # the rest is the padding to 4096 convert writes)
            top = len(b) if anywhere else max(1, min(region if rng.random() < 0.3 else 128, len(b)))
            i = rng.randrange(top)
            b[i] = rng.randrange(256) if rng.random() < 0.5 else b[i] ^ (1 << rng.randrange(8))
            at.append(i)
        return bytes(b), "bytes %s changed" % at
    if r < 0.55 and len(b) >= 12 and b[:6] == b"\x93NUMPY":
        at = 10 if b[6] == 1 else 12
        n = rng.choice([0, 1, 4, 118, 65535, int.from_bytes(b[8:at], "little") + rng.choice([-16, -1, 1, 16, 64])])
        b[8:at] = (n % (1 << (8 * (at - 8)))).to_bytes(at - 8, "little")
        return bytes(b), "header length = %d" % n
    if r < 0.65 and len(b) >= 7 and b[:6] == b"\x93NUMPY":
        b[6] = rng.choice([0, 2, 3, 9])
        return bytes(b), "version %d" % b[6]
    if r < 0.85:
        n = rng.randrange(len(b) + 1) if rng.random() < 0.5 else max(0, len(b) - rng.choice([1, 2, 8, 64, 4096]))
        return bytes(b[:n]), "cut to %d of %d bytes" % (n, len(b))
    n = rng.choice([1, 2, 8, 4096, 65536])
    return bytes(b) + bytes(rng.randrange(256) for _ in range(min(n, 64))) * (n // min(n, 64)), "%d bytes added" % n


def files_of(d):
    out = []
    for root, _, names in os.walk(d):
        for n in names:
            out.append(os.path.relpath(os.path.join(root, n), d))
    return sorted(out)


def mutate(rng, d):
    """One change of one file of folder d; its description."""
    names = [n for n in files_of(d) if n.endswith((".json", ".npy"))]
    # (the manifests and the index more often than any one shard)
    weights = [8 if n.endswith(".json") else 4 if n.endswith(("index.npy", "samples.npy")) else 1 for n in names]
    rel = rng.choices(names, weights)[0]
    p = os.path.join(d, rel)
    b = open(p, "rb").read()
    if rel.endswith(".json"):
        nb, what = mutate_json(rng, b)
    elif rel.endswith(("index.npy", "samples.npy")) and rng.random() < 0.5:
        # (a value of the data: an offset, a count, a clip row)
        nb = bytearray(b)
        h = header_len(b)
        if len(b) - h >= 8:
            i = h + 8 * rng.randrange((len(b) - h) // 8)
            v = rng.choice([-1, 0, 1, 2 ** 31, 2 ** 62, -2 ** 63, int.from_bytes(b[i:i + 8], "little", signed=True) + rng.choice([-1, 1, 100])])
            nb[i:i + 8] = v.to_bytes(8, "little", signed=True)
            nb, what = bytes(nb), "value at byte %d = %d" % (i, v)
        else:
            nb, what = mutate_bytes(rng, b, header_len(b))
    else:
        nb, what = mutate_bytes(rng, b, header_len(b) + 16)
    os.remove(p)  # (a file of its own: the copy may share nothing with the original)
    with open(p, "wb") as f:
        f.write(nb)
    return "%s: %s" % (rel, what)


def read_epochs(ed):
    load_epochs(ed)
    n = 0
    for b in EpochReader(ed, 0, batch_size=4, remainder="pad"):
        n += len(b["samples"])
    with Loader(ed, epochs=[0], batch_size=4, prefetch=2, threads=2) as ld:
        for b in ld:
            n += len(b["samples"])
    with Loader(ed, epochs=[0, 3], batch_size=4, prefetch=2, threads=2, replay_seed=5, mix_shards=2) as ld:
        ld.set_epoch(3)
        for b in ld:
            n += len(b["samples"])
    if _torch is not None:
        # (torch's: EpochDataset through a DataLoader, workers 0, and the Loader casting to float32)
        for b in _torch.utils.data.DataLoader(_ct.EpochDataset(ed, 0, batch_size=4, remainder="pad"), batch_size=None):
            n += len(b["samples"])
        with _ct.Loader(ed, epochs=[0], batch_size=4, prefetch=2, dtype=_torch.float32) as ld:
            for b in ld:
                n += len(b["samples"])
    return n


def read_dataset(ds, other=None):
    """ds read by each reader of a dataset, each on its own: Dataset, the
    drawn Loader (mapped, and a pread a window) and torch's EpochDataset.
    A reader's refusal does not keep the others from the case (with
    Dataset first, its refusals hid the drawn reader's own checks: a rate
    of 1e999 raised OverflowError there). Raises the first refusal that
    does not name the case's folder, else the first."""
    n, refused = 0, []

    def dataset():
        d, k = Dataset(ds), 0
        for i in range(len(d)):
            k += sum(np.size(a) for a in d[i].values())  # (a per-clip modality's value may be a scalar)
            frames = int(d.index[i, 1])
            d.window((i, 0, min(3, frames)))
        return k

    def drawn(read):
        src, k = ds if other is None else {"a": ds, "b": other}, 0
        with Loader(dataset=src, epochs=1, window=5, seed=3, batch_size=4, prefetch=2, threads=2, read=read, remainder="pad") as ld:
            for b in ld:
                k += len(b["samples"])
        return k

    def torch_drawn():
        src, k = ds if other is None else {"a": ds, "b": other}, 0
        for b in _torch.utils.data.DataLoader(_ct.EpochDataset(dataset=src, epoch=0, window=5, seed=3, batch_size=4,
                                                               remainder="pad"), batch_size=None):
            k += len(b["samples"])
        return k
    readers = [dataset, functools.partial(drawn, False), functools.partial(drawn, True)]
    if _torch is not None:
        readers.append(torch_drawn)
    for read in readers:
        try:
            n += read()
        except ValueError as e:
            refused.append(e)
    if refused:
        folder = os.path.dirname(os.path.abspath(ds))
        raise next((e for e in refused if folder not in str(e)), refused[0])
    return n


def _loader(d, drawn):
    if drawn:
        return Loader(dataset=d, epochs=[0, 1], window=5, seed=3, batch_size=4, prefetch=2, threads=2)
    return Loader(d, epochs=[0, 1], batch_size=4, prefetch=2, threads=2)


def state_case(rng, d, drawn):
    """A Loader's state after its first batch, changed; (the change, a
    function reading a new Loader on from it)."""
    with _loader(d, drawn) as ld:
        next(iter(ld))
        st = ld.state_dict()
    b = json.dumps(st, default=int).encode()
    nb, what = mutate_json(rng, b)
    try:
        bad = json.loads(nb)
    except ValueError:
        bad = nb.decode("latin-1")  # (a state that is not even a dict)

    def run():
        with _loader(d, drawn) as ld:
            ld.load_state_dict(bad)
            for e in list(ld.epochs):
                for _ in ld:
                    pass
    return "state: " + what, run


def blocksums(ds, block=64 << 10, version=2):
    """A BLOCKSUMS of ds's .npy files (docs/FORMAT.md: a JSON line, then the
    sha256 of each block of each file, in name order; version 2 with each
    file's etag)."""
    files, digests = [], b""
    for n in sorted(x for x in os.listdir(ds) if x.endswith(".npy")):
        b = open(os.path.join(ds, n), "rb").read()
        files.append({"name": n, "size": len(b), "sha256": hashlib.sha256(b).hexdigest(),
                      "head": hashlib.sha256(b[:4096]).hexdigest()})
        if version == 2:
            files[-1]["etag"] = hashlib.md5(b).hexdigest()
        digests += b"".join(hashlib.sha256(b[i: i + block]).digest() for i in range(0, len(b), block))
    head = {"format": "clipshard.blocksums", "version": version, "block": block, "digests_sha256": hashlib.sha256(digests).hexdigest(),
            "files": files}
    return json.dumps(head).encode() + b"\n" + digests


def blocksums_case(rng, ds):
    b = blocksums(ds, version=rng.choice((1, 2)))
    line, _, digests = b.partition(b"\n")
    if rng.random() < 0.7:
        nl, what = mutate_json(rng, line)
        nb = nl.replace(b"\n", b"") + b"\n" + digests
    else:
        nb, what = mutate_bytes(rng, b, len(b), anywhere=True)
    return "BLOCKSUMS: " + what, functools.partial(_bucket.BlockSums, nb, "BLOCKSUMS of the case")


def fail(k, what, msg, seen):
    """A failing case: exit 1, or with FUZZ_REPORT=1 each new kind of
    failure (the exception and where it was raised) printed once and the
    next case read."""
    if not os.environ.get("FUZZ_REPORT"):
        print("FAIL case %d (%s): %s" % (k, what, msg))
        traceback.print_exc()
        sys.exit(1)
    tb = traceback.extract_tb(sys.exc_info()[2])
    key = (msg.split(":")[0], tb[-1].filename, tb[-1].lineno) if tb else (msg, "", 0)
    if key not in seen:
        seen[key] = k
        print("FAIL case %d (%s): %s\n   at %s:%s %s" % (k, what, msg[:300], key[1], key[2], tb[-1].line if tb else ""))


def _link(src, dst):
    """A file of the copy: a hard link (the change removes the file it
    changes and writes a new one: the original is never written), or a
    copy across file systems."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def copy(src, dst):
    shutil.copytree(src, dst, copy_function=_link)


def sums_hold(d):
    """d's files still those its SHA256SUMS lists (the copies are hard
    links: a change written into one would have changed the original)."""
    for line in open(os.path.join(d, "SHA256SUMS")):
        want, rel = line.rstrip("\n").split("  ", 1)
        got = hashlib.sha256(open(os.path.join(d, rel), "rb").read()).hexdigest()
        if got != want:
            print("FAIL: %s changed while its copies were read" % os.path.join(d, rel))
            sys.exit(1)


def main():
    cases, seed, ds, edirs = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    only = os.environ.get("FUZZ_ONLY")
    cap = 8 << 30
    resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
    signal.signal(signal.SIGALRM, _alarm)
    # The unchanged folders read first: a case that fails must fail because of its change.
    for ed in edirs:
        read_epochs(ed)
    read_dataset(ds)
    tmp = tempfile.mkdtemp(prefix="fuzz-readers-")
    read_through = refused = failed = 0
    seen = {}
    try:
        for k in range(cases) if only is None else [int(only)]:
            rng = random.Random("%d/%d" % (seed, k))
            case = os.path.join(tmp, "case-%d" % k)
            pick = rng.randrange(len(edirs) + 1)
            src = ds if pick == len(edirs) else edirs[pick]
            d = os.path.join(case, "ds" if src == ds else "epochs")
            copy(src, d)
            r = rng.random()
            if r < 0.05:
                what, run = blocksums_case(rng, ds)
                named = "BLOCKSUMS of the case"
            elif r < 0.15:
                what, run = state_case(rng, d, src == ds)
                what = "%s: %s" % (os.path.basename(d), what)
                named = ""  # (a state names no file: any ValueError)
            else:
                what = "%s: %s" % (os.path.basename(d), mutate(rng, d))
                named = case
                if src != ds:
                    run = functools.partial(read_epochs, d)
                elif rng.random() < 0.25:
                    other = os.path.join(case, "other")
                    copy(ds, other)
                    what += " (mixed with an unchanged copy)"
                    run = functools.partial(read_dataset, d, other)
                else:
                    run = functools.partial(read_dataset, d)
            print("case %d: %s" % (k, what), flush=True)
            t0 = time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, TIMEOUT)
            try:
                run()
                read_through += 1
                if os.environ.get("FUZZ_VERBOSE"):
                    print("  read through")
            except ValueError as e:
                signal.setitimer(signal.ITIMER_REAL, 0)
                if named not in str(e):
                    fail(k, what, "a ValueError that names no file of the folder: %s" % e, seen)
                    failed += 1
                refused += 1
                if os.environ.get("FUZZ_VERBOSE"):
                    print("  refused: %s" % str(e).replace(case, "CASE")[:200])
            except Hung:
                fail(k, what, "still reading after %.0f s" % TIMEOUT, seen)
                failed += 1
            except BaseException as e:  # noqa: B902 (anything else is a bug of the reader)
                signal.setitimer(signal.ITIMER_REAL, 0)
                fail(k, what, "%s: %s after %.2f s" % (type(e).__name__, e, time.monotonic() - t0), seen)
                failed += 1
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            shutil.rmtree(case)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for d in [ds] + edirs:
        sums_hold(d)
    if failed:
        print("FAIL: %d of %d cases failed (%d kinds)" % (failed, cases, len(seen)))
        sys.exit(1)
    print("ok: fuzz %d cases (%d read through, %d refused), seed %d; %s" % (
        cases if only is None else 1, read_through, refused, seed, "with torch %s" % _torch.__version__ if _torch else "no torch"))


if __name__ == "__main__":
    main()
