#!/usr/bin/env python3
"""Check clipshard.torch.EpochDataset with a real PyTorch DataLoader.

    python3 testdata/check_torch.py EPOCHS_DIR

- num_workers 0, 1, 2 and 4 give every rank the same batches, in the
  same order (DataLoader(batch_size=None));
- the state round-trips through torch.save;
- a training process killed (SIGKILL) at a random batch, resumed from its
  last checkpoint with another world size and batch size, has trained on
  the epoch's samples in order, each once, as an uninterrupted run would
  (under the "drop" remainder rule);
- a per-clip modality's batch is [B, *frame_shape], each sample's clip row.
Prints "ok: torch ..." or raises.
"""
import atexit
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import numpy as np
import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "python"))
import clipshard  # noqa: E402
from clipshard.torch import EpochDataset  # noqa: E402
from spawned import spawned  # noqa: E402

edir = sys.argv[1]
man = clipshard.load_epochs(edir)
epoch = man["epochs"][0]["epoch"]


def run(R, r, B, workers, state=None, ctx=None):
    ds = EpochDataset(edir, epoch, rank=r, world_size=R, batch_size=B)
    if state is not None:
        ds.load_state_dict(state)
    if ctx is not None:  # the dataset pickled into workers started by spawn or forkserver
        got, err = spawned(ds, workers, ctx)
        assert got is not None, err
        return got
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    return [b for b in dl]


# Workers: the same batches, in the same order.
for R, B in ((1, 4), (3, 2)):
    for r in range(R):
        ref = run(R, r, B, 0)
        assert len(ref) == len(EpochDataset(edir, epoch, rank=r, world_size=R, batch_size=B))
        # (spawn and forkserver: the dataset pickled into the workers, once)
        for w, ctx in ((1, None), (2, None), (4, None)) + (((2, "spawn"), (2, "forkserver")) if (R, r) == (3, 1) else ()):
            got = run(R, r, B, w, ctx=ctx)
            assert len(got) == len(ref), (R, r, w, ctx, len(got), len(ref))
            for a, b in zip(got, ref):
                assert set(a) == set(b)
                for k in a:
                    assert torch.equal(a[k], b[k]), (R, r, w, ctx, k)

# Per-clip modalities (convert's NAME@clip=): each sample carries its
# clip's value, [B, *frame_shape], equal to the dataset's row.
per_clip = [m for m in man["modalities"] if m.get("per_clip")]
if per_clip:
    dset = clipshard.Dataset(man["dataset"]["dir"])
    for b in run(2, 1, 3, 2):
        clips = b["samples"][:, 0].numpy()
        for m in per_clip:
            got = b[m["name"]]
            assert tuple(got.shape) == (len(clips), *m["frame_shape"]), (m["name"], tuple(got.shape))
            want = np.asarray(dset.blobs[m["name"]])[clips]
            assert np.array_equal(got.numpy().view(np.uint8), want.view(np.uint8)), m["name"]

# State through torch.save, with workers: the state of the last batch.
ds = EpochDataset(edir, epoch, rank=0, world_size=2, batch_size=3)
batches = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
state = ds.state_dict(batches[1])
assert state["consumed"] == 2 * 3 * 2, state
try:  # without the batch, under workers: refused, not 0
    ds.state_dict()
    raise AssertionError("state_dict() under workers without a batch did not raise")
except ValueError as e:
    assert "pass the last batch" in str(e), e
buf = io.BytesIO()
torch.save(state, buf)
buf.seek(0)
back = torch.load(buf)
assert back == state, (back, state)
again = EpochDataset(edir, epoch, rank=1, world_size=3, batch_size=2)
again.load_state_dict(back)
first = next(iter(torch.utils.data.DataLoader(again, batch_size=None, num_workers=2)))
assert int(first["consumed"]) == 12 + 6, first["consumed"]
# the loaded state goes with the dataset into spawned workers
got, err = spawned(again, 2)
assert got is not None, err
assert int(got[0]["consumed"]) == 12 + 6, got[0]["consumed"]

# Kill and resume with another world size and batch size.
TRAIN = r'''
import json, os, sys
sys.path.insert(0, sys.argv[1])
import torch
from clipshard.torch import EpochDataset
edir, epoch, R, B, ckpt, log = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7]
dss = [EpochDataset(edir, epoch, rank=r, world_size=R, batch_size=B) for r in range(R)]
if os.path.exists(ckpt):
    st = torch.load(ckpt)
    for d in dss:
        d.load_state_dict(st)
its = [iter(torch.utils.data.DataLoader(d, batch_size=None, num_workers=2)) for d in dss]
with open(log, "a") as f:
    for g in range(len(dss[0])):
        bs = [next(it) for it in its]  # one global batch: every rank's
        for b in bs:
            f.write(json.dumps(b["samples"].tolist()) + "\n")
        f.flush()
        torch.save(dss[0].state_dict(bs[0]), ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)  # the checkpoint of what is trained
        print(g, flush=True)
'''
want = np.concatenate([np.load(os.path.join(edir, s["files"]["samples"]))
                       for s in sorted(man["epochs"][0]["shards"], key=lambda s: s["shard"])])
rng = np.random.default_rng(0)
tmp = tempfile.mkdtemp(prefix="clipshard-torch-")
atexit.register(shutil.rmtree, tmp, True)
RESUMES = (((2, 3), (3, 2)), ((1, 5), (4, 1)), ((2, 2), (2, 2)))
for (R1, B1), (R2, B2) in RESUMES if os.environ.get("CLIPSHARD_EXHAUSTIVE") else RESUMES[:2]:  # (all three in CI)
    ckpt, log = os.path.join(tmp, "ckpt.pt"), os.path.join(tmp, "log.jsonl")
    for p in (ckpt, log):
        if os.path.exists(p):
            os.remove(p)
    G = len(EpochDataset(edir, epoch, rank=0, world_size=R1, batch_size=B1))
    kill_after = int(rng.integers(1, max(2, G)))
    p = subprocess.Popen([sys.executable, "-c", TRAIN, os.path.join(here, "..", "python"), edir, str(epoch), str(R1), str(B1), ckpt, log],
                         stdout=subprocess.PIPE, text=True)
    for _ in range(kill_after):
        p.stdout.readline()
    p.send_signal(signal.SIGKILL)
    p.wait()
    # Lines logged after the last checkpoint (a batch trained but not
    # saved) are trained again after the resume: keep what the checkpoint
    # covers.
    done = torch.load(ckpt)["consumed"] if os.path.exists(ckpt) else 0
    lines = open(log).read().splitlines()[: done // B1]
    open(log, "w").write("".join(l + "\n" for l in lines))
    subprocess.run([sys.executable, "-c", TRAIN, os.path.join(here, "..", "python"), edir, str(epoch), str(R2), str(B2), ckpt, log],
                   check=True, stdout=subprocess.DEVNULL)
    got = np.array([s for l in open(log) for s in json.loads(l)], dtype=np.int64).reshape(-1, 3)
    total = done + (len(want) - done) // (B2 * R2) * (B2 * R2)
    assert len(got) == total and np.array_equal(got, want[:total]), (R1, B1, R2, B2, kill_after, len(got), total)
# torchdata's StatefulDataLoader (where installed; CI's torch 2.x leg sets
# CLIPSHARD_REQUIRE_TORCHDATA): stopped after k batches, its state_dict()
# loaded into a new one, the rest of the batches are the uninterrupted
# run's, with 0 to 3 workers (each worker keeps a place of its own).
try:
    from torchdata.stateful_dataloader import Stateful, StatefulDataLoader
except ImportError:
    if os.environ.get("CLIPSHARD_REQUIRE_TORCHDATA"):
        raise
    StatefulDataLoader = None
extra = ""
if StatefulDataLoader is not None:
    def sdl(nw):
        return StatefulDataLoader(EpochDataset(edir, epoch, rank=1, world_size=2, batch_size=3), batch_size=None,
                                  num_workers=nw)
    for nw in (0, 1, 3):
        ref = [b["samples"] for b in sdl(nw)]
        for stop in sorted({0, 1, len(ref) // 2, len(ref) - 1, len(ref)}):
            dl = sdl(nw)
            it = iter(dl)
            got = [next(it)["samples"] for _ in range(stop)]
            st = dl.state_dict()
            del it, dl
            again = sdl(nw)
            again.load_state_dict(st)
            got += [b["samples"] for b in again]
            assert len(got) == len(ref) and all(torch.equal(a, b) for a, b in zip(got, ref)), (nw, stop, len(got), len(ref))
    from clipshard.torch import Loader
    assert isinstance(Loader(edir, epoch, batch_size=3), Stateful)
    import torchdata
    extra = ", torchdata %s StatefulDataLoader" % torchdata.__version__
# The Loader's read threads cast on their own thread alone (torch's
# intra-op threads on top of them oversubscribed the cores); the
# trainer's threads keep torch's count: this one, and one made after.
import threading  # noqa: E402

import clipshard.torch as _ct  # noqa: E402

seen = {}


class SeenDevice(_ct.TorchDevice):
    def cast(self, name, dst, src):
        super().cast(name, dst, src)
        seen.setdefault(threading.current_thread().name, set()).add(torch.get_num_threads())


before = torch.get_num_threads()
_ct.TorchDevice, _real_device = SeenDevice, _ct.TorchDevice  # (the device stage the Loader makes)
try:
    for b in _ct.Loader(edir, epoch, batch_size=3, dtype=torch.float32, threads=2):
        pass
finally:
    _ct.TorchDevice = _real_device
readers = {k: v for k, v in seen.items() if k.startswith("clipshard-read")}
assert readers, seen
if before > 1 and "OpenMP" in torch.__config__.parallel_info().split("parallel backend:")[-1]:
    assert all(v == {1} for v in readers.values()), (before, seen)
after = []
t = threading.Thread(target=lambda: after.append(torch.get_num_threads()))
t.start()
t.join()
assert torch.get_num_threads() == before and after == [before], (before, torch.get_num_threads(), after)
print("ok: torch %s (workers, torch.save state, kill and resume%s; read threads cast alone: %s)"
      % (torch.__version__, extra, sorted(set().union(*readers.values()))))
