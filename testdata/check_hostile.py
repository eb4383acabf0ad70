#!/usr/bin/env python3
"""The readers distrust the folders they read (issue #24, point 4; and the
no-silent-fallback cases of point 3).

    python3 testdata/check_hostile.py EPOCHS_DIR DATASET_DIR [MIXED_EPOCHS_DIR]

Each hostile folder is a copy of the given ones with one thing broken; the
reader (EpochReader: construct, then read every batch) or Dataset must
raise ValueError naming the file within 1 second (a hang or another
exception fails). MIXED_EPOCHS_DIR (shuffle --source ...) adds the cases of
the samples' source column. Prints "ok: hostile N cases" or raises.
"""
import io
import json
import os
import shutil
import signal
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from clipshard import Dataset, EpochReader, Loader  # noqa: E402

edir, ds = sys.argv[1], sys.argv[2]
tmp = tempfile.mkdtemp()
man0 = json.load(open(os.path.join(edir, "epochs.json")))
entry0 = man0["epochs"][0]
shard0 = sorted(entry0["shards"], key=lambda s: s["shard"])[0]
mod0 = man0["modalities"][0]["name"]


class Hung(Exception):
    pass


def alarm(*_):
    raise Hung()


signal.signal(signal.SIGALRM, alarm)
cases = 0


def copy(src):
    dst = tempfile.mkdtemp(dir=tmp)
    shutil.rmtree(dst)
    shutil.copytree(src, dst, symlinks=True)
    return dst


def rewrite_manifest(d, name, edit):
    p = os.path.join(d, name)
    m = json.load(open(p))
    edit(m)
    os.remove(p)
    with open(p, "w") as f:
        json.dump(m, f)


def expect(what, run, names):
    """run() must raise ValueError within 1 s, its message holding names
    (with HOSTILE_REPORT=1 in the environment, a case that does not is
    printed and the next one checked)."""
    global cases
    cases += 1
    if os.environ.get("HOSTILE_REPORT"):
        try:
            check(what, run, names)
        except Exception as e:
            print("FAILS: %s: %s" % (what, repr(e)[:160]))
        return
    check(what, run, names)


def check(what, run, names):
    t0 = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        run()
    except ValueError as e:
        signal.setitimer(signal.ITIMER_REAL, 0)
        took = time.monotonic() - t0
        msg = str(e)
        assert took < 1.0, (what, took, msg)
        for n in names:
            assert n in msg, (what, "message lacks %r" % n, msg)
        return
    except Hung:
        raise AssertionError("%s: hung" % what)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    raise AssertionError("%s: no error" % what)


def shard_file(d, name=None):
    return os.path.join(d, shard0["files"][name or mod0])


def save_npy(path, a):
    os.remove(path)
    with open(path, "wb") as f:
        np.save(f, a)


def header_only(path, dtype, shape):
    """path replaced by a .npy file of its header alone, saying dtype and
    shape (rows whose byte count overflows 64 bits, say: a parser
    multiplying in int64 makes it 0, and the empty file fits)."""
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": tuple(shape)})
    os.remove(path)
    with open(path, "wb") as out:
        out.write(f.getvalue())


HUGE = [1 << 32, 1 << 32]  # (a frame of 2^64 float16 values: 2^65 bytes, 0 in int64)


# -- the epochs folder ---------------------------------------------------

def read_all(d, **kw):
    READ(d, **kw)


def epochs_folder_cases():

    d = copy(edir)
    p = shard_file(d)
    os.remove(p)
    os.mkfifo(p)
    expect("a FIFO shard", lambda: read_all(d), [p, "FIFO"])

    d = copy(edir)
    p = os.path.join(d, "epochs.json")
    os.remove(p)
    os.mkfifo(p)
    expect("a FIFO epochs.json", lambda: read_all(d), [p, "FIFO"])

    d = copy(edir)
    p = os.path.join(d, "epochs.json")
    os.remove(p)
    os.symlink("/dev/zero", p)
    expect("epochs.json -> /dev/zero", lambda: read_all(d), [p, "character device"])

    d = copy(edir)
    p = os.path.join(d, "epochs.json")
    with open(p, "ab") as f:
        f.truncate(300 << 20)
    expect("a 300 MiB epochs.json", lambda: read_all(d), [p, "more than a manifest"])

    d = copy(edir)
    p = os.path.join(d, "epochs.json")
    with open(p, "w") as f:
        f.write("[" * 200000)
    expect("an epochs.json nested 200,000 deep", lambda: read_all(d), [p, "not JSON"])

    d = copy(edir)
    p = shard_file(d)
    a = np.load(p)
    save_npy(p, a[: max(1, len(a) * 5 // 8)])  # 40 of 64 rows, as numpy writes it
    expect("a shard with fewer samples than listed", lambda: read_all(d), [p, "the manifest says"])

    d = copy(edir)
    p = shard_file(d)
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) - 100)
    expect("a shard cut short", lambda: read_all(d), [p, "its header"])

    d = copy(edir)
    p = shard_file(d)
    save_npy(p, np.load(p).astype(np.float32))
    expect("a float32 shard", lambda: read_all(d), [p, "<f4", "<f2"])

    with open(os.path.join(tmp, "secret.npy"), "wb") as f:
        np.save(f, np.zeros(3))
    for bad in ("../secret.npy", os.path.join(tmp, "secret.npy"), "epoch-0000/../../secret.npy"):
        d = copy(edir)
        rewrite_manifest(d, "epochs.json", lambda m: m["epochs"][0]["shards"][0]["files"].__setitem__(mod0, bad))
        expect("shard path %s" % bad, lambda: read_all(d), [repr(bad)])

    d = copy(edir)
    p = shard_file(d)
    os.remove(p)
    os.symlink(os.path.join(tmp, "secret.npy"), p)
    expect("a shard symlinked outside", lambda: read_all(d), ["resolves outside"])

    d = copy(edir)
    rewrite_manifest(d, "epochs.json", lambda m: m["epochs"][0]["shards"][0].__setitem__("samples", 10**12))
    expect("10^12 samples in a shard", lambda: read_all(d), ["epochs.json", "10" + "0" * 11, "shard_samples"])

    d = copy(edir)
    rewrite_manifest(d, "epochs.json", lambda m: m["epochs"][0].__setitem__("samples", 10**12))
    expect("10^12 samples in the epoch", lambda: read_all(d), ["epochs.json", "the epoch says"])

    # Every column of a samples file in range (round 4, point 8).
    for col, bad, words in ((0, -5, "clip -5"), (0, 10**15, "clip 1000000000000000; its source has"), (1, -3, "start -3"),
                            (2, 10**9, "valid 1000000000 frames"), (2, man0["window"] - 1, "valid %d frames" % (man0["window"] - 1))):
        d = copy(edir)
        p = shard_file(d, "samples")
        a = np.load(p)
        a[len(a) // 2, col] = bad
        save_npy(p, a)
        expect("a sample's %s" % words, lambda: read_all(d), [p, "sample %d: %s" % (len(a) // 2, words)])

    # A modality whose frames overflow 64 bits, in epochs.json and in the
    # shard's header alike (the shard then holds its header alone).
    d = copy(edir)
    rewrite_manifest(d, "epochs.json", lambda m: m["modalities"][0].__setitem__("frame_shape", HUGE))
    p = shard_file(d)
    header_only(p, man0["modalities"][0]["dtype"], [shard0["samples"], man0["modalities"][0]["window_rows"]] + HUGE)
    expect("frames of 2^65 bytes", lambda: read_all(d), ["epochs.json", "more than any reader holds"])
    # The shard alone saying so (numpy can write such a header: its data would be 2^65 bytes).
    d = copy(edir)
    p = shard_file(d)
    header_only(p, man0["modalities"][0]["dtype"], [shard0["samples"], man0["modalities"][0]["window_rows"]] + HUGE)
    expect("a shard header of frames of 2^65 bytes", lambda: read_all(d), [p, "its header"])

    if len(entry0["shards"]) > 1:
        d = copy(edir)
        rewrite_manifest(d, "epochs.json", lambda m: sorted(m["epochs"][0]["shards"], key=lambda s: s["shard"])[1].__setitem__("first", 1))
        expect("shards not contiguous", lambda: read_all(d), ["epochs.json", "starts at sample 1"])


# Each reader: EpochReader; Loader reading in the consumer (prefetch=0)
# and in its thread (the thread's error is raised by the consumer).
def by_reader(d, **kw):
    for _ in EpochReader(d, entry0["epoch"], batch_size=2, **kw):
        pass


def by_loader(prefetch):
    def read(d, **kw):
        with Loader(d, entry0["epoch"], batch_size=2, prefetch=prefetch, **kw) as ld:
            for _ in ld:
                pass
    return read


for READ in (by_reader, by_loader(0), by_loader(3)):
    epochs_folder_cases()


def mixed_cases(medir):
    mman = json.load(open(os.path.join(medir, "epochs.json")))
    e0 = mman["epochs"][0]
    sh0 = sorted(e0["shards"], key=lambda s: s["shard"])[0]
    n = len(mman["sources"])

    def read(d):
        for b in READ_M(d, e0["epoch"]):
            pass

    for bad in (n, -1):
        d = copy(medir)
        p = os.path.join(d, sh0["files"]["samples"])
        a = np.load(p)
        a[len(a) // 2, 3] = bad
        save_npy(p, a)
        expect("a sample of source %d of %d" % (bad, n), lambda: read(d), ["source %d" % bad, "%d sources" % n])

    d = copy(medir)
    p = os.path.join(d, sh0["files"]["samples"])
    a = np.load(p)
    a[1, 0] = mman["sources"][int(a[1, 3])]["clips"]  # one past its own source's clips
    save_npy(p, a)
    expect("a sample's clip past its source's", lambda: read(d), [p, "sample 1: clip"])

    d = copy(medir)
    p = os.path.join(d, sh0["files"]["samples"])
    save_npy(p, np.load(p)[:, :3].copy())  # a version-2 samples file in a mixed folder
    expect("a samples file of 3 columns in a mixed folder", lambda: read(d), [p])

    for what, edit in (("no sources", lambda m: m.pop("sources")),
                       ("two sources of one name", lambda m: m["sources"].append(dict(m["sources"][0]))),
                       ("a source without a name", lambda m: m["sources"][0].pop("name"))):
        d = copy(medir)
        rewrite_manifest(d, "epochs.json", edit)
        expect("version 3 with " + what, lambda: read(d), ["epochs.json", "named sources"])


if len(sys.argv) > 3:
    def _m_reader(d, e):
        return EpochReader(d, e, batch_size=5)

    def _m_loader(prefetch):
        def read(d, e):
            with Loader(d, e, batch_size=5, prefetch=prefetch) as ld:
                yield from ld
        return read

    for READ_M in (_m_reader, _m_loader(0), _m_loader(3)):
        mixed_cases(sys.argv[3])

    # A state of another folder with the same seed and size but other
    # weights is refused (its epoch_id differs; round 4, point 11).
    mdir = sys.argv[3]
    other = copy(mdir)
    m0 = json.load(open(os.path.join(mdir, "epochs.json")))["epochs"][0]
    rewrite_manifest(other, "epochs.json", lambda m: m["epochs"][0]["weights"].update(
        {k: v * 2 + 1 for k, v in m["epochs"][0]["weights"].items()}))
    st = EpochReader(mdir, m0["epoch"], batch_size=5).state_dict()
    expect("a reader state of other weights", lambda: EpochReader(other, m0["epoch"], batch_size=5).load_state_dict(st), ["epoch_id"])
    lst = Loader(mdir, m0["epoch"], batch_size=5).state_dict()
    expect("a loader state of other weights", lambda: Loader(other, m0["epoch"], batch_size=5).load_state_dict(lst), ["epoch_id"])

# -- no silent fallback --------------------------------------------------

expect("world_size without rank", lambda: EpochReader(edir, entry0["epoch"], world_size=2), ["without rank"])
expect("mix_mem below two shards", lambda: EpochReader(edir, entry0["epoch"], mix_mem=1), ["mix_mem"])
expect("read=True with mixing", lambda: EpochReader(edir, entry0["epoch"], mix_shards=2, read=True), ["read=True"])
expect("Loader: world_size without rank", lambda: Loader(edir, world_size=2), ["without rank"])
expect("Loader: mix_mem below two shards", lambda: Loader(edir, [0, 99], replay_seed=1, mix_mem=1), ["mix_mem"])
for bad in ("infGiB", "nanM", "-1GiB", "1e400", "GiB", True):  # (inf raised OverflowError; -1GiB was taken)
    expect("mix_mem=%r" % (bad,), lambda: EpochReader(edir, entry0["epoch"], mix_mem=bad), [repr(bad), "want a size in bytes"])
    expect("Loader(dataset=..., buffer=%r)" % (bad,), lambda: Loader(dataset=ds, epochs=[0], window=3, buffer=bad), [repr(bad), "want a size"])
    expect("Loader(dataset=..., hold=%r)" % (bad,), lambda: Loader(dataset=ds, epochs=[0], window=3, hold=bad), [repr(bad), "want a size"])
    expect("Loader(dataset=..., block=%r)" % (bad,), lambda: Loader(dataset=ds, epochs=[0], window=3, block=bad), [repr(bad), "want a size"])
expect("Loader: an epoch not materialised, no replay_seed", lambda: Loader(edir, [99]), ["not materialised", "replay_seed"])
expect("Loader: a state of another epochs folder",
       lambda: Loader(edir).load_state_dict(dict(Loader(edir).state_dict(), seed=-1)), ["seed"])
# States are checked whole: version, exact types (round 4, point 11).
_rst = EpochReader(edir, entry0["epoch"], batch_size=2).state_dict()
_lst = Loader(edir).state_dict()
for what, st, words in (("version 99", dict(_rst, version=99), "version 99"), ("a float seed", dict(_rst, seed=float(_rst["seed"])), "seed"),
                        ("a float samples", dict(_rst, samples=float(_rst["samples"])), "samples"),
                        ("a bool consumed", dict(_rst, consumed=True), "consumed"), ("another epoch_id", dict(_rst, epoch_id="0" * 32), "epoch_id"),
                        ("no epoch_id in version 2", {k: v for k, v in _rst.items() if k != "epoch_id"}, "epoch_id")):
    expect("EpochReader: a state with " + what, lambda: EpochReader(edir, entry0["epoch"], batch_size=2).load_state_dict(st), [words])
for what, st, words in (("version 99", dict(_lst, version=99), "version 99"), ('done "no"', dict(_lst, done="no"), "done"),
                        ("a float seed", dict(_lst, seed=float(_lst["seed"])), "seed"), ("a string consumed", dict(_lst, consumed="3"), "consumed"),
                        ("another epoch_id", dict(_lst, epoch_id="0" * 32), "epoch_id"), ("a float replay_seed", dict(_lst, replay_seed=1.0), "replay_seed")):
    expect("Loader: a state with " + what, lambda: Loader(edir).load_state_dict(st), [words])
# A state of version 1 (before epoch_id) still loads.
Loader(edir).load_state_dict(dict({k: v for k, v in _lst.items() if k != "epoch_id"}, version=1))
EpochReader(edir, entry0["epoch"], batch_size=2).load_state_dict(dict({k: v for k, v in _rst.items() if k != "epoch_id"}, version=1))
# A padded epoch's last state loads, and means the epoch is done.
def padded_end():
    rd = EpochReader(edir, entry0["epoch"], batch_size=7, remainder="pad")
    for _ in rd:
        pass
    assert rd.consumed > rd.samples or rd.samples % 7 == 0, (rd.consumed, rd.samples)
    again = EpochReader(edir, entry0["epoch"], batch_size=3, world_size=2, rank=1)
    again.load_state_dict(rd.state_dict())
    assert len(again) == 0 and list(again) == [], len(again)


if os.environ.get("HOSTILE_REPORT"):
    try:
        padded_end()
    except Exception as e:
        print("FAILS: a padded epoch's last state: %s" % repr(e)[:160])
else:
    padded_end()

# A file system that cannot map (some FUSE and network mounts: ENODEV):
# EpochReader's default map raises naming the shard; read=True reads it.
import errno  # noqa: E402
from clipshard import _files as _f  # noqa: E402
_real_map = _f.np.memmap


def _no_map(*a, **k):
    raise OSError(errno.ENODEV, "No such device")


_f.np.memmap = _no_map
try:
    try:
        list(EpochReader(edir, entry0["epoch"], batch_size=4))
        raise AssertionError("EpochReader on a file system that cannot map: taken")
    except OSError as e:
        assert e.errno == errno.ENODEV and "cannot be memory-mapped" in str(e) and edir in str(e) and "read=True" in str(e), str(e)
    assert len(list(EpochReader(edir, entry0["epoch"], batch_size=4, read=True))) > 0
    cases += 1
finally:
    _f.np.memmap = _real_map

# -- Dataset -------------------------------------------------------------

dman = json.load(open(os.path.join(ds, "dataset.json")))
for bad in ("../secret.npy", os.path.join(tmp, "secret.npy")):
    d = copy(ds)
    rewrite_manifest(d, "dataset.json", lambda m: m["modalities"][0].__setitem__("file", bad))
    expect("dataset blob path %s" % bad, lambda: Dataset(d), [repr(bad)])
    d = copy(ds)
    rewrite_manifest(d, "dataset.json", lambda m: m["files"].__setitem__("index", bad))
    expect("dataset index path %s" % bad, lambda: Dataset(d), [repr(bad)])
d = copy(ds)
p = os.path.join(d, dman["modalities"][0]["file"])
os.remove(p)
os.mkfifo(p)
expect("a FIFO blob", lambda: Dataset(d), [p, "FIFO"])
d = copy(ds)
p = os.path.join(d, dman["modalities"][0]["file"])
with open(p, "r+b") as f:
    f.truncate(os.path.getsize(p) - 2)
expect("a blob cut short", lambda: Dataset(d), [p])
d = copy(ds)
rewrite_manifest(d, "dataset.json", lambda m: m.__setitem__("clips", m["clips"] + 1))
expect("dataset.json claims a clip more", lambda: Dataset(d), ["index.npy", "the manifest says"])

d = copy(ds)
rewrite_manifest(d, "dataset.json", lambda m: m["modalities"][0].__setitem__("frame_shape", HUGE))
p = os.path.join(d, dman["modalities"][0]["file"])
header_only(p, dman["modalities"][0]["dtype"], [np.load(os.path.join(ds, dman["modalities"][0]["file"]), mmap_mode="r").shape[0]] + HUGE)
expect("a blob of frames of 2^65 bytes", lambda: Dataset(d), [p, "its header"])
expect("a blob of frames of 2^65 bytes, drawn", lambda: list(Loader(dataset=d, epochs=[0], window=3)), [p, "its header"])

for row, col, v in ((3, 0, -100), (5, 1, 10**15)):
    d = copy(ds)
    p = os.path.join(d, "index.npy")
    a = np.load(p)
    a[row, col] = v
    save_npy(p, a)
    expect("index.npy row %d column %d = %d" % (row, col, v), lambda: Dataset(d), [p, "contiguous"])

# A header that is not a Python literal is refused before numpy's parser
# tokenizes it (looking for Python 2's 1L): a double quote among 9000
# spaces took that parser 5-7 s, quadratic in the header's length (found
# by testdata/fuzz_readers.py).
d = copy(ds)
p = os.path.join(d, "index.npy")
b = open(p, "rb").read()
h = ("{'descr': '<i8', 'fortran_order': False, 'shape': (%d, 2), }" % dman["clips"]) + " " * 4500 + '"' + " " * 4500 + "\n"
os.remove(p)
with open(p, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h.encode() + b[-16 * dman["clips"]:])
expect("a .npy header numpy's parser would tokenize", lambda: Dataset(d), [p, "not a Python literal"])

# The fast .npy header parser (_files._fast_header) gives what numpy's
# gives, or leaves the header to numpy: headers numpy writes, and the same
# damaged (bytes changed, cut, doubled, spaces and zeros played with).
from clipshard import _files  # noqa: E402


def numpy_header(head):
    f = io.BytesIO(head)
    try:
        v = np.lib.format.read_magic(f)
        shape, fortran, dtype = (np.lib.format.read_array_header_1_0 if v == (1, 0) else np.lib.format.read_array_header_2_0)(f)
    except Exception:
        return None
    return f.tell(), tuple(int(x) for x in shape), fortran, dtype


rng = np.random.default_rng(11)
heads, fast_taken = [], 0
for dt in ("<f2", ">f4", "<f8", "|u1", "<i8", "|b1", "<c8", "<U3"):
    for shape in ((), (0,), (5,), (3, 4), (2, 0, 7), (10 ** 12, 3)):
        for order in (False, True):
            for version in ((1, 0), (2, 0)):
                f = io.BytesIO()
                getattr(np.lib.format, "write_array_header_%d_%d" % version)(
                    f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dt)), "fortran_order": order, "shape": shape})
                heads.append(f.getvalue())
heads += [b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h for h in (
    b"{'descr': '<f2', 'fortran_order': False, 'shape': (5), }\n", b"{'descr': '<f2', 'fortran_order': False, 'shape': (05,), }\n",
    b"{'descr': '<f2', 'fortran_order': False, 'shape': (5, 3,), }\n", b"{'descr': '<f2', 'fortran_order': False, 'shape': (,), }\n",
    b"{'descr': '<f2', 'fortran_order': False, 'shape': (-5,), }\n", b"{'descr': '<f2', 'fortran_order': 0, 'shape': (5,), }\n",
    b"{'descr': '<f2', 'fortran_order': False, 'shape': (5,), }" + b" " * 10001 + b"\n")]
for h in list(heads):
    for _ in range(40):
        b = bytearray(h)
        i = int(rng.integers(0, len(b)))
        op = int(rng.integers(0, 4))
        if op == 0:
            b[i] = int(rng.choice([ord(c) for c in " ,()'0159:\n"]))
        elif op == 1:
            del b[i:]
        elif op == 2:
            b[i:i] = b[i: i + int(rng.integers(1, 8))]
        else:
            b[i] = int(rng.integers(0, 256))
        heads.append(bytes(b))
for h in heads:
    got = _files._fast_header(h)
    if got is not None:
        fast_taken += 1
        assert got == numpy_header(h), (h, got, numpy_header(h))
assert fast_taken > 100, fast_taken
cases += len(heads)

shutil.rmtree(tmp)
print("ok: hostile %d cases (%d .npy headers read by the fast parser, each as numpy reads it)" % (cases, fast_taken))
