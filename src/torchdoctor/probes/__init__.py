"""Probes: run the user's real objects in an isolated child and predict how they will fail.

``probe_loader(target, ...)`` is the API form of ``torchdoctor loader TARGET``: it gathers the
host's facts, runs the target in a child process (:mod:`.child`, watched by :mod:`.isolate`),
adds what the child measured to the facts as the ``loader`` section (:mod:`.judge`) and returns
the findings of the catalogue's loader codes with everything measured.

::

    parent (this process)                 child (own session, timeout, memory cap)
    gather facts (limits, shm, cpu)  ──►  import target, build DataLoader
                                          static: start method, pickling, storages
                                          batch in-process, live workers, tune
    events ◄── one JSON line per step ──  (user's stdout/stderr kept apart)
    judge: facts + loader section → findings; every process of the session reaped
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import UsageError
from ..facts import Facts
from ..model import Finding
from .target import Overrides

DEFAULT_TIMEOUT = 60.0
DEFAULT_TUNE_TIMEOUT = 600.0
DEFAULT_BATCHES = 8


@dataclass(frozen=True)
class ProbeOptions(Overrides):
    """The DataLoader arguments to override (:class:`~.target.Overrides`: None keeps the target's
    choice), and how to probe."""

    parent_start_method: str | None = None
    """The start method of the process the loader will run in ("this loader runs inside a spawn child")."""
    sharing_strategy: str | None = None
    static: bool = False
    force_live: bool = False
    batches: int = DEFAULT_BATCHES
    timeout: float | None = None
    memory_cap: int | None = None
    tune: bool = False
    max_workers: int | None = None
    tune_seconds: float = 1.0
    """Measuring window per run of a tried setting, and of the live run's throughput."""
    tune_budget: float | None = None
    """Seconds the tuner may spend repeating settings whose readings disagree (default 30 × tune_seconds)."""

    def overrides(self) -> dict[str, Any]:
        """The overrides that were given, as the probe child rebuilds them (``Overrides(**...)``)."""
        return {f.name: getattr(self, f.name) for f in fields(Overrides) if getattr(self, f.name) is not None}


@dataclass
class LoaderReport:
    target: str
    findings: list[Finding]
    facts: Facts
    section: dict[str, Any] = field(default_factory=dict)

    @property
    def outcome(self) -> dict[str, Any]:
        return dict(self.section.get("outcome") or {})

    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def by_code(self, code: str) -> Finding | None:
        return next((f for f in self.findings if f.code == code), None)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "probe": self.section, "findings": [f.to_dict() for f in self.findings]}


def target_of(obj: Any) -> str:
    """A TARGET string for a factory given as a callable (it must be importable by name)."""
    if isinstance(obj, str):
        return obj
    if callable(obj) and getattr(obj, "__qualname__", None) and "<" not in obj.__qualname__:
        module = getattr(obj, "__module__", None)
        if module == "__main__":
            import __main__

            path = getattr(__main__, "__file__", None)
            if path:
                return f"{os.path.abspath(path)}:{obj.__qualname__}"
        elif module:
            return f"{module}:{obj.__qualname__}"
    raise UsageError(
        "probe_loader needs a factory it can import in a fresh process: a module-level function "
        "returning the DataLoader, given as the function itself or as 'package.module:function'"
    )


def _is_object(target: Any) -> bool:
    """A DataLoader or Dataset object (probed in a fork of this process), not a factory or TARGET."""
    if isinstance(target, str) or (
        callable(target) and not hasattr(target, "__getitem__") and not hasattr(target, "__iter__")
    ):
        return False
    return True


def _precheck(spec_target: str) -> None:
    """TARGET typos fail here at once, without starting a child (the child checks again)."""
    import sys

    from .target import TargetNotFound, file_problem, is_path, parse, top_level_exists

    try:
        module, _ = parse(spec_target)
    except TargetNotFound as exc:
        raise UsageError(str(exc)) from None
    found = True
    if not is_path(module):
        sys.path.insert(0, os.getcwd())
        try:
            found = top_level_exists(module)
        finally:
            sys.path.pop(0)
    problem = file_problem(module, importable=found)
    if problem:
        raise UsageError(problem)
    if not found:
        raise UsageError(
            f"no module named {module.split('.')[0]!r} (TARGET module {module!r}); run from the "
            "directory that contains it or set PYTHONPATH"
        )


def _limits(facts: Facts) -> dict[str, Any]:
    return {"max_map_count": facts.limits.sysctl.vm.max_map_count, "shm_free": facts.shm.free_bytes}


def probe_loader(
    target: Any,
    options: ProbeOptions | None = None,
    facts: Facts | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> LoaderReport:
    """Probe a DataLoader: ``target`` is ``"pkg.mod:fn"``, ``"path/file.py:fn"``, the factory function itself
    (run in a fresh interpreter), or a DataLoader/Dataset object (probed in a fork of this process, so the
    start method is this process's own unless ``parent_start_method`` says otherwise; Linux only)."""
    from ..facts import gather
    from .isolate import run_child
    from .judge import judge, loader_section

    opts = options or ProbeOptions()
    obj = target if _is_object(target) else None
    if obj is not None:
        spec_target = f"<{type(obj).__module__}.{type(obj).__qualname__} object>"
    else:
        spec_target = target_of(target)
        _precheck(spec_target)
    facts = facts if facts is not None else gather()
    timeout = opts.timeout or (DEFAULT_TUNE_TIMEOUT if opts.tune else DEFAULT_TIMEOUT)
    cores = facts.cpu.usable_cores or os.cpu_count() or 1
    spec = {
        "target": spec_target,
        "overrides": opts.overrides(),
        "parent_start_method": opts.parent_start_method,
        "sharing_strategy": opts.sharing_strategy,
        "static_only": opts.static,
        "force_live": opts.force_live,
        "batches": opts.batches,
        "tune": opts.tune,
        "max_workers": opts.max_workers or max(8, 4 * int(cores)),
        "tune_seconds": opts.tune_seconds,
        "tune_budget": opts.tune_budget,
        "limits": _limits(facts),
    }
    out = run_child(spec, timeout, opts.memory_cap, on_event, obj=obj)
    usage = out.last("usage")
    if usage is not None:
        raise UsageError(usage["message"])
    section = loader_section(out, spec_target, timeout, opts.memory_cap)
    data = dict(facts.to_json())
    data["loader"] = section
    judged = Facts(data)
    return LoaderReport(spec_target, judge(judged), judged, section)


__all__ = ["LoaderReport", "ProbeOptions", "probe_loader"]
