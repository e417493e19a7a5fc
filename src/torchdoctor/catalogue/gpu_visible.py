"""TD307-TD310: which GPUs a process sees (CUDA_VISIBLE_DEVICES) and how ranks map onto them."""

from __future__ import annotations

from collections.abc import Iterator

from ..facts import Facts
from ..model import Severity
from ..options import CheckOptions
from ..registry import Code, Hit, register
from ._processes import local_processes
from ._util import ev
from .gpu import (
    _LOCAL_RANK_VARS,
    NVSMI,
    _cuda_visible_ev,
    _env_int,
    _visible,
)

# -- TD307 / TD308 CUDA_VISIBLE_DEVICES ---------------------------------------------------------------


def _check_visible_invalid(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    vis = facts.gpu.visible
    if not facts.gpu.available or not vis.env_set or vis.hides_all or not vis.invalid:
        return
    count = facts.gpu.device_count or 0
    ignored = vis.ignored
    yield Hit(
        {
            "value": vis.value,
            "bad": vis.invalid[0],
            "count": count,
            "last": count - 1,
            "seen": vis.count or 0,
            "ignored": f" (and ignores {', '.join(ignored)} after it)" if ignored else "",
        },
        (
            _cuda_visible_ev(facts),
            ev("GPUs on this machine", count, NVSMI),
            ev("GPUs CUDA will see", vis.count or 0, "CUDA stops at the first invalid entry"),
        ),
    )


TD307 = register(
    Code(
        code="TD307",
        name="cuda-visible-devices-invalid",
        family="gpu-unavailable",
        severity=Severity.ERROR,
        area="gpu",
        title="CUDA_VISIBLE_DEVICES names a GPU this machine does not have",
        message="CUDA_VISIBLE_DEVICES={value} names {bad}, which is not one of this machine's {count} GPU(s); CUDA stops "
        "reading at that entry{ignored} and shows the process {seen} GPU(s).",
        fix="Use indices 0-{last} or UUIDs from `nvidia-smi -L` (`export CUDA_VISIBLE_DEVICES=0,1`), or unset it to "
        "use every GPU; under Slurm let the scheduler set it (request `--gpus-per-node=N`).",
        meaning="CUDA enumerates the listed GPUs in order and silently drops the first invalid entry and everything "
        "after it.",
        why="A value copied from another machine, an index counted from 1, a UUID of a GPU that was replaced, or a "
        "script that sets CUDA_VISIBLE_DEVICES after the scheduler already renumbered the GPUs.",
        false_positives="Indices follow CUDA_DEVICE_ORDER; on mixed-model machines see TD312.",
        related=("TD308", "TD309", "TD312"),
        check=_check_visible_invalid,
    )
)


def _check_visible_hidden(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    vis = facts.gpu.visible
    if facts.gpu.available and vis.env_set and vis.hides_all:
        count = facts.gpu.device_count or 0
        yield Hit(
            {"value": repr(vis.value), "count": count},
            (_cuda_visible_ev(facts), ev("GPUs on this machine", count, NVSMI)),
        )


TD308 = register(
    Code(
        code="TD308",
        name="cuda-visible-devices-hides-all",
        family="gpu-unavailable",
        severity=Severity.WARNING,
        area="gpu",
        title="CUDA_VISIBLE_DEVICES hides every GPU",
        message="CUDA_VISIBLE_DEVICES={value} hides all {count} GPU(s) of this machine: torch.cuda.is_available() is False.",
        fix="`unset CUDA_VISIBLE_DEVICES`, or set it to the GPUs to use (`export CUDA_VISIBLE_DEVICES=0`); under Slurm "
        "request GPUs for the job (`--gpus-per-node=N`).",
        meaning="An empty value, -1, or Slurm's NoDevFiles (a job without a GPU allocation) leave CUDA no device.",
        why="A script hides GPUs for a CPU step and the setting leaks into the training step, or the Slurm job did not "
        "request GPUs.",
        false_positives="Deliberate CPU-only runs on a GPU machine.",
        related=("TD307", "TD301"),
        check=_check_visible_hidden,
    )
)


# -- TD309 / TD310 ranks and devices -------------------------------------------------------------------


def _check_local_rank(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    if not facts.gpu.available:
        return
    rank, var = _env_int(facts, *_LOCAL_RANK_VARS)
    count = len(_visible(facts))
    if rank is None or count == 0 or rank < count:
        return
    per_task = "SLURM_GPUS_PER_TASK" in facts.host.env
    yield Hit(
        {"var": var, "rank": rank, "count": count, "last": count - 1},
        (
            ev(var or "local rank", rank, "environment"),
            ev("GPUs visible to this process", count, "CUDA_VISIBLE_DEVICES, NVML"),
            _cuda_visible_ev(facts),
        ),
        severity=Severity.WARNING if per_task else None,
    )


TD309 = register(
    Code(
        code="TD309",
        name="local-rank-without-gpu",
        family="gpu-unavailable",
        severity=Severity.ERROR,
        area="gpu",
        title="The local rank has no GPU of its own",
        message="{var}={rank} but this process sees {count} GPU(s) (cuda:0-cuda:{last}); "
        "`torch.cuda.set_device({rank})` fails with 'CUDA error: invalid device ordinal'.",
        fix="Start at most {count} processes per node (`torchrun --nproc-per-node={count}`), or give the job more GPUs. "
        "If each task is bound to its own GPU (`srun --gpus-per-task=1`), use `cuda:0` instead of the local rank.",
        meaning="Device ordinals are indices into the GPUs this process can see, so they must be below their count.",
        why="More processes per node than GPUs, CUDA_VISIBLE_DEVICES narrowed per task while the code still indexes by "
        "LOCAL_RANK, or a rank variable from another launcher.",
        false_positives="Code that maps ranks with `local_rank % torch.cuda.device_count()` (see TD310 instead).",
        related=("TD310", "TD307"),
        check=_check_local_rank,
    )
)


def _check_ranks_share(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    if not facts.gpu.available or "SLURM_GPUS_PER_TASK" in facts.host.env:
        return
    procs = local_processes(facts, opts)
    world, source = procs.count, procs.source
    count = len(_visible(facts))
    if not procs.known or count == 0 or world <= count:
        return
    nccl = facts.torch.backends.nccl
    yield Hit(
        {"world": world, "source": source, "count": count},
        (
            ev("processes on this node", world, source),
            ev("GPUs visible to each", count, "CUDA_VISIBLE_DEVICES, NVML"),
            ev(
                "torch NCCL backend",
                "unknown" if nccl is None else "available" if nccl else "not in this build",
                "torch/lib",
            ),
        ),
        severity=None if nccl else Severity.WARNING,
    )


TD310 = register(
    Code(
        code="TD310",
        name="ranks-share-gpu",
        family="nccl",
        severity=Severity.ERROR,
        area="gpu",
        title="More ranks on this node than GPUs",
        message="{world} processes per node ({source}) but only {count} visible GPU(s): at least two ranks end up on the "
        "same GPU; NCCL refuses with 'Duplicate GPU detected : rank X and rank Y both on CUDA device ...' and "
        "other backends share its memory.",
        fix="One process per GPU: `torchrun --nproc-per-node={count}` (or `srun --ntasks-per-node={count}`), or give the "
        "job {world} GPUs (`--gpus-per-node={world}`).",
        meaning="NCCL needs every rank of a communicator on a distinct GPU; ncclCommInitRank fails with "
        "ncclInvalidUsage otherwise.",
        why="nproc-per-node set to the CPU count or a fixed number, a Slurm allocation with fewer GPUs than tasks, or "
        "CUDA_VISIBLE_DEVICES restricted after launch.",
        false_positives="Per-task GPU binding (each rank sees a different single GPU) cannot be seen from one process; "
        "jobs with SLURM_GPUS_PER_TASK are skipped.",
        related=("TD309", "TD305"),
        check=_check_ranks_share,
    )
)
