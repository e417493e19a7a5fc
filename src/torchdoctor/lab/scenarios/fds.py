"""fd-exhausted: the file_descriptor sharing strategy holds one descriptor per shared storage."""

from __future__ import annotations

from typing import Any

from .. import scenario
from ..predict import Prediction

LOW_NOFILE = 256
TENSORS = 1000


def _producer(q: Any, done: Any, n: int) -> None:
    import torch

    for i in range(n):
        q.put(torch.full((4,), float(i)))
    q.put(None)
    done.wait(60)  # stay alive: the receiver fetches each descriptor from this process


@scenario(
    name="fd-queue-ancdata",
    predict=Prediction(
        "check", ("--sharing-strategy", "file_descriptor", "--start-method", "fork"), rlimits=(("NOFILE", LOW_NOFILE),)
    ),
    family="fd-exhausted",
    code="TD150",
    summary=f"a torch.multiprocessing queue delivers {TENSORS} tensors to a receiver that keeps them, "
    f"with RLIMIT_NOFILE lowered to {LOW_NOFILE}: 'received 0 items of ancdata'",
    fix="torch.multiprocessing.set_sharing_strategy('file_system') in both processes",
    seconds=3.0,
    timeout=60.0,
    private_shm=True,  # the fixed variant shares through /dev/shm files (file_system)
)
def fd_queue_ancdata(fixed: bool) -> None:
    import resource

    import torch.multiprocessing as mp

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW_NOFILE, hard))
    if fixed:
        mp.set_sharing_strategy("file_system")
    ctx = mp.get_context("fork")
    q, done = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_producer, args=(q, done, TENSORS))
    p.start()
    kept = []
    try:
        while (item := q.get(timeout=30)) is not None:
            kept.append(item)  # keeping each tensor keeps its descriptor open
    finally:
        done.set()
        p.join(2)
        if p.is_alive():
            p.kill()
    print(f"received {len(kept)} tensors")


def _lower_nofile() -> None:
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW_NOFILE, hard))


@scenario(
    name="fd-spawn-dataset",
    predict=Prediction(
        "check", ("--sharing-strategy", "file_descriptor", "--start-method", "spawn"), rlimits=(("NOFILE", LOW_NOFILE),)
    ),
    family="fd-exhausted",
    code="TD151",
    summary=f"a DataLoader with spawn workers pickles a dataset of {TENSORS} tensors under the file_descriptor "
    f"strategy with RLIMIT_NOFILE {LOW_NOFILE}: 'unable to open shared memory object … Too many open files (24)'",
    fix="DataLoader(..., multiprocessing_context='fork'): the dataset is inherited, only batches are shared",
    seconds=3.0,
    timeout=60.0,
)
def fd_spawn_dataset(fixed: bool) -> None:
    import torch
    from torch.utils.data import DataLoader

    _lower_nofile()
    data: Any = [torch.full((96,), float(i)) for i in range(TENSORS)]
    loader = DataLoader(data, batch_size=64, num_workers=2, multiprocessing_context="fork" if fixed else "spawn")
    print(f"iterated {sum(len(b) for b in loader)} samples")


@scenario(
    name="fd-loader-kept-batches",
    predict=Prediction(
        "check", ("--sharing-strategy", "file_descriptor", "--start-method", "fork"), rlimits=(("NOFILE", LOW_NOFILE),)
    ),
    family="fd-exhausted",
    code="TD152",
    summary=f"the main process keeps every batch from 2 fork workers (500 batches, one storage each) with "
    f"RLIMIT_NOFILE {LOW_NOFILE}: the DataLoader's own 'Too many open files. Communication with the "
    "workers is no longer possible'",
    fix="torch.multiprocessing.set_sharing_strategy('file_system') at the start (as torch's message says)",
    seconds=2.5,
    timeout=60.0,
    private_shm=True,  # the fixed variant shares through /dev/shm files (file_system)
)
def fd_loader_kept_batches(fixed: bool) -> None:
    import torch
    import torch.multiprocessing as mp
    from torch.utils.data import DataLoader

    _lower_nofile()
    if fixed:
        mp.set_sharing_strategy("file_system")
    data: Any = [torch.full((96,), float(i)) for i in range(TENSORS)]
    kept = list(DataLoader(data, batch_size=2, num_workers=2))  # every batch kept: one descriptor each
    print(f"kept {len(kept)} batches")
