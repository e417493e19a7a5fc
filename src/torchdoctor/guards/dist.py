"""``torchdoctor.init_distributed``: ``init_process_group`` that fails in seconds with the reason.

Before anything connects, the foundation's distributed checks run on this process's environment
(missing or inconsistent RANK/WORLD_SIZE/MASTER_*, a MASTER_PORT already taken on rank 0's host, an
unresolvable MASTER_ADDR, socket interfaces): any error is raised as :class:`DistInitError` with its
code and fix. Then the backend is chosen (nccl when this process sees a GPU and torch has NCCL,
else gloo), the device is set first (:func:`~torchdoctor.guards.devices.select_device`), a timeout
applied (torch's default is 30 minutes), and torch's own failures are explained into the same
error. The process group is destroyed at exit.
"""

from __future__ import annotations

import atexit
import datetime
import os
import traceback
from dataclasses import dataclass
from typing import Any

from ..errors import TorchDoctorError

#: Seconds init_process_group may take by default (rendezvous included).
DEFAULT_TIMEOUT = 300.0


class DistInitError(TorchDoctorError):
    def __init__(self, message: str, code: str | None, fix: str = "") -> None:
        from ..registry import lookup

        info = lookup(code) if code else None
        fix = fix or (info.plain_fix if info else "")
        text = f"{message}" + (f" [{code} {info.name}]" if info else "") + (f". Fix: {fix}" if fix else "")
        super().__init__(text)
        self.code = code
        self.family = info.family if info else None
        self.fix = fix


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: str


def preflight() -> None:
    """The foundation's distributed checks on this process: raise the first error as :class:`DistInitError`."""
    from ..checks import run_checks
    from ..facts import GatherContext, gather
    from ..options import CheckOptions
    from ..registry import all_codes

    facts = gather(GatherContext(dist=True, torch=False), sections=["host", "dist"])
    codes = [c for c in all_codes() if c.area == "distributed" and c.check is not None]
    errors = [f for f in run_checks(facts, CheckOptions(dist=True), codes) if f.severity.label == "error"]
    if errors:
        raise DistInitError(errors[0].message, errors[0].code, errors[0].fix)
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name):
            raise DistInitError(
                f"environment variable {name} is not set: start the script with torchrun (or srun), which sets it",
                "TD450",
            )


def init_distributed(
    backend: str | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    min_free_bytes: int | None = None,
    allow_cpu: bool = True,
) -> DistInfo:
    """Validate, choose the backend, set the device, ``init_process_group`` with a timeout; raise
    :class:`DistInitError` (code, fix) instead of hanging or a bare torch error."""
    if backend not in (None, "gloo", "nccl"):
        raise ValueError(f"backend={backend!r}: gloo, nccl or None (chosen from the device)")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout={timeout!r}: give seconds > 0")
    preflight()
    import torch
    import torch.distributed as dist

    from .devices import local_rank, select_device

    if dist.is_initialized():
        raise DistInitError("the default process group is already initialised", None, "call init_distributed once")
    gpu = torch.cuda.is_available()
    chosen = backend or ("nccl" if gpu and dist.is_nccl_available() else "gloo")
    if chosen == "nccl" and not dist.is_nccl_available():
        raise DistInitError("backend='nccl' but this torch build has no NCCL", "TD464")
    device = "cpu"
    if gpu:
        device = select_device(min_free_bytes=min_free_bytes, allow_cpu=allow_cpu and chosen == "gloo").device
    kwargs: dict[str, Any] = {}
    if chosen == "nccl" and device.startswith("cuda"):
        kwargs["device_id"] = torch.device(device)
    try:
        dist.init_process_group(chosen, timeout=datetime.timedelta(seconds=timeout), **kwargs)
    except Exception as exc:  # noqa: BLE001 - torch's failure, explained
        from ..explain import explain

        report = explain("".join(traceback.format_exception(exc)))
        top = report.top
        raise DistInitError(
            f"init_process_group({chosen!r}) failed: {str(exc).splitlines()[0]}", top.code if top else None
        ) from exc
    atexit.register(_destroy)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank(dict(os.environ)), chosen, device)


def _destroy() -> None:
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - at exit, best effort
        pass
