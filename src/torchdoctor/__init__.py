"""torchdoctor: prevent, detect and explain the failures where PyTorch training meets the OS.

The public API is what ``__all__`` names. Attributes load on first use, so ``import torchdoctor``
costs almost nothing and never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "CheckOptions": "options",
    "Code": "registry",
    "Diagnosis": "explain",
    "Evidence": "model",
    "ExitCode": "model",
    "ExplainReport": "explain",
    "FAMILIES": "families",
    "Facts": "facts",
    "FactsFileError": "errors",
    "Finding": "model",
    "GatherContext": "facts",
    "Hit": "registry",
    "Severity": "model",
    "Signature": "signature",
    "Role": "signature",
    "TorchDoctorError": "errors",
    "UnknownCodeError": "errors",
    "UsageError": "errors",
    "all_codes": "registry",
    "explain": "explain",
    "explain_exception": "explain",
    "gather": "facts",
    "lookup": "registry",
    "run_checks": "checks",
    "probe_loader": "probes",
    "ProbeOptions": "probes",
    "LoaderReport": "probes",
    "Watcher": "watch",
    "CheckpointError": "guards.checkpoint",
    "DeviceError": "guards.devices",
    "select_device": "guards.devices",
    "limit_gpu_memory": "guards.devices",
    "DistInitError": "guards.dist",
    "init_distributed": "guards.dist",
    "save": "guards.checkpoint",
    "load": "guards.checkpoint",
    "RankFile": "guards.rankfile",
    "RankFileHandler": "guards.rankfile",
    "rank0_only": "guards.rankfile",
    **dict.fromkeys(["guard", "worker_init_fn", "seed_worker", "cap_worker_threads", "make_worker_init_fn"], "guards"),
    "check_in_sync": "ranks.sync",
    "RankDivergenceError": "ranks.sync",
    "MemoryTracker": "ranks.memory",
    "determinism_report": "ranks.determinism",
    "RunRecorder": "ranks.fingerprint",
}

if TYPE_CHECKING:
    from .checks import run_checks
    from .errors import FactsFileError, TorchDoctorError, UnknownCodeError, UsageError
    from .explain import Diagnosis, ExplainReport, explain, explain_exception
    from .facts import Facts, GatherContext, gather
    from .families import FAMILIES
    from .guards import cap_worker_threads, guard, make_worker_init_fn, seed_worker, worker_init_fn
    from .guards.checkpoint import CheckpointError, load, save
    from .guards.devices import DeviceError, limit_gpu_memory, select_device
    from .guards.dist import DistInitError, init_distributed
    from .guards.rankfile import RankFile, RankFileHandler, rank0_only
    from .model import Evidence, ExitCode, Finding, Severity
    from .options import CheckOptions
    from .probes import LoaderReport, ProbeOptions, probe_loader
    from .ranks.determinism import determinism_report
    from .ranks.fingerprint import RunRecorder
    from .ranks.memory import MemoryTracker
    from .ranks.sync import RankDivergenceError, check_in_sync
    from .registry import Code, Hit, all_codes, lookup
    from .signature import Role, Signature
    from .watch import Watcher


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'torchdoctor' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def check(options: CheckOptions | None = None, facts: Facts | None = None) -> list[Finding]:
    """Findings for this host (or for ``facts``), worst first: the API form of ``torchdoctor check``."""
    from .checks import run_checks
    from .facts import gather

    return run_checks(facts if facts is not None else gather(), options)


__all__ = sorted([*_EXPORTS, "__version__", "check"])
