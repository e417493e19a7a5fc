"""Guards in training code: atomic checkpoints, rank-safe files, error reports, DataLoader worker setup.

- :mod:`.checkpoint`: ``save`` / ``load`` (a kill or a full disk never leaves a half-written checkpoint).
- :mod:`.rankfile`: ``RankFile`` / ``RankFileHandler`` / ``rank0_only`` (many ranks, one file, whole lines).
- :mod:`.report`: ``guard`` (a per-rank error report with the diagnosis; torchelastic's error file).
- :mod:`.workers`: ``worker_init_fn`` and its parts (threads capped, RNGs seeded per worker).
- :mod:`.devices`: ``select_device`` / ``limit_gpu_memory`` (a GPU that is really free, set before init).
- :mod:`.dist`: ``init_distributed`` (validated, timed out, explained; destroyed at exit).
"""

from .checkpoint import CheckpointError, load, save
from .devices import DeviceChoice, DeviceError, limit_gpu_memory, select_device
from .dist import DistInfo, DistInitError, init_distributed
from .rankfile import RankFile, RankFileHandler, rank0_only
from .report import guard, install
from .workers import cap_worker_threads, make_worker_init_fn, seed_worker, worker_init_fn

__all__ = [
    "CheckpointError",
    "DeviceChoice",
    "DeviceError",
    "DistInfo",
    "DistInitError",
    "init_distributed",
    "limit_gpu_memory",
    "select_device",
    "RankFile",
    "RankFileHandler",
    "cap_worker_threads",
    "guard",
    "install",
    "load",
    "make_worker_init_fn",
    "rank0_only",
    "save",
    "seed_worker",
    "worker_init_fn",
]
