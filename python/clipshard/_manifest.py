"""An epochs folder's manifest (epochs.json), read and checked: what it
says of the epochs, the datasets they were cut from, and each epoch's
shards; the checks of a reader's state and of a shard's samples against
it (docs/FORMAT.md)."""
from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Any, Mapping

import numpy as np

from ._files import MAX_MANIFEST, MAX_SAMPLE, Npy, open_regular, pread_all, read_json
from ._labels import modality_labels


def load_epochs(edir: str) -> dict[str, Any]:
    """Load and check EDIR/epochs.json (a regular file of bounded size).

        from clipshard import load_epochs
        man = load_epochs("/data/epochs")
        [e["epoch"] for e in man["epochs"]]        # the materialised epochs
        [m["name"] for m in man["modalities"]]     # what each batch holds
        man["seed"], man["window"], man["shard_samples"]
    """
    if not os.path.lexists(os.path.join(edir, "epochs.json")) and os.path.lexists(os.path.join(edir, "dataset.json")):
        raise ValueError("%s is a dataset (it holds dataset.json), not an epochs folder (no epochs.json): cut epochs from it "
                         "with clipshard shuffle --dataset %s --out EDIR --window W --epochs N, or read its clips with "
                         "clipshard.Dataset" % (edir, edir))
    man = read_json(os.path.join(edir, "epochs.json"))
    if man.get("format") != "clipshard.epochs":
        raise ValueError("%s: not a clipshard epochs directory" % edir)
    if man.get("version") == 1:
        raise ValueError("%s: epochs of format version 1 (a folder per rank); run shuffle again into a new folder "
                         "(version 2 is one order per epoch that any world size reads)" % edir)
    if man.get("version") not in (2, 3):
        raise ValueError("%s: epochs format version %r, this reader knows versions 2 and 3" % (edir, man.get("version")))
    if man["version"] == 3:
        src = man.get("sources")
        names = [s.get("name") if isinstance(s, dict) else None for s in src] if isinstance(src, list) else None
        if not names or any(not isinstance(n, str) or not n for n in names) or len(set(names)) != len(names):
            raise ValueError("%s: epochs.json: version 3 without a list of named sources (%r)" % (edir, src))
    return man


def check_datasets(man: Mapping[str, Any], edir: str) -> None:
    """The datasets epochs were cut from (their dataset, or each source of
    mixed epochs), where present at the folder epochs.json records, must be
    those recorded (the sha256 of their dataset.json): a dataset converted
    again in place under its epochs is refused, naming both (each sample's
    clip row would name a clip of another dataset). A dataset that is not
    there (moved, or on another machine) is not checked."""
    refs = []
    if man.get("version") == 3:
        for s in man.get("sources") or []:
            if isinstance(s, dict):
                refs.append(("source %s" % s.get("name"), s.get("dir"), s.get("manifest_sha256")))
    elif isinstance(man.get("dataset"), dict):
        refs.append(("dataset", man["dataset"].get("dir"), man["dataset"].get("manifest_sha256")))
    for what, d, want in refs:
        if not isinstance(d, str) or not os.path.isabs(d) or not isinstance(want, str) or "\0" in d:
            continue
        p = os.path.join(d, "dataset.json")
        try:
            os.stat(p)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:
            raise ValueError("%s: the %s the epochs were cut from, %s: its dataset.json cannot be read to check that it is "
                             "still that dataset: %s" % (edir, what, d, e.strerror)) from None
        try:
            now = _sha_of(p)
        except ValueError as e:
            raise ValueError("%s: the %s the epochs were cut from: %s" % (edir, what, e)) from None
        if now != want and _kept_version(d, want):
            continue  # a version convert --segments kept: the epochs read it
        if now != want:
            raise ValueError("%s: cut from the %s %s when its dataset.json had sha256 %s; it now has %s: the dataset was "
                             "converted again (or replaced) since the shuffle, and the samples' clip rows name the clips of "
                             "the dataset they were cut from, not of this one: shuffle again from %s (into a new folder, or "
                             "--force), or restore the dataset they were cut from" % (edir, what, d, want, now, d))


def _sha_of(p: str) -> str:
    """The sha256 of the manifest at p (a regular file of at most
    MAX_MANIFEST bytes, else ValueError)."""
    fd, st = open_regular(p)
    try:
        return hashlib.sha256(pread_all(fd, min(st.st_size, MAX_MANIFEST + 1), 0, p)).hexdigest()
    finally:
        os.close(fd)


def _kept_version(d: str, want: str) -> bool:
    """Whether the dataset in d keeps a version (versions/N/dataset.json,
    of a dataset grown by convert --segments) whose dataset.json has sha256
    want."""
    try:
        names = os.listdir(os.path.join(d, "versions"))
    except OSError:
        return False
    for n in names:
        if not n.isdigit() or n.startswith("0") or len(n) > 9:
            continue
        try:
            if _sha_of(os.path.join(d, "versions", n, "dataset.json")) == want:
                return True
        except (OSError, ValueError):
            continue
    return False


def epoch_identity(man: Mapping[str, Any], epoch: int) -> str:
    """What identifies epoch's samples in an epochs folder: a hash of
    epochs.json's options (seed, window, sampling, the dataset or the
    sources, the weight schedule...: everything but the list of epochs,
    "created" and "tool") and of the epoch's own entry (its shards and,
    when mixed, its weights and counts). Another epoch committed beside it
    leaves it unchanged; a shuffle --force with other options changes it.
    A reader checks it when it starts reading, and a state carries it."""
    top = {k: v for k, v in man.items() if k not in ("epochs", "created", "tool")}
    entry = next((e for e in man.get("epochs", []) if isinstance(e, dict) and e.get("epoch") == epoch), None)
    b = json.dumps([top, entry], sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(b).hexdigest()[:32]


def source_names(man: Mapping[str, Any]) -> list[str]:
    """The names of an epochs folder's sources, in the order of the
    batches' "source" numbers: a mixed folder's (version 3) sources, or
    the one dataset's folder name (version 2)."""
    if man.get("version") == 3:
        return [s["name"] for s in man["sources"]]
    ds = man.get("dataset")  # (a name only: what is not a folder's entry names the one source "dataset")
    return [os.path.basename(os.path.normpath(str(ds.get("dir") or "dataset") if isinstance(ds, dict) else "dataset"))]


def source_column(samples: Any, n: int, where: Any) -> Any:
    """The samples' source column (a view, of a numpy array or a torch
    tensor), refused if a number names none of the n sources: a samples
    file the shuffle did not write. where() words the file or epoch."""
    src = samples[:, 3]
    if len(src):
        lo, hi = int(src.min()), int(src.max())
        if lo < 0 or hi >= n:
            raise ValueError("%s: a sample names source %d; epochs.json lists %d sources" % (where(), lo if lo < 0 else hi, n))
    return src


STATE_VERSION = 2  # 2: with epoch_id


def check_state(state: Any, fmt: str, types: Mapping[str, Any]) -> None:
    """Refuse a state that is not of format fmt, of a known version (1 or
    2; 2 with an epoch_id string), with each key of types of that exact
    type (an int is not a bool, nor a float such as 3.0)."""
    if not isinstance(state, Mapping) or state.get("format") != fmt:
        raise ValueError("not a clipshard %s state: %r" % (fmt.split(".")[-1], state))
    v = state.get("version")
    if type(v) is not int or v not in (1, STATE_VERSION):
        raise ValueError("state version %r: this reader knows versions 1 and %d" % (v, STATE_VERSION))
    want = dict(types)
    if v >= 2:
        want["epoch_id"] = str
    for k, t in want.items():
        x = state.get(k)
        ok = type(x) is t or (t is int and isinstance(x, np.integer))
        if not ok:
            raise ValueError("state %s %r: want %s" % (k, x, "an int" if t is int else "a bool" if t is bool else "a string"))


def row_checks(edir, man):
    """A check of a shard's samples file (an open Npy) against epochs.json,
    vectorised: every clip below its source's clip count (where epochs.json
    records it), start >= 0, valid frames in 1..window (exactly the window
    unless short is "pad"), source one of the sources. The error names the
    file, the sample and the column."""
    window, pad = man.get("window"), man.get("short") == "pad"
    if type(window) is not int or window < 1:
        raise ValueError("%s: epochs.json: window %r" % (edir, window))
    if man.get("version") == 3:
        clips = [s.get("clips") for s in man["sources"]]
    else:
        ds = man.get("dataset")
        clips = [ds.get("clips", 0) if isinstance(ds, dict) else 0]
    if any(type(c) is not int or c < 0 for c in clips):
        raise ValueError("%s: epochs.json: clip counts %r" % (edir, clips))
    limit = np.array([c if c > 0 else 1 << 62 for c in clips], dtype=np.int64)

    def check(f: Npy) -> None:
        a = f.read()
        if not len(a):
            return
        src = a[:, 3] if a.shape[1] == 4 else np.zeros(len(a), dtype=np.int64)
        bad_src = (src < 0) | (src >= len(limit))
        clip, start, valid = a[:, 0], a[:, 1], a[:, 2]
        checks = (
            (bad_src, lambda i: "source %d; epochs.json lists %d sources" % (src[i], len(clips))),
            (~bad_src & ((clip < 0) | (clip >= limit[np.where(bad_src, 0, src)])),
             lambda i: "clip %d; its source has %s clips" % (clip[i], clips[src[i]] or "an unrecorded number of")),
            (start < 0, lambda i: "start %d" % start[i]),
            ((valid < 1) | (valid > window) | ((valid != window) & (not pad)),
             lambda i: "valid %d frames; the window is %d (short %r)" % (valid[i], window, man.get("short"))))
        for bad, words in checks:
            if bad.any():
                i = int(np.argmax(bad))
                raise ValueError("%s: sample %d: %s" % (f.path, i, words(i)))
    return check


def row_bytes(dtype, shape):
    return math.prod(int(x) for x in shape) * np.dtype(dtype).itemsize


def expected_files(edir, man):
    """name -> (dtype, shape of one sample) of every shard file, from
    epochs.json's modalities (and "samples": int64 [3], or [4] in a mixed
    folder: clip, start, valid, source)."""
    mods = man.get("modalities")
    if not isinstance(mods, list) or not mods:
        raise ValueError("%s: epochs.json: no modalities" % edir)
    out = {}
    for m in mods:
        try:
            name, dtype, frame = m["name"], m["dtype"], [int(x) for x in m["frame_shape"]]
            np.dtype(dtype)
            shape = frame if m.get("per_clip") else [int(m["window_rows"])] + frame
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError("%s: epochs.json: modality %r: %s" % (edir, m, e)) from None
        if not isinstance(name, str) or name in out or name == "samples" or any(x < 0 for x in shape):
            raise ValueError("%s: epochs.json: modality %r" % (edir, m))
        if row_bytes(dtype, shape) > MAX_SAMPLE:
            raise ValueError("%s: epochs.json: modality %r: a sample of %d bytes (%s %s): more than any reader holds" % (
                edir, name, row_bytes(dtype, shape), dtype, shape))
        modality_labels(edir, "epochs.json", m)
        out[name] = (dtype, shape)
    out["samples"] = ("<i8", [4 if man.get("version") == 3 else 3])
    return out


def epoch_labels(edir, man):
    """Label modality name -> its vocabulary, of epochs.json's modalities
    (checked by expected_files)."""
    out = {}
    for m in man.get("modalities") or []:
        labels = modality_labels(edir, "epochs.json", m) if isinstance(m, dict) else None
        if labels is not None:
            out[m["name"]] = labels
    return out


def check_shards(edir, man, entry, names):
    """The epoch's shards in order, checked: whole numbers of samples (at
    most shard_samples each), each shard starting where the last one ends,
    adding up to the epoch's samples, with a file for every name."""
    shards, per = entry.get("shards"), man.get("shard_samples")
    where = "%s: epochs.json: epoch %r" % (edir, entry.get("epoch"))
    if not isinstance(shards, list) or not isinstance(per, int) or per < 1:
        raise ValueError("%s: no shard list (or no shard_samples)" % where)
    try:
        shards = sorted(shards, key=lambda s: s["shard"])
    except (KeyError, TypeError):
        raise ValueError("%s: a shard without a number" % where) from None
    first = 0
    for s in shards:
        n, f, files = s.get("samples"), s.get("first"), s.get("files")
        if not isinstance(n, int) or not 0 <= n <= per:
            raise ValueError("%s: shard %r holds %r samples: want 0..%d (shard_samples)" % (where, s["shard"], n, per))
        if f != first:
            raise ValueError("%s: shard %r starts at sample %r, want %d (where the shard before it ends)" % (where, s["shard"], f, first))
        if not isinstance(files, dict) or any(not isinstance(files.get(x), str) for x in names):
            raise ValueError("%s: shard %r does not list a file for each of %s" % (where, s["shard"], names))
        first += n
    if entry.get("samples") != first:
        raise ValueError("%s: the shards hold %d samples, the epoch says %r" % (where, first, entry.get("samples")))
    return shards


def parse_size(s):
    """Bytes of "2GiB", "512MiB", "1G" or a number (>= 0; anything else: a
    ValueError saying so)."""
    bad = ValueError("%r: want a size in bytes such as 536870912, '512MiB' or '2GiB'" % (s,))
    if isinstance(s, (bool, np.bool_)):
        raise bad
    if isinstance(s, (int, np.integer)):
        v = int(s)
    else:
        units = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("TB", 10**12), ("GB", 10**9),
                 ("MB", 10**6), ("KB", 10**3), ("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10), ("B", 1))
        text, mult = str(s).strip(), 1
        for suffix, m in units:
            if text.endswith(suffix):
                text, mult = text[: -len(suffix)], m
                break
        try:
            v = int(float(text) * mult)
        except (ValueError, OverflowError):  # ("abc", "nan", "inf")
            raise bad from None
    if v < 0:
        raise bad
    return v
