"""The failure lab: each failure mode reproduced for real, in an isolated child, on demand.

A :class:`Scenario` is declared once (in ``torchdoctor/lab/scenarios/<domain>.py``) with the
catalogue code and family that ``explain`` must name for its output. Its ``body`` runs in a child
process started by :mod:`torchdoctor.lab.runner` (own session/process group, time and memory
bounds, optional private mount namespace); ``body(fixed=True)`` applies the catalogue's
recommended fix and must succeed.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import UnknownCodeError
from ..families import FAMILIES
from .predict import Prediction

#: What a scenario may need from the machine; the runner skips it with the reason when missing.
NEEDS = {
    "torch": "torch importable",
    "root": "running as root",
    "unshare": "unshare -m (private mount namespace)",
    "chattr": "chattr on the temp file system",
    "setpriv": "setpriv to drop privileges",
    "lightning": "PyTorch Lightning importable (lightning or pytorch_lightning)",
}


@dataclass(frozen=True)
class Scenario:
    name: str
    family: str
    code: str
    """The code ``explain`` must name as root cause for this scenario's output."""
    summary: str
    body: Callable[[bool], None]
    """Runs in the child: ``body(fixed)``. The failure must really happen when ``fixed`` is False
    (the child exits non-zero with torch's/Python's own error text); with ``fixed`` True it must pass."""
    fix: str
    """The fix that ``--fixed`` applies, in words."""
    needs: tuple[str, ...] = ("torch",)
    seconds: float = 5.0
    """Typical run time here, for ``lab list`` and test planning."""
    timeout: float = 60.0
    memory_mb: int = 2048
    """The runner kills the child's process group when its total RSS exceeds this."""
    shm_size: str | None = None
    """Mount a private tmpfs of this size over /dev/shm for the child (needs root and unshare)."""
    private_shm: bool = False
    """Give the child a private (large) tmpfs on /dev/shm when root, so leaked segments never reach the real one."""
    slow: bool = False
    env: dict[str, str] = field(default_factory=dict)
    predict: Prediction | None = None
    """How the preflight that should see this failure coming is run (``lab run`` reports ``predicted``)."""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", self.name):
            raise ValueError(f"scenario name {self.name!r} is not kebab-case")
        if self.family not in FAMILIES:
            raise ValueError(f"{self.name}: unknown family {self.family!r}")
        unknown = set(self.needs) - set(NEEDS)
        if unknown:
            raise ValueError(f"{self.name}: unknown needs {unknown}")


_SCENARIOS: dict[str, Scenario] = {}


def scenario(**kwargs: object) -> Callable[[Callable[[bool], None]], Callable[[bool], None]]:
    """Declare the decorated function as a scenario's body: ``@scenario(name=..., family=..., ...)``."""

    def wrap(fn: Callable[[bool], None]) -> Callable[[bool], None]:
        s = Scenario(body=fn, **kwargs)  # type: ignore[arg-type]
        if s.name in _SCENARIOS:
            raise ValueError(f"scenario {s.name} declared twice")
        _SCENARIOS[s.name] = s
        return fn

    return wrap


def _load() -> None:
    from . import scenarios

    for mod in sorted(m.name for m in pkgutil.iter_modules(scenarios.__path__) if not m.name.startswith("_")):
        importlib.import_module(f"{scenarios.__name__}.{mod}")


def all_scenarios() -> list[Scenario]:
    _load()
    return sorted(_SCENARIOS.values(), key=lambda s: (s.code, s.name))


def get(name: str) -> Scenario:
    _load()
    if name in _SCENARIOS:
        return _SCENARIOS[name]
    import difflib

    raise UnknownCodeError(
        name,
        difflib.get_close_matches(name, list(_SCENARIOS), n=3),
        what="scenario",
        hint=None
        if difflib.get_close_matches(name, list(_SCENARIOS), n=3)
        else "; run `torchdoctor lab list` for the scenarios",
    )
