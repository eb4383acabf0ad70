#!/usr/bin/env python3
"""The GPU check (#62): clipshard.torch.Loader on a CUDA device, against
the copy rates and torch's DataLoader, every byte checked.

    python3 python/checks/gpu_check.py [CLIPSHARD [WORKDIR]]    (just gpu-check)

CLIPSHARD: the clipshard command (default bin/clipshard: build it with
`go build -o bin/ ./cmd/clipshard`; it is static, so a machine without Go
runs it). Without torch or a CUDA device it prints one line saying so and
exits 0. Reads nothing from outside; writes about 4.5 GB under WORKDIR
(default $TMPDIR/clipshard-gpu) and removes it. A few minutes on one H100.

It makes the seed's batch (128 windows x 15 frames x 9216 float16 = 35 MB)
from a dataset of 200 clips x 300 frames (one modality, float16 kept),
and two epochs cut from it (about 2.2 GB of shards), then, in one run:
- copy rates: the same 35 MB, host to device, from pinned and from
  pageable memory (20 copies each, after 3 warm ones);
- the host read rate: clipshard.Loader (numpy, no device) over epoch 0,
  warm;
- the Loader on the device (dtype float32, cast there) with no step, and
  with a step of 20 ms (a kernel, then a sync, as loss.item() does): the
  delivery rate and each batch's wait (p50, p95);
- torch's DataLoader(EpochDataset, pin_memory=True, num_workers=4) with a
  CUDA prefetcher (the next batch's copy on a side stream), the anchor,
  the same two ways;
- correctness: over 2 epochs every device batch equal, byte for byte, to
  the host read cast the same way, while the last 8 batches are held; and
  pin-only mode (pin_memory=True, no device) with the user's own
  x.to("cuda", non_blocking=True) enqueued behind 5 ms of GPU work and
  the batch dropped at once: every copy equal to the host read;
- host_bytes against the pinned bytes torch's host allocator reports
  (where this torch reports them).
Prints one JSON object (the figures) and "ok: gpu check ..." or raises;
with OUT set, writes the JSON to $OUT/gpu_check.json.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))

try:
    import torch
except ImportError:
    print("gpu check: skipped: no torch in %s" % sys.executable)
    sys.exit(0)
if not torch.cuda.is_available():
    print("gpu check: skipped: no CUDA device here (torch %s)" % torch.__version__)
    sys.exit(0)

import clipshard  # noqa: E402
import clipshard.torch as ct  # noqa: E402

exe = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "bin", "clipshard")
work = sys.argv[2] if len(sys.argv) > 2 else os.path.join(tempfile.gettempdir(), "clipshard-gpu")
CLIPS, FRAMES, DIM, W, B = 200, 300, 9216, 15, 128
dev = torch.device("cuda")
out = {"card": torch.cuda.get_device_name(0), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
       "batch_mb": B * W * DIM * 2 / 1e6}


def step_kernel(ms):
    """A GPU step of about ms milliseconds: torch.cuda._sleep calibrated."""
    cycles = 1_000_000
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    torch.cuda._sleep(cycles)
    e1.record()
    e1.synchronize()
    per_ms = cycles / max(e0.elapsed_time(e1), 1e-3)
    return lambda: torch.cuda._sleep(int(per_ms * ms))


# -- data ----------------------------------------------------------------
shutil.rmtree(work, ignore_errors=True)
src, ds, ep = (os.path.join(work, x) for x in ("src", "ds", "ep"))
os.makedirs(os.path.join(src, "x"))
rng = np.random.default_rng(0)
ids = []
t0 = time.perf_counter()
for i in range(CLIPS):
    cid = "c%03d" % i
    ids.append(cid)
    np.save(os.path.join(src, "x", cid + ".npy"), rng.standard_normal((FRAMES, DIM), dtype=np.float32).astype(np.float16))
with open(os.path.join(src, "clips.txt"), "w") as f:
    f.write("\n".join(ids) + "\n")
for args in (["convert", "--quiet", "--clips", os.path.join(src, "clips.txt"), "--root", src, "--out", ds,
              "-m", "x=x/{clip}.npy"],
             ["shuffle", "--quiet", "--dataset", ds, "--out", ep, "--window", str(W), "--epochs", "2", "--seed", "1"]):
    r = subprocess.run([exe] + args, capture_output=True, text=True)
    assert r.returncode == 0, (args[0], r.stderr)
shutil.rmtree(src)
out["data_s"] = round(time.perf_counter() - t0, 1)
out["epochs_gb"] = round(sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(ep) for n in ns) / 1e9, 2)

# -- copy rates ----------------------------------------------------------
nbytes = B * W * DIM * 2
dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
for kind, host in (("pinned", torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)),
                   ("pageable", torch.empty(nbytes, dtype=torch.uint8))):
    for _ in range(3):
        dst.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        dst.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    out["copy_%s_gbps" % kind] = round(20 * nbytes / (time.perf_counter() - t0) / 1e9, 2)
del dst


def host_loader(epochs):
    return clipshard.Loader(ep, epochs=epochs, batch_size=B)


# -- host read rate (warm: the second pass) --------------------------------
for k in range(2):
    L = host_loader([0])
    t0, n = time.perf_counter(), 0
    for b in L:
        n += b["x"].nbytes
    L.close()
    out["host_read_gbps"] = round(n / (time.perf_counter() - t0) / 1e9, 2)


def waits_of(batches, step):
    """Iterate, stepping after each batch; the rate of the float16 bytes
    delivered and each batch's wait in the iterator."""
    it = iter(batches)
    waits, n = [], 0
    t0 = time.perf_counter()
    while True:
        a = time.perf_counter()
        try:
            b = next(it)
        except StopIteration:
            break
        waits.append(time.perf_counter() - a)
        n += b["x"].numel() * 2
        if step is not None:
            step()
            torch.cuda.current_stream().synchronize()
    torch.cuda.synchronize()
    el = time.perf_counter() - t0
    w = np.array(waits[1:] or [0.0]) * 1000
    return round(n / el / 1e9, 2), round(float(np.percentile(w, 50)), 3), round(float(np.percentile(w, 95)), 3)


def prefetched(loader):
    """torch's usual CUDA prefetcher: the next batch's copy (and cast) on a
    side stream, the consumer's stream waiting for it."""
    s = torch.cuda.Stream()
    nxt = None
    for b in loader:
        with torch.cuda.stream(s):
            d = {k: (v.to(dev, non_blocking=True).float() if v.dtype == torch.float16 else v) for k, v in b.items()}
        if nxt is not None:
            yield nxt
        torch.cuda.current_stream().wait_stream(s)
        for v in d.values():
            if v.is_cuda:
                v.record_stream(torch.cuda.current_stream())
        nxt = d
    if nxt is not None:
        yield nxt


step20 = step_kernel(20)
rows = {}
for rnd in range(2):  # (rows interleaved, 2 rounds: the second is kept)
    for name, step in (("none", None), ("20ms", step20)):
        L = ct.Loader(ep, epochs=[0], batch_size=B, device=dev, dtype=torch.float32)
        rows["loader_" + name] = waits_of(L, step)
        L.close()
        dl = torch.utils.data.DataLoader(ct.EpochDataset(ep, epoch=0, batch_size=B), batch_size=None, num_workers=4,
                                         pin_memory=True, persistent_workers=False)
        rows["dataloader_" + name] = waits_of(prefetched(dl), step)
for k, (rate, p50, p95) in rows.items():
    out[k] = {"gbps": rate, "wait_ms_p50": p50, "wait_ms_p95": p95}

# -- correctness: 2 epochs, device batches against the host read ------------
L = ct.Loader(ep, epochs=[0, 1], batch_size=B, device=dev, dtype=torch.float32)
H = host_loader([0, 1])
held, checked, differ = [], 0, 0
for e in L.epochs:
    L.set_epoch(e)
    H.set_epoch(e)
    for d, h in zip(L, H):
        ref = torch.from_numpy(np.asarray(h["x"])).to(dev).float()
        differ += int((d["x"].view(torch.int32) != ref.view(torch.int32)).any())
        assert torch.equal(d["samples"], torch.from_numpy(np.asarray(h["samples"]))), "samples differ"
        assert not d["samples"].is_cuda, "samples went to the device"
        held = (held + [d])[-8:]
        checked += 1
torch.cuda.synchronize()
out["device_batches_checked"], out["device_batches_differing"] = checked, differ
out["host_bytes"] = L.host_bytes
stats = getattr(torch.cuda, "host_memory_stats", None)
if stats is not None:
    try:
        s = stats()
        out["pinned_reserved"] = s.get("reserved_bytes.current", s.get("segment.all.current"))
    except Exception as e:  # (a torch without host stats)
        out["pinned_reserved"] = "n/a: %s" % e
L.close()
H.close()

# -- pin-only mode: the user's non_blocking copy, the batch dropped at once --
slow = step_kernel(5)
P = ct.Loader(ep, epochs=[0], batch_size=B, pin_memory=True)
H = host_loader([0])
copies, refs = [], []
for b, h in zip(P, H):
    slow()  # (the copy waits behind 5 ms of GPU work on this stream)
    copies.append(b["x"].to(dev, non_blocking=True))
    del b  # (the batch dropped: the loader may reuse its memory once the copy is done)
    refs.append(torch.from_numpy(np.array(h["x"])))
torch.cuda.synchronize()
bad = sum(int(not torch.equal(c.cpu().view(torch.int16), r.view(torch.int16))) for c, r in zip(copies, refs))
out["pin_only_copies"], out["pin_only_corrupted"] = len(copies), bad
P.close()
H.close()

shutil.rmtree(work, ignore_errors=True)
print(json.dumps(out, indent=1))
if os.environ.get("OUT"):
    with open(os.path.join(os.environ["OUT"], "gpu_check.json"), "w") as f:
        json.dump(out, f, indent=1)
floor = min(out["copy_pinned_gbps"], out["host_read_gbps"])
assert differ == 0 and bad == 0, ("corrupted", differ, bad)
print("ok: gpu check on %s: %d device batches byte-equal over 2 epochs, 0 of %d pin-only copies corrupted; delivery %.2f GB/s "
      "(floor %.2f: %.2fx), 20 ms step waits p95 %.3f ms; DataLoader %.2f GB/s" % (
          out["card"], checked, len(copies), out["loader_none"]["gbps"], floor, out["loader_none"]["gbps"] / floor,
          out["loader_20ms"]["wait_ms_p95"], out["dataloader_none"]["gbps"]))
