"""Find the num_workers (and prefetch_factor) with the best throughput, adaptively (probe child).

Each setting is measured by :func:`~.rate.measure_rate`, the same function the live run uses: samples/s
over a steady window of ``seconds`` (worker start-up, the first batch, the batches prefetched while it
was awaited and epoch restarts are kept out of it). One run gives its rate and the rates of consecutive
parts of its window.

The search (:func:`search`, pure, driven by any ``measure(workers) -> run``) doubles the worker
count from 0 (0, 1, 2, 4, 8, …, up to ``max_workers``) while throughput keeps improving, stops after
two points in a row from 2 workers on that do not beat the best by ``tolerance``, then bisects the gap
between the best point and its better neighbour while that still improves by ``tolerance``.

On a busy machine one run can be a fluke (:class:`Tally`): a run is *steady* when its parts agree
within ``spread``; a setting is *settled* by a steady run or by two runs that agree, and is measured
again at once while it is not (and its best run is within ``REACH`` of the best setting). A run
slowed as a whole by another process is steady too, so where one run decides the search it needs a
second that agrees (*confirmed*): the setting the doubling stops on, and neighbours of the best that
dip below the curve (:meth:`Search.top`). All of it up to ``max_runs`` runs of a setting and while
the time ``budget`` lasts: the search stops on agreement, not after a fixed count. A setting's
throughput is the mean of its trusted runs near the highest (interference only slows a run down).

The choice is the fewest workers within ``choose_within`` of the best (workers cost memory and
start-up time). Then, at the chosen count, ``prefetch_factor`` 4 is tried against the default 2 the
same way, and ``persistent_workers`` is recommended when restarting workers each epoch costs a
noticeable share of the epoch.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from functools import partial
from statistics import fmean, median
from typing import Any, Generic, TypeVar

from .rate import measure_rate
from .target import rebuild

TOLERANCE = 0.05
CHOOSE_WITHIN = 0.02
REFINE_ROUNDS = 3
#: Readings within this share of each other agree.
SPREAD = 0.10
#: Runs of one setting at most.
MAX_RUNS = 4
#: A setting that is not settled is measured again while its best reading is within this share of the best.
REACH = 0.5
#: The best setting's grid neighbours whose best reading is within this share of it are confirmed by a second
#: run too.
CONFIRM_REACH = 0.35
#: Default time budget for the whole search, in multiples of the measuring time per setting.
BUDGET_FACTOR = 30
#: persistent_workers pays off when a restart costs more than this share of an epoch.
PERSISTENT_SHARE = 0.10
#: prefetch_factor tried against the default.
PREFETCH = 4

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Run:
    """One run of a setting: its samples/s over the whole window, and over each part of it."""

    rate: float
    parts: tuple[float, ...] = ()

    def steady(self, spread: float) -> bool:
        """Its parts agree: nothing slowed part of the window (a run slowed as a whole still looks steady)."""
        return (
            len(self.parts) >= 2
            and max(self.parts) > 0
            and (max(self.parts) - min(self.parts)) / max(self.parts) <= spread
        )


Readings = float | Sequence[float] | Run


def as_run(readings: Readings) -> Run:
    """A float is a run without parts; a sequence, the parts of a run (its rate their mean)."""
    if isinstance(readings, Run):
        return readings
    if isinstance(readings, (int, float)):
        return Run(float(readings))
    parts = tuple(float(v) for v in readings)
    return Run(fmean(parts) if parts else 0.0, parts)


class Tally(Generic[K]):
    """The runs of each setting, and what they agree on.

    A run is *steady* when its parts agree within ``spread``; two runs *agree* when their rates do.
    The *trusted* rates of a setting are those of steady runs and of runs that agree with another;
    another process only slows a run down, so the setting's throughput is the mean of the trusted
    rates within ``spread`` of the highest one. Part rates are not averaged into it: the main process
    losing the CPU for a moment makes one part slow and the next fast (the workers fill the buffer
    meanwhile), while the whole window evens that out."""

    def __init__(self, spread: float = SPREAD) -> None:
        self.spread = spread
        self.runs: dict[K, list[Run]] = {}

    def add(self, key: K, readings: Readings) -> None:
        self.runs.setdefault(key, []).append(as_run(readings))

    def keys(self) -> list[K]:
        return list(self.runs)

    def readings(self, key: K) -> list[float]:
        """The rate of each run."""
        return [r.rate for r in self.runs.get(key, [])]

    def count(self, key: K) -> int:
        return len(self.runs.get(key, []))

    def _trusted(self, key: K) -> list[int]:
        runs = self.runs.get(key, [])
        out = []
        for i, r in enumerate(runs):
            paired = any(
                j != i and abs(r.rate - o.rate) <= self.spread * max(r.rate, o.rate) for j, o in enumerate(runs)
            )
            if paired or r.steady(self.spread):
                out.append(i)
        return out

    def _top(self, key: K) -> list[int]:
        """The trusted runs within ``spread`` of the highest trusted rate."""
        runs, trusted = self.runs.get(key, []), self._trusted(key)
        if not trusted:
            return []
        high = max(runs[i].rate for i in trusted)
        return [i for i in trusted if runs[i].rate >= high * (1 - self.spread)]

    def settled(self, key: K) -> bool:
        """A steady run, or two runs that agree."""
        return bool(self._trusted(key))

    def confirmed(self, key: K) -> bool:
        """Two runs agree at the top: a run slowed as a whole (steady, but slow) is not trusted alone."""
        return len(self._top(key)) >= 2

    def value(self, key: K) -> float:
        top = self._top(key)
        if top:
            return fmean(self.runs[key][i].rate for i in top)
        return median(self.readings(key))

    def interval(self, key: K) -> tuple[float, float]:
        runs = self.runs.get(key, [])
        top = self._top(key)
        values = [v for i in top for v in (runs[i].parts or (runs[i].rate,))] if top else self.readings(key)
        return min(values), max(values)

    def spread_of(self, key: K) -> float:
        """Relative spread of every reading (run rates and parts): (max - min) / max."""
        values = [v for r in self.runs.get(key, []) for v in (r.rate, *r.parts)]
        top = max(values)
        return (top - min(values)) / top if top > 0 else 0.0


@dataclass
class Search:
    tally: Tally[int] = field(default_factory=Tally)
    """The runs of each num_workers."""
    order: list[int] = field(default_factory=list)
    """num_workers of each run, in the order measured (a repeated setting appears again)."""
    chosen: int | None = None
    repeats: int = 0
    out_of_budget: bool = False

    @property
    def points(self) -> list[tuple[int, float]]:
        """(num_workers, samples/s of that run) in the order measured."""
        seen: dict[int, int] = {}
        out = []
        for w in self.order:
            i = seen.get(w, 0)
            seen[w] = i + 1
            out.append((w, self.tally.runs[w][i].rate))
        return out

    def best(self) -> tuple[int, float]:
        return max(((w, self.tally.value(w)) for w in self.tally.keys()), key=lambda p: p[1])

    def measured(self) -> dict[int, float]:
        return {w: self.tally.value(w) for w in self.tally.keys()}

    def top(self, reach: float = CONFIRM_REACH) -> list[int]:
        """The best setting's neighbours on the measured grid (where the choice and the bisection are
        decided) that look slowed: below the straight line from the best to the next point beyond them
        (below the best, for a neighbour with nothing beyond) by more than ``spread``, but with a best
        reading within ``reach`` of the best. Throughput curves rise and then flatten or fall, so such a
        dip is more likely a run slowed as a whole by another process (its parts agree) than the loader:
        a second run shows which. (The best itself needs none: another process only slows a run down.)"""
        t = self.tally
        grid, (b, best) = sorted(t.keys()), self.best()
        i = grid.index(b)
        out = []
        for j, k in ((i - 1, i - 2), (i + 1, i + 2)):
            if not 0 <= j < len(grid) or max(t.readings(grid[j])) < best * (1 - reach):
                continue
            n = grid[j]
            expected = best
            if 0 <= k < len(grid):  # on the line from the point beyond to the best
                m = grid[k]
                expected = t.value(m) + (best - t.value(m)) * (n - m) / (b - m)
            if t.value(n) < expected * (1 - t.spread):
                out.append(n)
        return out

    def settled(self) -> bool:
        """Every setting that could matter agrees with itself, and the top ones across two runs."""
        best = self.best()[1]
        near = [w for w in self.tally.keys() if max(self.tally.readings(w)) >= best * (1 - REACH)]
        return all(self.tally.settled(w) for w in near) and all(self.tally.confirmed(w) for w in self.top())


def doubling(max_workers: int) -> list[int]:
    out, w = [0, 1], 2
    while w < max_workers:
        out.append(w)
        w *= 2
    if max_workers not in out:
        out.append(max_workers)
    return [x for x in out if x <= max_workers]


def settle(
    tally: Tally[K], measure: Callable[[K], Readings], wanted: Callable[[], list[K]], in_budget: Callable[[], bool]
) -> int:
    """Measure again, one run at a time, the most promising of ``wanted()`` (settings whose readings
    do not agree yet), until none is left or the budget is spent. Returns the number of runs made."""
    made = 0
    while in_budget():
        pending = wanted()
        if not pending:
            break
        k = max(pending, key=lambda x: max(tally.readings(x)))
        tally.add(k, measure(k))
        made += 1
    return made


def search(
    measure: Callable[[int], Readings],
    max_workers: int,
    tolerance: float = TOLERANCE,
    choose_within: float = CHOOSE_WITHIN,
    spread: float = SPREAD,
    max_runs: int = MAX_RUNS,
    budget: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Search:
    """The adaptive search over num_workers; ``measure(w)`` makes one run: a :class:`Run`, the rates of its
    parts (samples/s), or a single rate."""
    s = Search(tally=Tally(spread))
    t = s.tally
    started = clock()

    def in_budget() -> bool:
        ok = budget is None or clock() - started < budget
        s.out_of_budget |= not ok
        return ok

    def run(w: int) -> Run:
        s.order.append(w)
        return as_run(measure(w))

    def open_(keys: list[int], confirm: list[int]) -> list[int]:
        """Of ``keys``, those to measure again: readings that disagree (within REACH of the best), or one
        of ``confirm`` trusted on a single run."""
        best = s.best()[1]
        return [
            w
            for w in keys
            if t.count(w) < max_runs
            and max(t.readings(w)) >= best * (1 - REACH)
            and (not t.settled(w) or (w in confirm and not t.confirmed(w)))
        ]

    def take(w: int) -> float:
        t.add(w, run(w))
        s.repeats += settle(t, run, lambda: open_([w], []), in_budget)
        return t.value(w)

    def confirm_top() -> None:
        s.repeats += settle(t, run, lambda: open_(t.keys(), s.top()), in_budget)

    def flat_tail(seq: list[int]) -> list[int]:
        """The settings at the end of the doubling that did not beat the best before them by ``tolerance``."""
        flat: list[int] = []
        best = 0.0
        for w in seq:
            value = t.value(w)
            if w >= 2:  # one worker is often slower than none (no overlap, IPC added): not a reason to stop
                flat = [] if value > best * (1 + tolerance) else flat + [w]
            best = max(best, value)
        return flat

    seq: list[int] = []
    for w in doubling(max_workers):
        take(w)
        seq.append(w)
        if len(flat_tail(seq)) >= 2:
            # before giving up on more workers, a second run of the setting that stops the search and of
            # any before it that fell well below the best (a run slowed as a whole by another process
            # agrees with itself)
            best = s.best()[1]
            doubt = [x for x in flat_tail(seq)[-2:-1] if t.value(x) < best * (1 - spread)] + [w]
            s.repeats += settle(t, run, partial(open_, doubt, doubt), in_budget)
            if len(flat_tail(seq)) >= 2:
                break
    confirm_top()
    for _ in range(REFINE_ROUNDS):
        measured = s.measured()
        grid, (b, before) = sorted(measured), s.best()
        i = grid.index(b)
        sides = [(grid[j], measured[grid[j]]) for j in (i - 1, i + 1) if 0 <= j < len(grid)]
        sides = [(w, v) for w, v in sides if abs(w - b) > 1]
        if not sides:
            break
        toward = max(sides, key=lambda p: (p[1], p[0]))[0]  # bisect toward the better neighbour
        take((b + toward) // 2)
        confirm_top()
        if s.best()[1] <= before * (1 + tolerance):
            break
    top = s.best()[1]
    s.chosen = min(w for w in t.keys() if t.value(w) >= top * (1 - choose_within))
    return s


def measure_point(
    loader: Any, workers: int, seconds: float, prefetch: int | None = None, persistent: bool | None = None
) -> dict[str, Any]:
    """One run of ``loader`` rebuilt with ``workers`` (and ``prefetch``; ``persistent``, None: the
    loader's own), by :func:`~.rate.measure_rate`; ``startup_s`` is the time to the first batch."""
    changes: dict[str, Any] = {"num_workers": workers}
    if workers > 0:
        changes["prefetch_factor"] = prefetch
        if persistent is not None:
            changes["persistent_workers"] = persistent
    else:
        changes["multiprocessing_context"] = None
    with warnings.catch_warnings():  # torch's "suggested max number of worker" warning, once per setting
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        candidate = rebuild(loader, **changes)
        rate = measure_rate(candidate, seconds, hint=getattr(loader, "batch_size", None))
    if rate.samples_per_s is None:
        raise RuntimeError(f"the loader yielded no batch with num_workers={workers}")
    return {
        "num_workers": workers,
        "prefetch_factor": candidate.prefetch_factor,
        "samples_per_s": rate.samples_per_s,
        "parts": rate.parts,
        "startup_s": round(rate.first_batch_seconds or 0.0, 4),
        "seconds": round(rate.window_seconds, 3),
        "wall_seconds": round(rate.wall_seconds, 3),
        "samples": rate.window_samples,
        "epoch_restarts": rate.epochs,
        "restart_s": rate.restart_seconds,
        "steady": rate.steady,
        **({"shutdown_error": rate.shutdown_error} if rate.shutdown_error else {}),
    }


def tune(
    loader: Any,
    max_workers: int,
    seconds: float,
    emit: Callable[[str, dict[str, Any]], None],
    budget: float | None = None,
    max_runs: int = MAX_RUNS,
) -> dict[str, Any]:
    """Search num_workers, then prefetch_factor, then judge persistent_workers; ``budget`` (seconds,
    default ``BUDGET_FACTOR × seconds``) bounds the repeats (the first run of each setting is always made)."""
    started = time.perf_counter()
    budget = BUDGET_FACTOR * seconds if budget is None else budget
    rows: list[dict[str, Any]] = []

    def measure_at(w: int, prefetch: int | None = None) -> Run:
        emit("tune-start", {"num_workers": w, **({"prefetch_factor": prefetch} if prefetch else {})})
        row = measure_point(loader, w, seconds, prefetch=prefetch)
        row["step"] = len(rows) + 1
        rows.append(row)
        emit("tune-point", row)
        return Run(float(row["samples_per_s"]), tuple(row["parts"]))

    def in_budget() -> bool:
        return time.perf_counter() - started < budget

    s = search(measure_at, max_workers, max_runs=max_runs, budget=budget, clock=time.perf_counter)
    chosen = s.chosen if s.chosen is not None else 0
    default_pf = next((r["prefetch_factor"] for r in rows if r["num_workers"] == chosen), None)
    tally: Tally[tuple[int, int | None]] = Tally()
    for w in s.tally.keys():
        for run in s.tally.runs[w]:
            tally.add((w, next(r["prefetch_factor"] for r in rows if r["num_workers"] == w)), run)
    key = (chosen, default_pf)
    result: dict[str, Any] = {
        "chosen": {"num_workers": chosen, "prefetch_factor": default_pf, "persistent_workers": False}
    }
    repeats = s.repeats
    if chosen > 0:
        alt = (chosen, PREFETCH)
        tally.add(alt, measure_at(chosen, PREFETCH))

        def open_pf() -> list[tuple[int, int | None]]:
            """Readings that disagree; and when prefetch 4 looks faster, both trusted on one run only."""
            faster = tally.value(alt) > tally.value(key) * (1 + TOLERANCE)
            return [
                k
                for k in (key, alt)
                if tally.count(k) < max_runs and (not tally.settled(k) or (faster and not tally.confirmed(k)))
            ]

        repeats += settle(tally, lambda k: measure_at(k[0], k[1]), open_pf, in_budget)
        if tally.value(alt) > tally.value(key) * (1 + TOLERANCE):
            key = alt
        result["chosen"]["prefetch_factor"] = key[1]
        runs = [r for r in rows if (r["num_workers"], r["prefetch_factor"]) == key]
        restart = median([r["startup_s"] for r in runs])
        try:
            epoch_s: float | None = len(loader.dataset) / max(tally.value(key), 1e-9)
        except TypeError:
            epoch_s = None
        result["epoch_seconds"] = round(epoch_s, 3) if epoch_s else None
        result["restart_seconds"] = round(restart, 4)
        result["chosen"]["persistent_workers"] = bool(epoch_s and restart > PERSISTENT_SHARE * epoch_s)
    result["chosen"]["samples_per_s"] = round(tally.value(key), 2)
    result["chosen"]["settled"] = tally.settled(key)
    settings: list[dict[str, Any]] = []
    for k in sorted(tally.keys(), key=lambda k: (k[0], k[1] or 0)):
        lo, hi = tally.interval(k)
        settings.append(
            {
                "num_workers": k[0],
                "prefetch_factor": k[1],
                "samples_per_s": round(tally.value(k), 2),
                "runs": tally.count(k),
                "settled": tally.settled(k),
                "spread": round(tally.spread_of(k), 3),
                "low": round(lo, 2),
                "high": round(hi, 2),
            }
        )
    result["points"] = rows
    result["settings"] = settings
    result["best_measured"] = max(float(x["samples_per_s"]) for x in settings)
    result["repeats"] = repeats
    result["settled"] = s.settled() and tally.settled(key)
    result["budget"] = round(budget, 2)
    result["seconds"] = round(time.perf_counter() - started, 2)
    result["max_workers"] = max_workers
    return result
