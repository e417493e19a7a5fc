"""rank-divergence between runs: two runs of one script that should be identical, and are not.

``runs-unseeded-worker``: the same script runs twice (``torch.manual_seed(0)`` both times), a tiny
model fed by a DataLoader with 2 workers. The dataset jitters each sample with a ``random.Random()``
it makes in each worker on first use, without a seed: Python seeds it from the operating system, so
the two runs see other batches from the first step on. Each run is recorded with ``RunRecorder``;
``diff_runs`` then names the first step where they part and the data as what parted (TD477), and the
body exits 1 after printing the diff. The fix seeds that generator from the worker's seed
(``torch.utils.data.get_worker_info().seed``, which follows ``torch.manual_seed``) through
``torchdoctor.worker_init_fn.then(reseed)``: the runs agree bit for bit.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
from typing import Any

from .. import scenario

STEPS = 12
WORKERS = 2
SAMPLES = 96
FEATURES = 8


class JitteredData:
    """A map-style dataset whose augmentation draws from a generator of its own, made in each worker."""

    def __init__(self) -> None:
        import torch

        g = torch.Generator().manual_seed(1)  # the data itself is fixed
        self.x = torch.randn(SAMPLES, FEATURES, generator=g)
        self.y = torch.randn(SAMPLES, 1, generator=g)
        self.rng: random.Random | None = None

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> Any:
        import torch

        if self.rng is None:
            self.rng = random.Random()  # no seed: the operating system's randomness, other in every run
        jitter = torch.tensor([self.rng.gauss(0.0, 0.1) for _ in range(FEATURES)])
        return self.x[i] + jitter, self.y[i]


def _reseed(worker_id: int) -> None:
    """The fix: the dataset's generator follows the worker's seed (and so ``torch.manual_seed``)."""
    import torch

    info = torch.utils.data.get_worker_info()
    assert info is not None, "called by DataLoader in a worker"
    dataset: Any = info.dataset
    dataset.rng = random.Random(info.seed)


def _train(run_dir: str, fixed: bool) -> None:
    import torch
    from torch.utils.data import DataLoader

    import torchdoctor
    from torchdoctor.ranks.fingerprint import RunRecorder

    torch.manual_seed(0)
    init = torchdoctor.worker_init_fn.then(_reseed) if fixed else None
    dataset: Any = JitteredData()  # map-style by duck typing: the module imports without torch
    loader: Any = DataLoader(dataset, batch_size=8, shuffle=True, num_workers=WORKERS, worker_init_fn=init)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with RunRecorder(run_dir, rank=0, model=model, meta={"scenario": "runs-unseeded-worker"}) as rec:
        for step, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            rec.record(step, loss=loss, model=model, batch=(x, y))
            opt.zero_grad()
            if step + 1 == STEPS:
                break
    print(f"{run_dir}: {STEPS} steps recorded, last loss {loss.item():.6f}", flush=True)


@scenario(
    name="runs-unseeded-worker",
    family="rank-divergence",
    code="TD477",
    summary=f"two runs with torch.manual_seed(0), DataLoader with {WORKERS} workers whose dataset jitters samples "
    "with an unseeded random.Random(): `runs diff` finds them parting at step 0, at the data",
    fix="seed the dataset's generator from get_worker_info().seed: worker_init_fn=torchdoctor.worker_init_fn"
    ".then(reseed)",
    seconds=8.0,
    timeout=120.0,
    memory_mb=2048,
)
def runs_unseeded_worker(fixed: bool) -> None:
    from torchdoctor.ranks.diff import diff_runs, render
    from torchdoctor.ranks.runfile import load_run

    where = tempfile.mkdtemp(prefix="torchdoctor-lab-runs-")
    try:
        a, b = os.path.join(where, "a"), os.path.join(where, "b")
        _train(a, fixed)
        _train(b, fixed)
        diff = diff_runs(load_run(a), load_run(b))
        render(diff, "text", sys.stdout)
        sys.stdout.flush()
        if diff.parted:
            raise SystemExit(1)
    finally:
        shutil.rmtree(where)
