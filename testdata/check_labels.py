"""Labels in the batch (#64.1): a dataset converted with --label speaker
--label mood=emo from a CSV clip list, grown by --segments (ds) and
converted whole (twin), and epochs cut from ds (ep).

Every reader (Dataset, the Loader over epochs, the drawn Loader, the torch
Loader where torch imports) delivers each sample's int32 code, and
labels(name) maps it to the label the clip list gives its clip; a
vocabulary that a code falls outside of, or that repeats a label, is
refused naming the dataset; labels() of a modality that is no label is a
ValueError naming it.

Mixed (OTHER converted with --labels-like TWIN, its vocabulary TWIN's
then its own; MIXEP shuffled from twin as source a and OTHER as b): the
mixed epochs and the mixed drawn Loader give every sample its source's
clip's label under the longer vocabulary; a source whose codes mean other
labels (CLASH) is refused naming --labels-like.

usage: check_labels.py CLIPS.csv DS TWIN EP WORKDIR OTHER.csv OTHER MIXEP CLASH
"""
import csv
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from clipshard import Dataset, Loader  # noqa: E402

clips_csv, ds_dir, twin_dir, ep_dir, work, other_csv, other_dir, mix_dir, clash_dir = sys.argv[1:10]


def read_csv(p):
    with open(p, newline="") as f:
        return list(csv.DictReader(f))


rows = read_csv(clips_csv)
want = {"speaker": {r["clip"]: r["speaker"] for r in rows}, "mood": {r["clip"]: r["emo"] for r in rows}}


def first_seen(col):
    out = []
    for r in rows:
        if r[col] not in out:
            out.append(r[col])
    return out


ds, twin = Dataset(ds_dir), Dataset(twin_dir)
assert ds.labels("speaker") == twin.labels("speaker") == first_seen("speaker"), ds.labels("speaker")
assert ds.labels("mood") == first_seen("emo"), ds.labels("mood")
for name in ("speaker", "mood"):
    voc = ds.labels(name)
    for i, cid in enumerate(ds.ids):
        code = ds[i][name]
        assert code.dtype == np.int32 and code.shape == (), (code.dtype, code.shape)
        assert voc[int(code)] == want[name][cid], (name, cid, int(code))
        assert int(twin[cid][name]) == int(code)
assert set(ds.feature_stats()) == {"motion", "whisper"}, list(ds.feature_stats())


def check_loader(loader, what):
    n = 0
    voc = {k: np.asarray(loader.labels(k)) for k in ("speaker", "mood")}
    for b in loader:
        for k in voc:
            assert b[k].dtype == np.int32 and b[k].shape == (len(b["samples"]),), (what, k, b[k].dtype, b[k].shape)
            got = voc[k][np.asarray(b[k])]
            exp = [want[k][ds.ids[int(c)]] for c in b["samples"][:, 0]]
            assert list(got) == exp, (what, k, list(got)[:5], exp[:5])
        n += len(b["samples"])
    assert n > 0, what
    try:
        loader.labels("motion")
    except ValueError as e:
        assert "'motion': not a label modality" in str(e) and "speaker, mood" in str(e), e
    else:
        raise AssertionError("labels('motion') accepted")
    return n


n_ep = check_loader(Loader(ep_dir, batch_size=4), "epochs")
from clipshard import EpochReader  # noqa: E402
from clipshard.draw import Drawn, DrawnReader  # noqa: E402
assert EpochReader(ep_dir, 0, batch_size=4).labels("speaker") == ds.labels("speaker")
assert DrawnReader(Drawn(ds_dir, window=5), 0, batch_size=4).labels("mood") == ds.labels("mood")
n_dr = check_loader(Loader(dataset=ds_dir, epochs=range(2), window=5, batch_size=4, seed=3), "drawn")
try:
    from clipshard.torch import Loader as TorchLoader
except ImportError:
    torch_ok = "no torch"
else:
    tl = TorchLoader(ep_dir, batch_size=4)
    b = next(iter(tl))
    assert str(b["speaker"].dtype) == "torch.int32", b["speaker"].dtype
    assert tl.labels("speaker") == ds.labels("speaker")
    tl.close()
    from clipshard.torch import EpochDataset
    assert EpochDataset(ep_dir, 0, batch_size=4).labels("mood") == EpochDataset(dataset=ds_dir, window=5).labels("mood") == ds.labels("mood")
    torch_ok = "torch"


def refused(edit, needle):
    bad = os.path.join(work, "bad-%d" % len(os.listdir(work)))
    shutil.copytree(twin_dir, bad)
    p = os.path.join(bad, "dataset.json")
    with open(p) as f:
        man = json.load(f)
    for m in man["modalities"]:
        if m["name"] == "speaker":
            edit(m)
    with open(p, "w") as f:
        json.dump(man, f)
    for make in (lambda: Dataset(bad), lambda: Loader(dataset=bad, epochs=[0], window=5, batch_size=4)):
        try:
            make()
        except ValueError as e:
            assert needle in str(e) and bad in str(e), e
        else:
            raise AssertionError("accepted: %s" % needle)


# Epochs whose shard holds a code outside the vocabulary (edited in
# place): every epochs reader refuses the batch, naming the label.
for code in (-1, 99):
    bad_ep = os.path.join(work, "bad-ep%d" % code)
    shutil.copytree(ep_dir, bad_ep)
    shard = os.path.join(bad_ep, "epoch-0000", "shard-00000.speaker.npy")
    a = np.load(shard)
    a[2] = code
    np.save(shard, a)
    for read in (lambda: list(Loader(bad_ep, batch_size=4)), lambda: list(EpochReader(bad_ep, 0, batch_size=4))):
        try:
            read()
        except ValueError as e:
            assert "label modality 'speaker': batch 0's sample 2 holds code %d, outside its" % code in str(e), e
        else:
            raise AssertionError("a code of %d was delivered" % code)

refused(lambda m: m.update(labels=m["labels"][:1]), "outside its 1 labels")
refused(lambda m: m.update(labels=[m["labels"][0]] * 3), "want a list of distinct strings")
refused(lambda m: m.update(dtype="<f2"), "want one <i4 code a clip")

# Mixed: source a is twin, b is other (its vocabulary twin's, then its own).
other_rows = read_csv(other_csv)
other = Dataset(other_dir)
assert other.labels("speaker")[:len(twin.labels("speaker"))] == twin.labels("speaker"), other.labels("speaker")
by_source = [(twin, want["speaker"]), (other, {r["clip"]: r["speaker"] for r in other_rows})]


def check_mixed(loader, what):
    voc = np.asarray(loader.labels("speaker"))
    assert list(voc) == other.labels("speaker"), (what, list(voc))
    seen, n = set(), 0
    for b in loader:
        for smp, code in zip(b["samples"], b["speaker"]):
            d, labels = by_source[int(smp[3])]
            assert voc[code] == labels[d.ids[int(smp[0])]], (what, smp, voc[code])
            seen.add(int(smp[3]))
            n += 1
    assert seen == {0, 1}, (what, seen)
    return n


n_mix = check_mixed(Loader(mix_dir, batch_size=4), "mixed epochs")
n_mix += check_mixed(Loader(dataset={"a": twin_dir, "b": other_dir}, epochs=[0], window=5, batch_size=4), "mixed drawn")
try:
    Loader(dataset={"a": twin_dir, "b": clash_dir}, epochs=[0], window=5, batch_size=4)
except ValueError as e:
    assert "a code must mean one label in every source" in str(e) and "--labels-like" in str(e), e
else:
    raise AssertionError("sources whose codes mean other labels were mixed")
print("ok: labels of %d clips, %d epoch samples, %d drawn samples, %d mixed samples, %s" % (len(ds), n_ep, n_dr, n_mix, torch_ok))
