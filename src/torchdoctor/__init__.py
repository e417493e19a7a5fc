"""torchdoctor: prevent, detect and explain the failures where PyTorch training meets the OS.

The public API is what ``__all__`` names; everything in underscore-free submodules not listed
here may change. torch is never imported by ``import torchdoctor``.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .checks import run_checks
from .errors import FactsFileError, TorchDoctorError, UnknownCodeError, UsageError
from .facts import Facts, GatherContext, gather
from .families import FAMILIES
from .model import Evidence, ExitCode, Finding, Severity
from .options import CheckOptions
from .registry import Code, Hit, all_codes, lookup


def check(options: CheckOptions | None = None, facts: Facts | None = None) -> list[Finding]:
    """Findings for this host (or for ``facts``), worst first: the API form of ``torchdoctor check``."""
    return run_checks(facts if facts is not None else gather(), options)


__all__ = [
    "CheckOptions",
    "Code",
    "Evidence",
    "ExitCode",
    "FAMILIES",
    "Facts",
    "FactsFileError",
    "Finding",
    "GatherContext",
    "Hit",
    "Severity",
    "TorchDoctorError",
    "UnknownCodeError",
    "UsageError",
    "__version__",
    "all_codes",
    "check",
    "gather",
    "lookup",
    "run_checks",
]
