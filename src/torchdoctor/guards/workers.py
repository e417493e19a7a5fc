"""A DataLoader ``worker_init_fn`` that caps threads and seeds every worker distinctly.

    DataLoader(ds, num_workers=8, worker_init_fn=torchdoctor.worker_init_fn)
    DataLoader(ds, num_workers=8, worker_init_fn=torchdoctor.worker_init_fn.then(open_files))
    DataLoader(ds, num_workers=8, worker_init_fn=make_worker_init_fn(threads=2, then=open_files))

In each worker: ``torch.set_num_threads(n)``; ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``,
``OPENBLAS_NUM_THREADS`` (and the like) set to ``n`` for libraries the worker loads later;
OpenCV's own pool off (``cv2.setNumThreads(0)``) when OpenCV is installed; Python's ``random``,
NumPy's global generator and torch seeded from ``torch.utils.data.get_worker_info().seed``, which
differs per worker and follows the main process's ``torch.manual_seed`` (so runs reproduce).
Eight workers each running one thread per core oversubscribe the CPU (family thread-oversubscription).

The objects here are picklable (``multiprocessing`` ``spawn`` and ``forkserver`` start methods),
as long as the functions given to ``then`` are.
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
from collections.abc import Callable
from typing import Any

THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "BLIS_NUM_THREADS",
)


def _module(name: str) -> Any:
    """An installed module (imported if it is not yet), or None when it is not installed or broken."""
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    try:
        if importlib.util.find_spec(name) is None:
            return None
        return importlib.import_module(name)
    except Exception:  # a broken optional library must not break the worker
        return None


def cap_worker_threads(n: int = 1) -> None:
    """Cap this process's compute threads at ``n``: torch's intra-op pool, the OpenMP/MKL/OpenBLAS
    variables (read by libraries loaded later), and OpenCV's pool (off: ``cv2.setNumThreads(0)``)."""
    if n < 1:
        raise ValueError(f"cap_worker_threads() takes n >= 1; got {n}")
    for name in THREAD_VARIABLES:
        os.environ[name] = str(n)
    import torch

    torch.set_num_threads(n)
    cv2 = _module("cv2")
    if cv2 is not None and hasattr(cv2, "setNumThreads"):
        cv2.setNumThreads(0)


def seed_worker(worker_id: int | None = None) -> int:
    """Seed ``random``, NumPy (when installed) and torch from this DataLoader worker's seed (the
    process's torch seed outside a worker); returns the seed. Usable as a ``worker_init_fn`` itself."""
    import torch

    info = torch.utils.data.get_worker_info()
    seed = int(info.seed) if info is not None else int(torch.initial_seed())
    random.seed(seed)
    torch.manual_seed(seed)
    np = _module("numpy")
    if np is not None:
        np.random.seed(seed % 2**32)
    return seed


class WorkerInit:
    """A ``worker_init_fn``: threads capped (``threads``; None leaves them), workers seeded
    (``seed``), then the user's functions called with the worker id, in order."""

    def __init__(
        self,
        threads: int | None = 1,
        seed: bool = True,
        then: Callable[[int], Any] | tuple[Callable[[int], Any], ...] | None = None,
    ) -> None:
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1 or None; got {threads}")
        self.threads = threads
        self.seed = seed
        self.after: tuple[Callable[[int], Any], ...] = (
            () if then is None else tuple(then) if isinstance(then, tuple) else (then,)
        )
        for fn in self.after:
            if not callable(fn):
                raise TypeError(f"then= takes functions of the worker id; got {type(fn).__name__}")

    def then(self, *fns: Callable[[int], Any]) -> WorkerInit:
        """A new ``worker_init_fn`` that runs this one, then ``fns`` (each called with the worker id)."""
        return WorkerInit(self.threads, self.seed, (*self.after, *fns))

    def __call__(self, worker_id: int) -> None:
        if self.threads is not None:
            cap_worker_threads(self.threads)
        if self.seed:
            seed_worker(worker_id)
        for fn in self.after:
            fn(worker_id)

    def __repr__(self) -> str:
        names = ", ".join(getattr(f, "__qualname__", repr(f)) for f in self.after)
        return f"WorkerInit(threads={self.threads}, seed={self.seed}, then=({names}))"


def make_worker_init_fn(
    threads: int | None = 1,
    seed: bool = True,
    then: Callable[[int], Any] | tuple[Callable[[int], Any], ...] | None = None,
) -> WorkerInit:
    """A ``worker_init_fn`` with other choices than :data:`worker_init_fn` (see :class:`WorkerInit`)."""
    return WorkerInit(threads, seed, then)


worker_init_fn = WorkerInit()
"""``DataLoader(..., worker_init_fn=torchdoctor.worker_init_fn)``: one thread per worker, seeded."""
