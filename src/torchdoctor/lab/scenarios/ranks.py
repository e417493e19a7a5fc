"""Ranks that drift apart while training: parameters (TD469) and memory (TD277), two gloo ranks on loopback.

Ranks are started with ``torch.multiprocessing.start_processes`` (fork: torch is already imported by
the scenario's process, so the ranks start in a fraction of a second). Each rank writes its own
lines with a ``[rankN]:`` prefix (as torchrun ``--tee`` does) in one ``write`` per message, so the
ranks' texts never interleave; a rank that fails prints its traceback that way and exits 1.

``ranks-param-perturbed``: a fine-tuning script seeds each rank differently (``seed + rank``, for
its data augmentation) and re-initialises the classifier head *after* wrapping the model in DDP.
DDP broadcast rank 0's parameters once, at construction; the new heads differ per rank and stay
different, since every rank applies the same averaged update to its own values. ``check_in_sync``
every few steps raises ``RankDivergenceError`` on every rank. The fix re-initialises the head
before wrapping, so DDP's broadcast covers it.

``ranks-memory-extra``: rank 0 also evaluates a probe batch every step (``model.module``, without
``torch.no_grad()``) and keeps each probe loss as a tensor for an epoch-end mean: every kept loss
holds its graph and the activations saved in it. Rank 0 runs under an RLIMIT_AS of its address
space plus :data:`HEADROOM` (set after torch, gloo and the first step are up), so it really runs out
(torch's ``DefaultCPUAllocator: can't allocate memory``); before that, the ``MemoryTracker`` report
gathered every :data:`GATHER_EVERY` steps names rank 0 and the steps over which it grew. The fix
keeps ``loss.item()``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .. import scenario
from .dist import DIST_ENV, GRACE_S, JOIN_TIMEOUT_S, LOOPBACK, TIMEOUT_S, _timeout

WORLD = 2
SEED = 1234
#: Training steps; check_in_sync runs every CHECK_EVERY of them.
SYNC_STEPS = 12
CHECK_EVERY = 4
MiB = 1024 * 1024
#: Address space rank 0 gets beyond what it has mapped once training runs: ~22 steps of kept probe graphs.
HEADROOM = 384 * MiB
#: Rows of rank 0's probe batch: its kept graph holds a 2048 x 2048 float32 activation (16 MiB) per step.
PROBE_ROWS = 2048
HIDDEN = 2048
#: Input and output width: narrow, so a step computes little per MiB it keeps.
WIDTH = 16
#: Rank 0 starts probing at this step (the first steps are balanced: the report shows where growth began).
PROBE_FROM = 4
#: Steps of the memory scenario: twice what the headroom lasts, so the unfixed run surely runs out.
MEMORY_STEPS = 56
GATHER_EVERY = 4


def _say(rank: int, text: str) -> None:
    """``text`` with a ``[rankN]:`` prefix on each line, in one write (the ranks share the output)."""
    lines = "".join(f"[rank{rank}]: {line}\n" for line in text.rstrip("\n").splitlines())
    os.write(1, lines.encode("utf-8", errors="replace"))


def _rank(rank: int, fn: Any, port: int, *args: Any) -> None:
    """Join the group, run ``fn(rank, group, *args)``; print a failure's traceback as this rank's and exit 1."""
    import traceback

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # two ranks on two cores
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{LOOPBACK}:{port}",
            rank=rank,
            world_size=WORLD,
            timeout=_timeout(JOIN_TIMEOUT_S),
        )
        group = dist.new_group(timeout=_timeout(TIMEOUT_S))
        fn(rank, group, *args)
        dist.destroy_process_group()
    except Exception:
        _say(rank, traceback.format_exc())
        sys.exit(1)


def _start(fn: Any, *args: Any) -> None:
    """``WORLD`` ranks of ``fn`` under torch.multiprocessing; a rank's failure ends the others and raises."""
    import torch.multiprocessing as mp

    from ...facts.dist_env import free_port

    ctx = mp.start_processes(_rank, args=(fn, free_port(), *args), nprocs=WORLD, join=False, start_method="fork")
    while not ctx.join(grace_period=GRACE_S):
        pass


def _model() -> Any:
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )


# -- TD469: a layer re-initialised after DDP wrapped the model ----------------------------------------


def _finetune(rank: int, group: Any, fixed: bool) -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ...ranks.sync import check_in_sync

    torch.manual_seed(SEED + rank)  # per-rank seed, for this rank's data augmentation
    model = _model()
    head = model[-1]
    if fixed:
        head.reset_parameters()  # the fix: before wrapping, so DDP's broadcast makes every rank's head rank 0's
    ddp = DDP(model, process_group=group)
    if not fixed:
        head.reset_parameters()  # the bug: after wrapping, under this rank's own seed
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(SYNC_STEPS):
        x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        if step % CHECK_EVERY == CHECK_EVERY - 1:
            report = check_in_sync(ddp, group=group, raise_on_mismatch=True)
            if rank == 0:
                _say(rank, f"step {step}: {report.render()}")


@scenario(
    name="ranks-param-perturbed",
    family="rank-divergence",
    code="TD469",
    summary="two gloo ranks seeded seed+rank re-initialise the classifier head after wrapping the model in DDP; "
    f"check_in_sync every {CHECK_EVERY} steps raises RankDivergenceError on both ranks: "
    "'TD469 rank-divergence: 4.weight differs on rank(s) 1'",
    fix="re-initialise (or load) before wrapping in DDP, which broadcasts rank 0's parameters at construction",
    seconds=4.0,
    timeout=90.0,
    memory_mb=1024,
    env=DIST_ENV,
)
def ranks_param_perturbed(fixed: bool) -> None:
    _start(_finetune, fixed)


# -- TD277: rank 0 keeps every probe loss with its graph ------------------------------------------------


def _address_space() -> int:
    """This process's mapped address space (VmSize), in bytes: what RLIMIT_AS is compared with."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmSize:"))
    return int(line.split()[1]) * 1024


def _train_with_probe(rank: int, group: Any, fixed: bool) -> None:
    import resource

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ...ranks.memory import MemoryTracker

    torch.manual_seed(SEED)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, WIDTH))
    ddp = DDP(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    probe_x, probe_y = torch.randn(PROBE_ROWS, WIDTH), torch.randn(PROBE_ROWS, WIDTH)
    tracker = MemoryTracker(every=1)
    probe_losses: list[Any] = []
    for step in range(MEMORY_STEPS):
        x, y = torch.randn(256, WIDTH), torch.randn(256, WIDTH)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        if rank == 0 and step >= PROBE_FROM:
            probe = torch.nn.functional.mse_loss(model(probe_x), probe_y)  # rank 0's extra work, with grad on
            probe_losses.append(probe.item() if fixed else probe)  # the bug keeps the tensor, and its graph
        if step == 0 and rank == 0:  # threads and buffers of torch and gloo exist now: only growth is limited
            limit = _address_space() + HEADROOM
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        tracker.sample(step)
        if step % GATHER_EVERY == GATHER_EVERY - 1:
            report = tracker.gather(group)
            if rank == 0:
                _say(rank, f"step {step}: {report.render()}")
    if rank == 0:
        _say(rank, f"mean probe loss {sum(float(v) for v in probe_losses) / max(1, len(probe_losses)):.4f}")


@scenario(
    name="ranks-memory-extra",
    family="host-oom",
    code="TD277",
    summary="two gloo ranks; rank 0 also evaluates a probe batch each step and keeps the loss tensors (with their "
    f"graphs) under RLIMIT_AS of its address space + {HEADROOM // MiB} MiB: MemoryTracker's 'TD277 host-oom: rank "
    "0's peak host memory ...' report, then 'DefaultCPUAllocator: can't allocate memory' on rank 0",
    fix="keep probe_loss.item() (a float), not the tensor and its graph",
    seconds=5.0,
    timeout=90.0,
    memory_mb=2048,
    env=DIST_ENV,
)
def ranks_memory_extra(fixed: bool) -> None:
    _start(_train_with_probe, fixed)
