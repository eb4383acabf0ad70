"""Read what the clipshard commands write, with numpy (PyTorch optional:
clipshard.torch).

    from clipshard import EpochReader, Dataset
    for batch in EpochReader("/data/epochs", epoch=3, rank=rank, world_size=8, batch_size=256):
        batch["whisper"]   # float16 [256, W*rate, 64]
        batch["samples"]   # int64 [256, 3]: clip row, start, valid
        batch["source"]    # mixed epochs only: int64 [256], an index into reader.sources
"""
from . import quality
from .dataset import Dataset
from .epochs import EpochReader, load_epochs, source_names
from .loader import Loader

__all__ = ["Loader", "EpochReader", "Dataset", "load_epochs", "source_names", "quality"]
__version__ = "2.0.0"
