"""The determinism audit: what in this process makes two runs (or two ranks) compute different numbers.

    from torchdoctor.ranks.determinism import NondeterminismRecorder, determinism_report

    with NondeterminismRecorder() as rec:          # optional: which non-deterministic ops really ran
        train_one_epoch(model, loader)
    report = determinism_report(loader=loader, epoch=0, nondeterministic_warnings=rec)
    print(report.render())                         # TD470-TD476 with the values read and the fix

Three steps, kept apart so the judgement is testable without torch:

* :func:`determinism_facts` reads torch's state and the DataLoader into a JSON-serialisable dict. It
  never changes anything and never initialises CUDA (CUDA counts as "in play" when torch was built
  with it: the audit usually runs before the model is moved).
* :func:`determinism_rules` is a pure function of that dict: one :class:`DeterminismFinding` per
  problem, worded from the catalogue (``catalogue/determinism.py``).
* :class:`NondeterminismRecorder` collects torch's own warnings ``<op> does not have a deterministic
  implementation, but you set 'torch.use_deterministic_algorithms(True, warn_only=True)'``.

What is read, and the limits of each fact:

* **seed**: ``torch.initial_seed()``. Unseeded, torch seeds itself at import with 64 random bits; a seed
  below 2**32 counts as set (heuristic, wrong once in 4 billion runs, and for large seeds chosen on
  purpose: pass ``seed=`` to say which seed the script set). Call the audit in the main process: in a
  DataLoader worker the seed is the worker's (large) one.
* **deterministic algorithms**, **cuDNN** ``benchmark``/``deterministic``, ``CUBLAS_WORKSPACE_CONFIG``,
  ``PYTHONHASHSEED``: read as they are; cuDNN and cuBLAS are judged only for CUDA builds of torch.
* **the DataLoader**: ``worker_init_fn``, ``generator``, a ``DistributedSampler``'s epoch against the
  ``epoch`` passed in, and random generators (NumPy ``Generator``/``RandomState``, ``random.Random``,
  ``torch.Generator``) held as attributes of the dataset or the datasets it wraps. A generator made
  later, inside a worker, cannot be seen here: record the run and ``torchdoctor runs diff`` it.
* **non-deterministic ops**: only those that ran in this process while a recorder listened with
  deterministic algorithms in warn-only mode; DataLoader workers are other processes.
"""

from __future__ import annotations

import os
import random
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..model import Severity
from ..registry import Code, Hit

#: A seed below this counts as chosen by someone; torch's own unseeded seed is a random 64-bit number.
SEEDED_BELOW = 2**32
#: The only values that make cuBLAS deterministic (torch checks for exactly these).
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")
#: torch's warning (C++ ``alertNotDeterministic`` and Python ``alert_not_deterministic``) in warn-only mode.
NONDETERMINISTIC_WARNING = re.compile(
    r"^(?P<op>.+?) does not have a deterministic implementation, but you set "
    r"'torch\.use_deterministic_algorithms\(True, warn_only=True\)'"
)
#: How deep the audit looks through dataset wrappers (Subset.dataset, ConcatDataset.datasets).
WRAPPER_DEPTH = 4
_RNG_KINDS = {
    ("numpy.random._generator", "Generator"): "numpy.random.Generator",
    ("numpy.random.mtrand", "RandomState"): "numpy.random.RandomState",
    ("torch", "Generator"): "torch.Generator",
    ("torch._C", "Generator"): "torch.Generator",
}


@dataclass(frozen=True)
class DeterminismFinding:
    """One problem, worded from its catalogue code; ``evidence`` says what was read, and where."""

    code: str
    name: str
    message: str
    fix: str
    evidence: str
    severity: Severity = Severity.WARNING

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "name": self.name,
            "severity": self.severity.label,
            "message": self.message,
            "fix": self.fix,
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class DeterminismReport:
    """The audit: findings (worst first) and the facts they were judged from."""

    findings: tuple[DeterminismFinding, ...]
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No finding at warning or above (info findings are remarks)."""
        return not any(f.severity >= Severity.WARNING for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "findings": [f.to_dict() for f in self.findings], "facts": self.facts}

    def render(self) -> str:
        """Plain text, one block per finding and one line of what was read (for logs and terminals)."""
        marks = {Severity.ERROR: "✖", Severity.WARNING: "▲", Severity.INFO: "●"}
        lines = []
        for f in self.findings:
            lines.append(f"{marks[f.severity]} {f.code} {f.name}: {f.message}")
            lines.append(f"    fix: {f.fix}")
            lines.append(f"    read: {f.evidence}")
        lines.append(("determinism: no problem found; " if not self.findings else "read: ") + _summary(self.facts))
        return "\n".join(lines)


# -- facts ---------------------------------------------------------------------------------------------


def determinism_facts(*, loader: Any = None, epoch: int | None = None, seed: int | None = None) -> dict[str, Any]:
    """What decides reproducibility in this process, as JSON-serialisable data. Reads, never changes.

    ``seed``: the seed the script set, when it knows it (otherwise judged by :data:`SEEDED_BELOW`).
    ``epoch``: the epoch about to run, for the ``DistributedSampler`` check."""
    import torch

    cuda_built = bool(getattr(torch.version, "cuda", None) or getattr(torch.version, "hip", None))
    return {
        "torch": {
            "version": str(torch.__version__),
            "cuda_built": cuda_built,
            "cuda_initialized": bool(torch.cuda.is_initialized()) if cuda_built else False,
        },
        "seed": {"initial_seed": int(torch.initial_seed()), "given": seed},
        "deterministic_algorithms": {
            "enabled": bool(torch.are_deterministic_algorithms_enabled()),
            "warn_only": bool(torch.is_deterministic_algorithms_warn_only_enabled()),
        },
        "cudnn": {
            "benchmark": bool(torch.backends.cudnn.benchmark),
            "deterministic": bool(torch.backends.cudnn.deterministic),
        },
        "env": {name: os.environ.get(name) for name in ("CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED")},
        "epoch": epoch,
        "loader": None if loader is None else loader_facts(loader),
        "nondeterministic_ops": None,
    }


def planned_facts(environ: Mapping[str, str], *, cuda_built: bool | None) -> dict[str, Any]:
    """What ``torchdoctor check --determinism`` can know before the run: this environment's variables
    and whether the installed torch has CUDA, for a run that *will* turn deterministic algorithms on
    (that is what asking for the audit means). The seed, the flags and the loader exist only in the
    training process: :func:`determinism_report` reads those there."""
    return {
        "torch": {"cuda_built": cuda_built},
        "deterministic_algorithms": {"enabled": True, "warn_only": False},
        "env": {name: environ.get(name) for name in ("CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED")},
    }


def loader_facts(loader: Any) -> dict[str, Any]:
    """A DataLoader's seeding: workers, ``worker_init_fn``, ``generator``, sampler epoch, dataset generators."""
    init = getattr(loader, "worker_init_fn", None)
    gen = getattr(loader, "generator", None)
    return {
        "type": _qualname(loader),
        "num_workers": int(getattr(loader, "num_workers", 0) or 0),
        "worker_init_fn": None if init is None else _describe_init(init),
        "generator_seed": int(gen.initial_seed()) if gen is not None and hasattr(gen, "initial_seed") else None,
        "sampler": _sampler(loader),
        "dataset_rngs": _dataset_rngs(getattr(loader, "dataset", None)),
    }


def _qualname(obj: Any) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def _describe_init(init: Any) -> dict[str, Any]:
    """Whether a ``worker_init_fn`` may reseed the dataset's own generators: torchdoctor's reseeds only
    the global ones (``random``, NumPy, torch), unless functions were chained with ``.then``."""
    after = getattr(init, "after", None)
    ours = type(init).__module__ == "torchdoctor.guards.workers" and type(init).__name__ == "WorkerInit"
    return {
        "name": getattr(init, "__qualname__", None) or _qualname(init),
        "globals_only": bool(ours and not after),
    }


def _sampler(loader: Any) -> dict[str, Any] | None:
    """The loader's epoch-aware sampler (``DistributedSampler`` or anything with ``set_epoch``/``epoch``)."""
    for s in (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        if s is not None and callable(getattr(s, "set_epoch", None)) and isinstance(getattr(s, "epoch", None), int):
            shuffle = getattr(s, "shuffle", None)
            return {
                "type": type(s).__name__,
                "epoch": int(s.epoch),
                "shuffle": None if shuffle is None else bool(shuffle),
                "seed": getattr(s, "seed", None),
            }
    return None


def _rng_kind(value: Any) -> str | None:
    if isinstance(value, random.Random):
        return "random.Random"
    t = type(value)
    return _RNG_KINDS.get((t.__module__, t.__name__))


def _dataset_rngs(dataset: Any, where: str = "", depth: int = 0) -> list[dict[str, Any]]:
    """Random generators held as attributes of ``dataset`` and of the datasets it wraps."""
    if dataset is None or depth > WRAPPER_DEPTH:
        return []
    try:
        attrs = dict(vars(dataset))
    except TypeError:  # no __dict__ (slots, builtins)
        return []
    found: list[dict[str, Any]] = []
    for name, value in attrs.items():
        path = f"{where}.{name}" if where else name
        kind = _rng_kind(value)
        if kind:
            found.append({"where": path, "attr": name, "kind": kind})
        elif name == "dataset":
            found += _dataset_rngs(value, path, depth + 1)
        elif name == "datasets" and isinstance(value, (list, tuple)):
            for i, sub in enumerate(value):
                found += _dataset_rngs(sub, f"{path}[{i}]", depth + 1)
    return found


# -- rules (pure) --------------------------------------------------------------------------------------


_Rule = tuple[str, dict[str, Any], str, "Severity | None"]
"""What a rule found: code, template values, evidence, severity (None: the code's own)."""


def determinism_rules(state: Mapping[str, Any]) -> tuple[DeterminismFinding, ...]:
    """The findings a facts dict (from :func:`determinism_facts`, or recorded) calls for; worst first.

    Pure: no torch, no I/O. Missing keys count as unknown and say nothing."""
    from ..catalogue import determinism as cat

    codes: dict[str, Code] = {
        c.code: c for c in (cat.TD470, cat.TD471, cat.TD472, cat.TD473, cat.TD474, cat.TD475, cat.TD476)
    }
    hits = [*_seed_rules(state), *_worker_rng_rules(state.get("loader")), *_torch_rules(state), *_sampler_rules(state)]
    hits += _op_rules(state.get("nondeterministic_ops"))
    out = []
    for code, values, evidence, severity in hits:
        f = codes[code].finding(Hit(values=values, severity=severity))
        out.append(DeterminismFinding(f.code, f.name, f.message, f.fix, evidence, f.severity))
    return tuple(sorted(out, key=lambda f: (-int(f.severity), f.code)))


def seed_is_set(seed: Mapping[str, Any]) -> bool | None:
    """Whether torch was seeded: by the seed the caller declared, else by :data:`SEEDED_BELOW`."""
    initial = seed.get("initial_seed")
    if initial is None:
        return None
    given = seed.get("given")
    return int(initial) == int(given) if given is not None else int(initial) < SEEDED_BELOW


def _seed_rules(state: Mapping[str, Any]) -> list[_Rule]:
    out: list[_Rule] = []
    seed = state.get("seed") or {}
    if seed_is_set(seed) is False:
        given = seed.get("given")
        value = f"torch.initial_seed() = {seed['initial_seed']}"
        value += f", not the declared seed {given}" if given is not None else ""
        effect = "parameter initialisation, shuffling and the DataLoader workers' seeds change with every run"
        why = "" if given is not None else " (a seed below 2**32 counts as set)"
        out.append(("TD470", {"what": "torch's random generator", "value": value, "effect": effect}, value + why, None))
    env = state.get("env") or {}
    if "PYTHONHASHSEED" in env and env["PYTHONHASHSEED"] in (None, "", "random"):
        shown = "PYTHONHASHSEED " + ("unset" if env["PYTHONHASHSEED"] is None else repr(env["PYTHONHASHSEED"]))
        effect = "the iteration order of sets (and of dicts built from them) of strings differs between runs, ranks "
        effect += "and spawned workers"
        values = {"what": "Python's string hashing", "value": shown, "effect": effect}
        out.append(("TD470", values, f"{shown} (environment)", Severity.INFO))
    return out


def _worker_rng_rules(loader: Mapping[str, Any] | None) -> list[_Rule]:
    if not loader or not loader.get("num_workers"):
        return []
    init, workers = loader.get("worker_init_fn"), loader["num_workers"]
    if init is None:
        how, severity = " (no worker_init_fn reseeds it)", None
    elif init.get("globals_only"):
        how, severity = " (torchdoctor.worker_init_fn reseeds only random, NumPy's and torch's globals)", None
    else:
        how, severity = f" unless worker_init_fn {init.get('name')} reseeds it", Severity.INFO
    effect = "the workers draw the same random numbers, and unless it was made from a seed, others in every run"
    out: list[_Rule] = []
    for rng in loader.get("dataset_rngs") or []:
        values = {"where": f"`{rng['where']}`", "attr": rng["attr"], "kind": rng["kind"], "workers": workers}
        evidence = f"dataset.{rng['where']}: {rng['kind']}; num_workers={workers}; "
        evidence += f"worker_init_fn={init.get('name') if init else None}"
        out.append(("TD471", {**values, "how": how, "effect": effect}, evidence, severity))
    return out


def _torch_rules(state: Mapping[str, Any]) -> list[_Rule]:
    """Deterministic algorithms (TD472), cuDNN benchmark (TD473), cuBLAS workspace (TD474)."""
    out: list[_Rule] = []
    cuda = bool((state.get("torch") or {}).get("cuda_built"))
    algos = state.get("deterministic_algorithms") or {}
    if algos.get("enabled") is False:
        effect = (
            "operations with a non-deterministic kernel (atomic adds on CUDA, cuDNN's choice of algorithm) may "
            "compute different last bits from the same inputs"
            if cuda
            else "on the CPU few kernels are non-deterministic (put_, MaxUnpool), but the same script on a GPU would "
            "not reproduce"
        )
        values = {"cuda": " and this torch uses CUDA" if cuda else "", "effect": effect}
        evidence = "torch.are_deterministic_algorithms_enabled() = False"
        out.append(("TD472", values, evidence, Severity.WARNING if cuda else Severity.INFO))
    cudnn = state.get("cudnn") or {}
    if cuda and cudnn.get("benchmark"):
        evidence = f"torch.backends.cudnn.benchmark = True, .deterministic = {cudnn.get('deterministic')}"
        out.append(("TD473", {"deterministic": cudnn.get("deterministic")}, evidence, None))
    cublas = (state.get("env") or {}).get("CUBLAS_WORKSPACE_CONFIG")
    if cuda and algos.get("enabled") and cublas not in CUBLAS_DETERMINISTIC:
        shown = "unset" if cublas is None else repr(cublas)
        evidence = f"CUBLAS_WORKSPACE_CONFIG {shown} (environment); deterministic algorithms on"
        out.append(("TD474", {"value": shown}, evidence + (" (warn_only)" if algos.get("warn_only") else ""), None))
    return out


def _sampler_rules(state: Mapping[str, Any]) -> list[_Rule]:
    sampler = (state.get("loader") or {}).get("sampler")
    epoch = state.get("epoch")
    if not sampler or epoch is None or sampler.get("shuffle") is False or sampler.get("epoch") == epoch:
        return []
    values = {"sampler": sampler.get("type"), "sampler_epoch": sampler.get("epoch"), "epoch": epoch}
    evidence = f"{sampler.get('type')}.epoch = {sampler.get('epoch')}, shuffle = {sampler.get('shuffle')}; "
    return [("TD475", values, evidence + f"epoch {epoch} (passed to the audit)", None)]


def _op_rules(ops: Iterable[Mapping[str, Any]] | None) -> list[_Rule]:
    ops = list(ops or [])
    if not ops:
        return []
    shown = ", ".join(f"{o['op']} ×{o.get('count', 1)}" for o in ops)
    where = "; ".join(f"{o['op']} first at {o['where']}" for o in ops if o.get("where"))
    evidence = "torch's warnings under use_deterministic_algorithms(True, warn_only=True)"
    return [("TD476", {"count": len(ops), "ops": shown}, evidence + (f": {where}" if where else ""), None)]


def _summary(state: Mapping[str, Any]) -> str:
    seed = state.get("seed") or {}
    algos = state.get("deterministic_algorithms") or {}
    cudnn = state.get("cudnn") or {}
    env = state.get("env") or {}
    parts = [
        f"seed {seed.get('initial_seed')} ({'set' if seed_is_set(seed) else 'not set'})",
        "deterministic algorithms "
        + ("on" + (" (warn_only)" if algos.get("warn_only") else "") if algos.get("enabled") else "off"),
        f"cudnn.benchmark {cudnn.get('benchmark')}, cudnn.deterministic {cudnn.get('deterministic')}",
        f"CUBLAS_WORKSPACE_CONFIG {env.get('CUBLAS_WORKSPACE_CONFIG') or 'unset'}",
        f"PYTHONHASHSEED {env.get('PYTHONHASHSEED') or 'unset'}",
    ]
    if not (state.get("torch") or {}).get("cuda_built"):
        parts.append("torch without CUDA")
    return "; ".join(parts)


# -- the report ----------------------------------------------------------------------------------------


def determinism_report(
    *,
    loader: Any = None,
    epoch: int | None = None,
    nondeterministic_warnings: Any = None,
    seed: int | None = None,
) -> DeterminismReport:
    """Read the facts, judge them. ``nondeterministic_warnings``: a :class:`NondeterminismRecorder`, or
    warnings caught with ``warnings.catch_warnings(record=True)``, or their messages as strings."""
    facts = determinism_facts(loader=loader, epoch=epoch, seed=seed)
    if nondeterministic_warnings is not None:
        facts["nondeterministic_ops"] = ops_from(nondeterministic_warnings)
    return DeterminismReport(determinism_rules(facts), facts)


def ops_from(source: Any) -> list[dict[str, Any]]:
    """``[{"op", "count", "where"}]`` from a recorder, ``warnings.WarningMessage`` objects or message strings."""
    if isinstance(source, NondeterminismRecorder):
        return source.to_list()
    rec = NondeterminismRecorder(enable=False, echo=False)
    for w in source:
        message = getattr(w, "message", w)
        where = f"{w.filename}:{w.lineno}" if hasattr(w, "filename") else ""
        rec.note(str(message), where)
    return rec.to_list()


class NondeterminismRecorder:
    """Records the non-deterministic operations that really run, from torch's own warnings.

    ``enable=True`` turns ``torch.use_deterministic_algorithms(True, warn_only=True)`` on while recording
    (and restores the previous setting at :meth:`stop`) when deterministic algorithms are off; with them
    on in strict mode such an operation raises instead, and nothing is recorded. Note that the mode also
    switches operations that have a deterministic variant to it, and makes ``torch.empty`` fill memory
    (``torch.utils.deterministic.fill_uninitialized_memory``): slower while it records.

    Every such warning is counted (``counts``, ``ops``); the first of each operation is passed on to
    the usual warning display when ``echo`` is True. Warnings in DataLoader worker processes are not seen.
    Not reentrant; the warning hook is process-wide, like ``warnings.catch_warnings``.
    """

    def __init__(self, *, enable: bool = True, echo: bool = True) -> None:
        self.enable = enable
        self.echo = echo
        self.counts: dict[str, int] = {}
        self.where: dict[str, str] = {}
        self._saved: tuple[Any, list[Any]] | None = None
        self._restore_mode: tuple[bool, bool] | None = None
        self._forward: Any = warnings.showwarning

    @property
    def ops(self) -> set[str]:
        """The names of the operations torch warned about (``put_``, ``max_unpooling2d_forward_out``...)."""
        return set(self.counts)

    def note(self, message: str, where: str = "") -> bool:
        """Count ``message`` if it is torch's non-determinism warning; True when it was."""
        m = NONDETERMINISTIC_WARNING.match(message)
        if not m:
            return False
        op = m.group("op")
        self.counts[op] = self.counts.get(op, 0) + 1
        if where:
            self.where.setdefault(op, where)
        return True

    def to_list(self) -> list[dict[str, Any]]:
        return [{"op": op, "count": n, "where": self.where.get(op, "")} for op, n in self.counts.items()]

    def start(self) -> NondeterminismRecorder:
        if self._saved is not None:
            raise RuntimeError("NondeterminismRecorder.start() called twice; stop() it first")
        import torch

        if self.enable and not torch.are_deterministic_algorithms_enabled():
            self._restore_mode = (False, bool(torch.is_deterministic_algorithms_warn_only_enabled()))
            torch.use_deterministic_algorithms(True, warn_only=True)
        self._saved = (warnings.showwarning, list(warnings.filters))
        self._forward = warnings.showwarning
        warnings.filterwarnings(
            "always", message=r".* does not have a deterministic implementation", category=UserWarning
        )
        warnings.showwarning = self._show
        return self

    def stop(self) -> None:
        if self._saved is None:
            return
        show, filters = self._saved
        warnings.showwarning = show
        warnings.filters = filters  # what catch_warnings does on exit
        warnings._filters_mutated()  # type: ignore[attr-defined]
        self._saved = None
        if self._restore_mode is not None:
            import torch

            torch.use_deterministic_algorithms(self._restore_mode[0], warn_only=self._restore_mode[1])
            self._restore_mode = None

    def _show(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any = None,
        line: Any = None,
    ) -> None:
        known = len(self.counts)
        if self.note(str(message), f"{filename}:{lineno}"):
            first_of_op = len(self.counts) > known
            if not (self.echo and first_of_op):
                return
        self._forward(message, category, filename, lineno, file, line)

    def __enter__(self) -> NondeterminismRecorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
