"""Where two recorded runs part: the first step, the rank, and what differed first (``torchdoctor runs diff``).

:func:`diff_runs` is pure: two :class:`~torchdoctor.ranks.runfile.Run` in, a :class:`RunDiff` out.
For each rank both runs recorded, the steps both recorded are compared in order; at the first step
where a field differs, the fields are read in the order they came about (see the record semantics in
:mod:`torchdoctor.ranks.fingerprint`)::

    batch (fixed before the step) -> loss, grad_norm, grads (during it) -> params (after the update) -> extra

and the parting is attributed to

* **start**: the initial parameters (``RunRecorder(..., model=model)``) differ; or, when they were not
  recorded, the very first step's loss differs with the same batch: initialisation and the first
  step's computation cannot be told apart then, and a different initialisation (no seed) is the likelier;
* **data**: the batch differs (everything after it may follow from it);
* **computation**: the same batch gave another loss, gradient or parameters;
* **unknown**: no batch was recorded, so data and computation cannot be told apart.

The overall parting is the earliest over ranks: by step, then by the order above (a rank whose loss
differs comes before one whose gradients differ only because an all-reduce carried the other's), then
by rank. Values are equal when ``|a - b| <= atol + rtol·|b|`` (``math.isclose``); both NaN counts as equal.
Default tolerances are 0: bit for bit, as a reproducible run must be.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from ..model import Evidence, Finding
from .runfile import Run, finite

SCHEMA_VERSION = 1
#: The fields of a step record in the order they come about during a step.
FIELD_ORDER = ("batch", "loss", "grad_norm", "grads", "params")
CAUSES = ("start", "data", "computation", "unknown")
#: Per-tensor names shown when ``per_tensor`` checksums differ.
SHOWN_TENSORS = 3

ADVICE = {
    "data": "the batches differ before anything is computed from them: reseed generators the dataset holds "
    "(`worker_init_fn=torchdoctor.worker_init_fn.then(reseed)`), give shuffling "
    "`generator=torch.Generator().manual_seed(SEED)`, sort file listings, call `sampler.set_epoch(epoch)` (TD475).",
    "start": "the parameters differ before the data could matter: seed before building the model and load the "
    "same checkpoint in both runs; record `RunRecorder(DIR, model=model)` to tell the initial parameters from the "
    "first step.",
    "computation": "the same batch gave other numbers: also `torch.backends.cudnn.benchmark = False` and "
    "`CUBLAS_WORKSPACE_CONFIG=:4096:8` on CUDA, the same thread count, ranks, torch and hardware in both runs; "
    "`NondeterminismRecorder` names the operations that have no deterministic implementation (TD476).",
    "unknown": "no batch was recorded, so data and computation cannot be told apart: pass `batch=` to "
    "`RunRecorder.record` and record both runs again.",
}


@dataclass(frozen=True)
class Difference:
    """One field that differs at the parting step: its value in run A and in run B."""

    field: str
    a: Any
    b: Any
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return finite({"field": self.field, "a": self.a, "b": self.b, "detail": self.detail})


@dataclass(frozen=True)
class RankDiff:
    """One rank: where its two runs part (``step`` None: they agree on every step compared)."""

    rank: int
    step: int | None
    cause: str | None
    differences: tuple[Difference, ...]
    compared: int
    only_a: int
    only_b: int

    @property
    def parted(self) -> bool:
        return self.cause is not None

    def order(self) -> tuple[int, int, int]:
        """Sort key of the earliest parting: step, the first differing field's place in a step, rank."""
        first = self.differences[0].field if self.differences else ""
        place = 0 if self.cause == "start" else _place(first)
        return (self.step if self.step is not None else -1, place, self.rank)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "step": self.step,
            "cause": self.cause,
            "differences": [d.to_dict() for d in self.differences],
            "steps_compared": self.compared,
            "steps_only_in_a": self.only_a,
            "steps_only_in_b": self.only_b,
        }


@dataclass(frozen=True)
class RunDiff:
    """Two runs compared rank by rank; ``first`` is where they part earliest (None: no difference)."""

    a: str
    b: str
    ranks: tuple[RankDiff, ...]
    rtol: float
    atol: float
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def first(self) -> RankDiff | None:
        parted = [r for r in self.ranks if r.parted]
        return min(parted, key=RankDiff.order) if parted else None

    @property
    def parted(self) -> bool:
        return self.first is not None

    @property
    def compared(self) -> int:
        return sum(r.compared for r in self.ranks)

    def finding(self) -> Finding | None:
        """TD477 with the fix for what parted first, or None when the runs agree."""
        first = self.first
        if first is None:
            return None
        from ..catalogue.log_ranks import TD477
        from ..registry import Hit

        fields = ", ".join(d.field for d in first.differences)
        evidence = tuple(
            Evidence(
                f"{d.field} at step {first.step}, rank {first.rank}", f"A {_short(d.a)} / B {_short(d.b)}", d.detail
            )
            for d in first.differences
        )
        values = {"step": first.step, "rank": first.rank, "cause": _CAUSE_WORDS[str(first.cause)], "fields": fields}
        return TD477.finding(Hit({**values, "advice": ADVICE[str(first.cause)]}, evidence))

    def to_dict(self) -> dict[str, Any]:
        first, finding = self.first, self.finding()
        return {
            "schema_version": SCHEMA_VERSION,
            "a": self.a,
            "b": self.b,
            "parted": self.parted,
            "first": None if first is None else first.to_dict(),
            "ranks": [r.to_dict() for r in self.ranks],
            "steps_compared": self.compared,
            "rtol": self.rtol,
            "atol": self.atol,
            "finding": None if finding is None else finding.to_dict(),
            "notes": list(self.notes),
        }


_CAUSE_WORDS = {
    "start": "start (the initial parameters)",
    "data": "data (the batch)",
    "computation": "computation (same batch, other results)",
    "unknown": "data or computation (no batch recorded)",
}


def _place(name: str) -> int:
    base = name.split(".")[0].split(" ")[0]
    return 1 + (FIELD_ORDER.index(base) if base in FIELD_ORDER else len(FIELD_ORDER))


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.10g}"
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- comparing ---------------------------------------------------------------------------------------------


def _close(a: Any, b: Any, rtol: float, atol: float) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return bool(a == b)
    if math.isnan(a) and math.isnan(b):
        return True
    return math.isclose(a, b, rel_tol=rtol, abs_tol=atol)


def _batch_diff(a: Any, b: Any, rtol: float, atol: float) -> Difference | None:
    """Batch fingerprints: floats within tolerance; ``path=value;...`` strings leaf by leaf (the first
    differing leaf is named, with its two values)."""
    if isinstance(a, str) and isinstance(b, str):
        pa, pb = a.split(";"), b.split(";")
        if len(pa) != len(pb):
            return Difference("batch", f"{len(pa)} leaves", f"{len(pb)} leaves", "the batches have other structures")
        for x, y in zip(pa, pb):
            kx, _, vx = x.rpartition("=")
            ky, _, vy = y.rpartition("=")
            if kx != ky:
                return Difference("batch", kx, ky, "the batches have other structures")
            if not _close(_number(vx), _number(vy), rtol, atol):
                return Difference("batch", _number(vx), _number(vy), f"batch{kx if kx.startswith('[') else '.' + kx}")
        return None
    return None if _close(a, b, rtol, atol) else Difference("batch", a, b)


def _number(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


def _summary_diff(name: str, a: Any, b: Any, rtol: float, atol: float) -> Difference | None:
    """A module summary (params/grads): n, sum, sumsq, wsum; per-tensor names when both recorded them."""
    if not isinstance(a, Mapping) or not isinstance(b, Mapping):
        return None if a == b else Difference(name, a, b)
    keys = ("n", "sum", "sumsq", "wsum")
    bad = [k for k in keys if not _close(a.get(k), b.get(k), rtol, atol)]
    ta, tb = a.get("tensors") or {}, b.get("tensors") or {}
    names = [n for n in ta if n in tb and not all(_close(x, y, rtol, atol) for x, y in zip(ta[n], tb[n]))]
    if not bad and not names:
        return None
    detail = ""
    if names:
        detail = f"first differing tensor(s): {', '.join(names[:SHOWN_TENSORS])}" + (
            f" and {len(names) - SHOWN_TENSORS} more" if len(names) > SHOWN_TENSORS else ""
        )
    key = bad[0] if bad else "sum"
    return Difference(name, a.get(key), b.get(key), detail or f"{name}.{key} differs")


def _step_differences(ra: Mapping[str, Any], rb: Mapping[str, Any], rtol: float, atol: float) -> list[Difference]:
    out: list[Difference] = []
    if "batch" in ra and "batch" in rb:
        d = _batch_diff(ra["batch"], rb["batch"], rtol, atol)
        if d is not None:
            out.append(d)
    for name in ("loss", "grad_norm"):
        if name in ra and name in rb and not _close(ra[name], rb[name], rtol, atol):
            out.append(Difference(name, ra[name], rb[name]))
    for name in ("grads", "params"):
        if name in ra and name in rb:
            d = _summary_diff(name, ra[name], rb[name], rtol, atol)
            if d is not None:
                out.append(d)
    ea, eb = ra.get("extra") or {}, rb.get("extra") or {}
    for name in ea:
        if name in eb and not _close(ea[name], eb[name], rtol, atol):
            out.append(Difference(f"extra.{name}", ea[name], eb[name]))
    return out


def _rank_diff(rank: int, a: Run, b: Run, rtol: float, atol: float) -> RankDiff:
    sa, sb = a.steps.get(rank, {}), b.steps.get(rank, {})
    common = sorted(set(sa) & set(sb))
    only_a, only_b = len(set(sa) - set(sb)), len(set(sb) - set(sa))
    ia, ib = a.meta.get(rank, {}).get("init"), b.meta.get(rank, {}).get("init")
    if ia is not None and ib is not None:
        d = _summary_diff("init", ia, ib, rtol, atol)
        if d is not None:
            return RankDiff(rank, common[0] if common else None, "start", (d,), len(common), only_a, only_b)
    first_of_both = bool(common) and common[0] == min(sa) and common[0] == min(sb)
    for n, step in enumerate(common):
        diffs = _step_differences(sa[step], sb[step], rtol, atol)
        if not diffs:
            continue
        has_batch = "batch" in sa[step] and "batch" in sb[step]
        if diffs[0].field == "batch":
            cause = "data"
        elif n == 0 and first_of_both and (ia is None or ib is None) and diffs[0].field in ("loss", "params"):
            cause = "start"  # other initial parameters change the first loss (or, without a loss, the params)
        elif has_batch:
            cause = "computation"
        else:
            cause = "unknown"
        return RankDiff(rank, step, cause, tuple(diffs), n + 1, only_a, only_b)
    return RankDiff(rank, None, None, (), len(common), only_a, only_b)


def _notes(a: Run, b: Run) -> list[str]:
    notes = [f"A: {n}" for n in a.notes] + [f"B: {n}" for n in b.notes]
    ra, rb = set(a.ranks), set(b.ranks)
    if ra - rb:
        notes.append(f"rank(s) {', '.join(map(str, sorted(ra - rb)))} recorded in A only: not compared")
    if rb - ra:
        notes.append(f"rank(s) {', '.join(map(str, sorted(rb - ra)))} recorded in B only: not compared")
    for key, what in (("torch", "torch version"), ("world_size", "world size"), ("seed", "seed")):
        va = {m.get(key) for m in a.meta.values()}
        vb = {m.get(key) for m in b.meta.values()}
        if va != vb:
            notes.append(f"the runs differ in {what}: A {sorted(map(str, va))}, B {sorted(map(str, vb))}")
    return notes


def diff_runs(a: Run, b: Run, *, rtol: float = 0.0, atol: float = 0.0) -> RunDiff:
    """Compare two runs rank by rank, step by step (pure). See the module's docs for the attribution."""
    if rtol < 0 or atol < 0:
        raise ValueError(f"rtol and atol must be >= 0; got rtol={rtol}, atol={atol}")
    ranks = tuple(_rank_diff(r, a, b, rtol, atol) for r in sorted(set(a.ranks) & set(b.ranks)))
    notes = _notes(a, b)
    if not ranks:
        notes.append("the runs have no rank in common: nothing was compared")
    for r in ranks:
        if not r.parted and (r.only_a or r.only_b):
            notes.append(
                f"rank {r.rank}: {r.only_a} step(s) only in A, {r.only_b} only in B (not compared: one run stopped "
                "earlier or recorded other steps)"
            )
    return RunDiff(a.path, b.path, ranks, rtol, atol, tuple(notes))


# -- rendering ---------------------------------------------------------------------------------------------


def render(diff: RunDiff, fmt: str, out: IO[str]) -> None:
    """``text`` (rich, as the other commands), ``json`` (:meth:`RunDiff.to_dict`) or ``markdown``."""
    if fmt == "json":
        json.dump(diff.to_dict(), out, indent=2)
        out.write("\n")
    elif fmt == "markdown":
        out.write(markdown(diff))
    else:
        text(diff, out)


def _verdict(diff: RunDiff) -> str:
    first = diff.first
    if first is None:
        return f"no difference in {diff.compared} step(s) compared over {len(diff.ranks)} rank(s)"
    return f"the runs part at step {first.step} on rank {first.rank}: {_CAUSE_WORDS[str(first.cause)]}"


def _rank_row(r: RankDiff) -> list[str]:
    if not r.parted:
        return [str(r.rank), str(r.compared), "-", "agree", "-"]
    return [str(r.rank), str(r.compared), str(r.step), str(r.cause), ", ".join(d.field for d in r.differences)]


def text(diff: RunDiff, out: IO[str]) -> None:
    from rich.table import Table
    from rich.text import Text

    from ..report.text import make_console

    console = make_console(out)
    head = Text()
    head.append("torchdoctor runs diff ", style="bold")
    head.append("PARTED" if diff.parted else "agree", style="bold red" if diff.parted else "bold green")
    head.append(f"  {_verdict(diff)}")
    console.print(head)
    console.print(Text(f"A {diff.a}\nB {diff.b}\ntolerance: rtol {diff.rtol:g}, atol {diff.atol:g}", style="dim"))
    table = Table(show_edge=False, header_style="bold")
    for name in ("rank", "steps compared", "parts at step", "cause", "what differs there"):
        table.add_column(name)
    for r in diff.ranks:
        table.add_row(*_rank_row(r), style="red" if r.parted else "")
    console.print(table)
    first, finding = diff.first, diff.finding()
    if first is not None and finding is not None:
        console.print()
        values = Table(show_edge=False, header_style="bold", title=f"step {first.step}, rank {first.rank}")
        for name in ("field", "A", "B", ""):
            values.add_column(name)
        for d in first.differences:
            values.add_row(d.field, _short(d.a), _short(d.b), d.detail)
        console.print(values)
        console.print(Text(f"✖ {finding.code} [{finding.family}] {finding.message}", style="bold"))
        console.print(Text(f"  fix: {finding.fix}"))
    for note in diff.notes:
        console.print(Text(note, style="dim"))


def markdown(diff: RunDiff) -> str:
    lines = [f"## torchdoctor runs diff: {'parted' if diff.parted else 'agree'}", "", _verdict(diff), ""]
    lines += [f"- A: `{diff.a}`", f"- B: `{diff.b}`", f"- tolerance: rtol {diff.rtol:g}, atol {diff.atol:g}", ""]
    lines += ["| rank | steps compared | parts at step | cause | what differs there |", "|---:|---:|---:|---|---|"]
    lines += ["| " + " | ".join(_rank_row(r)) + " |" for r in diff.ranks]
    first, finding = diff.first, diff.finding()
    if first is not None and finding is not None:
        lines += ["", f"Step {first.step}, rank {first.rank}:", "", "| field | A | B | |", "|---|---|---|---|"]
        lines += [f"| {d.field} | {_short(d.a)} | {_short(d.b)} | {d.detail} |" for d in first.differences]
        lines += ["", f"**{finding.code}** ({finding.family}): {finding.message}", "", f"Fix: {finding.fix}"]
    lines += [f"- {n}" for n in diff.notes]
    return "\n".join(lines) + "\n"
