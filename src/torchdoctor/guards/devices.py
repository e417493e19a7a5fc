"""``torchdoctor.select_device`` and ``torchdoctor.limit_gpu_memory``: the GPU this rank should use.

The choice is a pure function of the node's facts (NVML through :mod:`torchdoctor.facts`, never a
CUDA context) and of this rank: :func:`choose_device`, testable on recorded facts. The device of
``LOCAL_RANK`` (through ``CUDA_VISIBLE_DEVICES``) comes first; a GPU is skipped when it is in
Exclusive_Process mode and held by another process (TD303), compute-prohibited (TD304), has less
free memory than asked for (TD305), or is already used by another rank of this job (TD488).
``torch.cuda.set_device`` is called in the calling process only, and only when a GPU was chosen.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..catalogue.gpu import _LOCAL_RANK_VARS
from ..errors import TorchDoctorError
from ..facts import Facts
from ..units import human_bytes

_JOB_VARS = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "MASTER_PORT")


class DeviceError(TorchDoctorError):
    """No acceptable device: the codes of what was wrong with each GPU, and the fix."""

    def __init__(self, message: str, code: str, skipped: list[dict[str, Any]] | None = None) -> None:
        from ..registry import lookup

        info = lookup(code)
        super().__init__(f"{message} [{code} {info.name}]. Fix: {info.plain_fix}")
        self.code, self.family, self.skipped = code, info.family, skipped or []


@dataclass(frozen=True)
class DeviceChoice:
    device: str
    """``cuda:N`` (N: the ordinal this process uses) or ``cpu``."""
    ordinal: int | None
    physical_index: int | None
    uuid: str | None
    reason: str
    skipped: list[dict[str, Any]] = field(default_factory=list)
    """Each GPU passed over: ``{"gpu", "code", "why"}``."""

    def explain(self) -> str:
        lines = [f"{self.device}: {self.reason}"]
        lines += [f"  skipped {s['gpu']}: {s['why']} ({s['code']})" for s in self.skipped]
        return "\n".join(lines)


def local_rank(env: dict[str, str]) -> int:
    for name in _LOCAL_RANK_VARS:
        raw = env.get(name, "").strip()
        if raw.isdigit():
            return int(raw)
    return 0


def choose_device(
    facts: Facts,
    rank: int = 0,
    *,
    min_free_bytes: int | None = None,
    job_pids: Iterable[int] = (),
    allow_cpu: bool = False,
) -> DeviceChoice:
    """The device for local rank ``rank`` from the node's facts; raises :class:`DeviceError` when none fits
    and ``allow_cpu`` is False. ``job_pids``: processes of other ranks of this job (their GPUs are taken)."""
    from ..catalogue.gpu import _visible

    visible = _visible(facts) if facts.gpu.available else []
    if not visible:
        if allow_cpu:
            return DeviceChoice("cpu", None, None, None, "no GPU is visible to this process; CPU allowed")
        hidden = "CUDA_VISIBLE_DEVICES hides every GPU" if facts.gpu.visible.hides_all else "no GPU is visible"
        raise DeviceError(f"{hidden}; allow_cpu=False", "TD308" if facts.gpu.visible.hides_all else "TD301")
    mine = {facts.host.pid}
    others = set(job_pids) - mine
    order = [(rank + k) % len(visible) for k in range(len(visible))]
    skipped: list[dict[str, Any]] = []
    for ordinal in order:
        dev = visible[ordinal]
        label = f"cuda:{ordinal} (GPU {dev.index}, {dev.name or '?'})"
        foreign = [p for p in dev.processes if p.pid not in mine and "C" in (p.type or "C")]
        why: str | None = None
        code: str | None = None
        if dev.compute_mode == "Prohibited":
            why, code = "compute mode Prohibited", "TD304"
        elif dev.compute_mode == "Exclusive_Process" and foreign:
            why, code = f"Exclusive_Process, held by pid {', '.join(str(p.pid) for p in foreign[:3])}", "TD303"
        elif any(p.pid in others for p in dev.processes):
            pids = [p.pid for p in dev.processes if p.pid in others]
            why, code = f"already used by another rank of this job (pid {', '.join(map(str, pids))})", "TD488"
        elif (
            min_free_bytes is not None and dev.memory.free_bytes is not None and dev.memory.free_bytes < min_free_bytes
        ):
            why = f"{human_bytes(dev.memory.free_bytes)} free, {human_bytes(min_free_bytes)} needed"
            code = "TD305"
        if why is None:
            first = ordinal == order[0]
            reason = (f"the GPU of local rank {rank}" if first else f"the first usable GPU after cuda:{order[0]}") + (
                f", {human_bytes(dev.memory.free_bytes)} free" if dev.memory.free_bytes is not None else ""
            )
            return DeviceChoice(f"cuda:{ordinal}", ordinal, dev.index, dev.uuid, reason, skipped)
        skipped.append({"gpu": label, "code": code, "why": why})
    if allow_cpu:
        return DeviceChoice("cpu", None, None, None, "no visible GPU is usable; CPU allowed", skipped)
    raise DeviceError(
        f"none of the {len(visible)} visible GPU(s) is usable: "
        + "; ".join(f"{s['gpu']}: {s['why']}" for s in skipped),
        str(skipped[0]["code"]),
        skipped,
    )


def _job_pids() -> set[int]:
    """Pids of processes of this job on this host (same TORCHELASTIC_RUN_ID / SLURM_JOB_ID / MASTER_PORT)."""
    keys = {k: os.environ[k] for k in _JOB_VARS if os.environ.get(k)}
    if not keys:
        return set()
    out = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            raw = open(f"/proc/{name}/environ", "rb").read().split(b"\0")  # noqa: SIM115 - read once
        except OSError:
            continue
        env = dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)
        if all(env.get(k) == v for k, v in keys.items()) and env.get("RANK") != os.environ.get("RANK"):
            out.add(int(name))
    return out


def select_device(
    *,
    min_free_bytes: int | None = None,
    allow_cpu: bool = False,
    wait: float = 0.0,
    poll: float = 5.0,
    set_device: bool = True,
) -> DeviceChoice:
    """Choose this rank's device (see the module doc), waiting up to ``wait`` seconds for one to become
    usable; then ``torch.cuda.set_device`` it in this process. ``choice.explain()`` says why."""
    from ..facts import GatherContext, gather

    if min_free_bytes is not None and min_free_bytes < 0:
        raise ValueError(f"min_free_bytes={min_free_bytes!r}: give bytes >= 0")
    if wait < 0 or poll <= 0:
        raise ValueError("wait must be >= 0 and poll > 0 seconds")
    deadline = time.monotonic() + wait
    rank = local_rank(dict(os.environ))
    while True:
        facts = gather(GatherContext(torch=False), sections=["host", "gpu"])
        try:
            choice = choose_device(
                facts, rank, min_free_bytes=min_free_bytes, job_pids=_job_pids(), allow_cpu=allow_cpu and wait <= 0
            )
            break
        except DeviceError:
            if time.monotonic() + poll > deadline:
                if allow_cpu:
                    choice = choose_device(facts, rank, min_free_bytes=min_free_bytes, job_pids=(), allow_cpu=True)
                    break
                raise
            time.sleep(poll)
    if set_device and choice.ordinal is not None:
        import torch

        torch.cuda.set_device(choice.ordinal)
    return choice


def limit_gpu_memory(fraction: float, device: int | None = None) -> None:
    """``torch.cuda.set_per_process_memory_fraction`` with its argument checked and a clear error without CUDA."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise TypeError(f"fraction={fraction!r}: give a number in (0, 1]")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction={fraction!r}: give a number in (0, 1] (0.5 = half of the GPU's memory)")
    import torch

    if not torch.cuda.is_available():
        raise DeviceError("limit_gpu_memory: this process sees no CUDA device", "TD301")
    torch.cuda.set_per_process_memory_fraction(float(fraction), device)
