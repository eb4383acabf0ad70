#!/usr/bin/env python3
"""Data-parallel training over clipshard epochs with torch.distributed, that
survives being killed and resumes on another number of ranks.

    python3 examples/train_ddp.py EPOCHS_DIR --ranks 2 --batch-size 4 --ckpt ckpt.pt
    # killed (kill -9, a preempted node), then, on 3 ranks with batches of 3:
    python3 examples/train_ddp.py EPOCHS_DIR --ranks 3 --batch-size 3 --ckpt ckpt.pt
    # epochs pushed to a bucket (clipshard push), through a node-local cache:
    python3 examples/train_ddp.py s3://bucket/epochs --cache-dir /local/cache --cache-limit 40GiB --ckpt ckpt.pt

Each rank reads its batches with clipshard.torch.Loader (a read-ahead
thread, float32 delivered); the model is a toy (a linear layer on one
modality), wrapped in DistributedDataParallel over gloo on the CPU. Every
--every steps rank 0 saves the model, the optimiser, the step and the
loader's state (the same on every rank: the epoch and the samples all
ranks consumed), written to a new file of its own beside --ckpt and
renamed over it. A run started with --ckpt of an existing file goes on
from it with its own --ranks and --batch-size: no sample is trained
twice, none is skipped.

With --log DIR each rank appends "step epoch samples" per step to
DIR/rank-R.jsonl (testdata/check_ddp.py uses it to check exactly-once).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from clipshard.torch import Loader  # noqa: E402


def save(path, state):
    """Writes state to path whole or not at all: into a new file of a name
    of its own beside it (never a name that may already be there: a file or
    link of the user's called CKPT.tmp is not written over or through),
    then renamed over path."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                               prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def train(rank, args, init):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=args.ranks)
    torch.manual_seed(0)
    # rank and world size come from torch.distributed.
    # From a bucket (s3://..., clipshard push): through a node-local cache
    # that this node's ranks share (one fetch per node).
    cache = dict(cache_dir=args.cache_dir, cache_limit=args.cache_limit) if args.cache_dir else {}
    loader = Loader(args.epochs_dir, batch_size=args.batch_size, dtype=torch.float32, prefetch=4, **cache)
    name = loader.floating[0]  # the modality the toy model reads
    width = int(torch.tensor(loader.shapes[name][1:]).prod())
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(width, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    step = 0
    if os.path.exists(args.ckpt):
        ck = torch.load(args.ckpt)
        model.module.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        loader.load_state_dict(ck["data"])  # with this run's ranks and batch size
        step = ck["step"]
    log = open(os.path.join(args.log, "rank-%d.jsonl" % rank), "a") if args.log else None
    while loader.epoch is not None:  # each pass reads the current epoch, then moves on
        epoch = loader.epoch
        for batch in loader:
            x = batch[name].flatten(1)
            loss = model(torch.nan_to_num(x)).pow(2).mean()
            opt.zero_grad()
            loss.backward()  # DDP: the gradients are averaged over the ranks here
            opt.step()
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
            step += 1
            if log:
                log.write(json.dumps([step, epoch, batch["samples"].tolist()]) + "\n")
                log.flush()
            if step % args.every == 0:
                dist.barrier()  # every rank has trained (and logged) this step
                if rank == 0:
                    save(args.ckpt, {"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step,
                                     "data": loader.state_dict()})
                    print("checkpoint step %d epoch %d" % (step, epoch), flush=True)
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("epochs_dir")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--every", type=int, default=3, help="steps between checkpoints")
    p.add_argument("--log", help="a folder for each rank's log of the samples it trained on")
    p.add_argument("--step-ms", type=float, default=0, help="a simulated accelerator step, slept after each step")
    p.add_argument("--cache-dir", help="for epochs in a bucket (s3://BUCKET/PREFIX): the node-local cache folder")
    p.add_argument("--cache-limit", default="4GiB", help="the cache's bound (default 4GiB)")
    args = p.parse_args()
    # The rendezvous file must not exist yet: a name in a new folder of its own.
    rdv = tempfile.mkdtemp(prefix="clipshard-ddp-")
    try:
        mp.spawn(train, args=(args, "file://" + os.path.join(rdv, "rendezvous")), nprocs=args.ranks)
    finally:
        shutil.rmtree(rdv, ignore_errors=True)
    print("done: step counts in %s" % args.ckpt if os.path.exists(args.ckpt) else "done")


if __name__ == "__main__":
    main()
