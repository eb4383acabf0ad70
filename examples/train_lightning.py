#!/usr/bin/env python3
"""clipshard with PyTorch Lightning: a LightningDataModule over an epochs
folder, resumable mid-epoch on any number of devices.

    python examples/train_lightning.py EDIR CKPT_DIR [--batch-size B] [--max-steps N] [--devices N] [--log FILE]

- train_dataloader() makes clipshard.torch.Loader once Lightning has set
  up the processes: its rank and world size are torch.distributed's (each
  rank reads its own slice of every global batch, no sampler).
  use_distributed_sampler=False: the Loader is not a DataLoader, and its
  ranks' batches are disjoint already.
- The DataModule's state_dict() (the Loader's state after the last batch
  trained: Lightning fetches one ahead) goes into every Lightning
  checkpoint;
  load_state_dict() takes it back when a run resumes (fit(ckpt_path=...)),
  and the Loader goes on after the last batch the checkpoint saw, on any
  number of devices or batch size.
- Lightning's epochs are the Loader's: max_epochs = the epochs listed;
  the Loader moves to the next epoch by itself, and Lightning is given
  each epoch without a length (Epoch), so that it ends where the
  Loader's does, a resumed one included.

With --max-steps N the run stops after step N with a checkpoint there
(CKPT_DIR/last.ckpt); run it again without it to resume and finish. With
--log FILE, each rank appends the samples it trained ([epoch, clip,
start, valid] a line, JSON) to FILE.RANK: examples/train_test.go checks
that the two runs trained every sample of every epoch exactly once.
"""
import argparse
import collections
import json
import os
import sys

import torch

try:
    import lightning as L
except ImportError:  # (the older package name)
    import pytorch_lightning as L  # type: ignore[no-redef]

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard.torch as ct  # noqa: E402


class ClipshardData(L.LightningDataModule):
    """The epochs of an epochs folder (clipshard shuffle), this rank's
    batches, resumable."""

    def __init__(self, edir, batch_size, **loader_kw):
        super().__init__()
        self.edir, self.batch_size, self.kw = edir, batch_size, loader_kw
        self.loader = None
        self._state = None
        self.handed = collections.deque()  # the Loader's state after each batch handed out and not yet trained
        self.trained = None  # its state after the last batch trained

    def train_dataloader(self):
        if self.loader is None:
            self.loader = ct.Loader(self.edir, batch_size=self.batch_size, **self.kw)
            if self._state is not None:
                self.loader.load_state_dict(self._state)  # (another world size or batch size is fine)
                self._state = None
        return Epoch(self)

    def batch_trained(self):
        """One more batch trained (Trained, after each step): the state to
        save is the Loader's after it. (Lightning fetches a batch ahead of
        the step, to know the last one: the Loader's own state_dict() is
        one batch further than what a checkpoint has trained.)"""
        self.trained = self.handed.popleft()

    def state_dict(self):
        return {"loader": self.trained} if self.trained is not None else {}

    def load_state_dict(self, state):
        self._state = state.get("loader")

    def teardown(self, stage):
        if self.loader is not None:
            self.loader.close()


class Epoch:
    """The Loader's current epoch, without a length: Lightning then ends
    its epoch when the Loader's ends (a len() is taken once, and on a
    resumed epoch Lightning counts the batches it trained before the
    checkpoint against it: the Loader's len() is what is left)."""

    def __init__(self, data):
        self.data = data

    def __iter__(self):
        data = self.data
        data.handed.clear()  # (a new epoch: nothing fetched ahead is left)
        for b in data.loader:
            data.handed.append(data.loader.state_dict())
            yield b


class Trained(L.Callback):
    """Tells the DataModule each batch trained (before ModelCheckpoint,
    which Lightning runs last)."""

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        trainer.datamodule.batch_trained()


class Tiny(L.LightningModule):
    """A linear model of the first modality's mean frame (a stand-in)."""

    def __init__(self, modality, width, log):
        super().__init__()
        self.modality, self.log_path = modality, log
        self.net = torch.nn.Linear(width, 1)

    def training_step(self, batch, i):
        x = batch[self.modality].float()
        x = x.mean(dim=1) if x.dim() == 3 else x
        loss = self.net(x).pow(2).mean()
        if self.log_path:
            with open("%s.%d" % (self.log_path, self.global_rank), "a") as f:
                for s in batch["samples"].tolist():
                    f.write(json.dumps([self.current_epoch] + s) + "\n")
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("edir")
    ap.add_argument("ckpt_dir")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--max-steps", type=int, default=-1)
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--log", default="")
    a = ap.parse_args()
    man = json.load(open(os.path.join(a.edir, "epochs.json")))
    epochs = sorted(e["epoch"] for e in man["epochs"])
    first = man["modalities"][0]
    width = 1
    for n in first["frame_shape"]:
        width *= n
    data = ClipshardData(a.edir, a.batch_size, epochs=epochs)
    model = Tiny(first["name"], width, a.log)
    last = os.path.join(a.ckpt_dir, "last.ckpt")
    every = a.max_steps if a.max_steps > 0 else 1000000
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=a.ckpt_dir, every_n_train_steps=every, save_last=True)
    trainer = L.Trainer(accelerator="cpu", devices=a.devices, strategy="ddp" if a.devices > 1 else "auto",
                        max_epochs=len(epochs), max_steps=a.max_steps, use_distributed_sampler=False,
                        callbacks=[Trained(), ckpt], logger=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0)
    trainer.fit(model, datamodule=data, ckpt_path=last if os.path.exists(last) else None)
    if trainer.global_rank == 0:
        print("trained to step %d (epoch %d)" % (trainer.global_step, trainer.current_epoch))


if __name__ == "__main__":
    main()
