"""Find the num_workers (and prefetch_factor) with the best throughput, adaptively (probe child).

The search (:func:`search`, pure, driven by any ``measure(workers) -> samples/s``) doubles the
worker count from 0 (0, 1, 2, 4, 8, …, up to ``max_workers``) while throughput keeps improving,
stops after two points in a row from 2 workers on that do not beat the best by ``tolerance``, then bisects the gap
between the best point and its better neighbour while that still improves by ``tolerance``. The choice is the fewest workers within ``choose_within`` of the best
measured throughput (workers cost memory and start-up time). Then, at the chosen count,
``prefetch_factor`` 4 is tried against the default 2, and ``persistent_workers`` is recommended
when restarting workers each epoch costs a noticeable share of the epoch.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .live import batch_len
from .target import rebuild

TOLERANCE = 0.05
CHOOSE_WITHIN = 0.02
REFINE_ROUNDS = 3
#: persistent_workers pays off when a restart costs more than this share of an epoch.
PERSISTENT_SHARE = 0.10


@dataclass
class Search:
    points: list[tuple[int, float]] = field(default_factory=list)
    """(num_workers, samples/s) in the order they were measured."""
    chosen: int | None = None

    def best(self) -> tuple[int, float]:
        return max(self.points, key=lambda p: p[1])

    def measured(self) -> dict[int, float]:
        return dict(self.points)


def doubling(max_workers: int) -> list[int]:
    out, w = [0, 1], 2
    while w < max_workers:
        out.append(w)
        w *= 2
    if max_workers not in out:
        out.append(max_workers)
    return [x for x in out if x <= max_workers]


def search(measure: Callable[[int], float], max_workers: int, tolerance: float = TOLERANCE,
           choose_within: float = CHOOSE_WITHIN) -> Search:
    s = Search()

    def take(w: int) -> float:
        value = measure(w)
        s.points.append((w, value))
        return value

    flat = 0
    for w in doubling(max_workers):
        best = s.best()[1] if s.points else 0.0
        value = take(w)
        if w >= 2:  # one worker is often slower than none (no overlap, IPC added): not a reason to stop
            flat = 0 if value > best * (1 + tolerance) else flat + 1
        if flat >= 2:
            break
    for _ in range(REFINE_ROUNDS):
        grid, (b, before) = sorted(s.measured()), s.best()
        i = grid.index(b)
        sides = [(grid[j], s.measured()[grid[j]]) for j in (i - 1, i + 1) if 0 <= j < len(grid)]
        sides = [(w, v) for w, v in sides if abs(w - b) > 1]
        if not sides:
            break
        toward = max(sides, key=lambda p: (p[1], p[0]))[0]  # bisect toward the better neighbour
        take((b + toward) // 2)
        if s.best()[1] <= before * (1 + tolerance):
            break
    top = s.best()[1]
    s.chosen = min(w for w, v in s.points if v >= top * (1 - choose_within))
    return s


def measure_point(loader: Any, workers: int, seconds: float, prefetch: int | None = None,
                  persistent: bool | None = None) -> dict[str, Any]:
    """Samples/s of ``loader`` rebuilt with ``workers`` over about ``seconds`` after the first batch."""
    changes: dict[str, Any] = {"num_workers": workers}
    if workers > 0:
        changes["prefetch_factor"] = prefetch
        if persistent is not None:
            changes["persistent_workers"] = persistent
    else:
        changes["multiprocessing_context"] = None
    with warnings.catch_warnings():  # torch's "suggested max number of worker" warning, once per setting
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        return _measure(rebuild(loader, **changes), workers, seconds)


def _measure(candidate: Any, workers: int, seconds: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    it = iter(candidate)
    first = next(it)
    startup = time.perf_counter() - t0
    samples = 0
    del first
    # Skip what the workers prefetched while we waited for the first batch: not steady state.
    for _ in range(workers * (candidate.prefetch_factor or 0)):
        try:
            next(it)
        except StopIteration:
            it = iter(candidate)
    t1 = time.perf_counter()
    epochs = 0
    while True:
        try:
            samples += batch_len(next(it))
        except StopIteration:
            epochs += 1
            it = iter(candidate)  # a new epoch, with its worker restart unless persistent
            continue
        if time.perf_counter() - t1 >= seconds and samples:
            break
    elapsed = time.perf_counter() - t1
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    return {"num_workers": workers, "prefetch_factor": candidate.prefetch_factor, "samples_per_s":
            round(samples / elapsed, 2), "startup_s": round(startup, 4), "seconds": round(elapsed, 3),
            "samples": samples, "epoch_restarts": epochs}


def tune(loader: Any, max_workers: int, seconds: float, emit: Callable[[str, dict[str, Any]], None]) -> dict[str, Any]:
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []

    def measure(w: int) -> float:
        emit("tune-start", {"num_workers": w})
        row = measure_point(loader, w, seconds)
        row["step"] = len(rows) + 1
        rows.append(row)
        emit("tune-point", row)
        return float(row["samples_per_s"])

    s = search(measure, max_workers)
    chosen = s.chosen if s.chosen is not None else 0
    by_w = {r["num_workers"]: r for r in rows}
    result: dict[str, Any] = {"points": rows, "chosen": {"num_workers": chosen, "prefetch_factor": None,
                                                         "persistent_workers": False}}
    base = by_w[chosen]
    if chosen > 0:
        emit("tune-start", {"num_workers": chosen, "prefetch_factor": 4})
        row = measure_point(loader, chosen, seconds, prefetch=4)
        row["step"] = len(rows) + 1
        rows.append(row)
        emit("tune-point", row)
        better = row["samples_per_s"] > base["samples_per_s"] * (1 + TOLERANCE)
        result["chosen"]["prefetch_factor"] = 4 if better else base["prefetch_factor"]
        if better:
            base = row
        try:
            epoch_s = len(loader.dataset) / max(base["samples_per_s"], 1e-9)
        except TypeError:
            epoch_s = None
        restart = base["startup_s"]
        result["epoch_seconds"] = round(epoch_s, 3) if epoch_s else None
        result["chosen"]["persistent_workers"] = bool(epoch_s and restart > PERSISTENT_SHARE * epoch_s)
    result["chosen"]["samples_per_s"] = base["samples_per_s"]
    result["best_measured"] = max(r["samples_per_s"] for r in rows)
    result["seconds"] = round(time.perf_counter() - started, 2)
    result["max_workers"] = max_workers
    return result
