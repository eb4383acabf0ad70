"""spawned(ds, workers, ctx): a clipshard.torch.EpochDataset pickled into
another Python process, which iterates it through a DataLoader whose
workers are started by ctx ("spawn" or "forkserver": each gets the dataset
pickled again) and hands back its batches.

The check scripts run their checks at the top level: a worker started by
spawn would run such a script again, as it runs a user's (who guards it
with `if __name__ == "__main__":`); the process started here runs code
given with -c, which a spawned worker does not run again.

Returns (batches, "") or (None, the process's stderr) when it failed.
"""
import os
import pickle
import subprocess
import sys
import tempfile

import torch

PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python")
CHILD = r'''
import pickle, sys
sys.path.insert(0, sys.argv[1])
import torch, torch.utils.data
with open(sys.argv[2], "rb") as f:
    ds = pickle.load(f)
got = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=int(sys.argv[3]), multiprocessing_context=sys.argv[4]))
torch.save(got, sys.argv[2] + ".out")
'''


def spawned(ds, workers, ctx="spawn"):
    with tempfile.TemporaryDirectory() as tmp:
        p = os.path.join(tmp, "ds.pickle")
        with open(p, "wb") as f:
            pickle.dump(ds, f)
        r = subprocess.run([sys.executable, "-c", CHILD, PYTHON_DIR, p, str(workers), ctx], capture_output=True, text=True,
                           timeout=600)
        if r.returncode != 0:
            return None, r.stderr
        return torch.load(p + ".out"), ""
