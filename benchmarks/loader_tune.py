"""The tuner against an exhaustive sweep of num_workers, on a CPU-bound and an I/O-bound loader.

Target (issue 5): on each loader the tuner's choice reaches at least 95% of the best throughput
the exhaustive sweep measured, in at most half the sweep's time. Both measure each setting the
same way (`probes.tune.measure_point`, i.e. `probes.rate.measure_rate`: samples/s over a steady
window of `--seconds` after the first batch and the prefetched ones); the tuner's time includes its
repeats and its prefetch_factor check. The choice is scored with the sweep's own measurement of
that setting, so both sides are compared on the same numbers.
Loaders: tests/fixtures/loader/tune_targets.py.

With `--hog`, the tuner runs beside a CPU hog (a process this script starts and ends itself, by
its PID): busy for random bursts of about `--hog-period` seconds, idle in between, busy
`--hog-duty` of the time (1.0: all the time). The hog is then stopped, and the settings are
measured quietly: a sweep of every setting, then the sweep's `--top` best and the tuner's pick
`--quiet-runs` times each, in turns. The figure is the ratio quiet throughput of the tuner's pick /
quiet throughput of the best setting (median of its quiet runs); target >= 0.95. `--single` also
runs, under the same hog, the tuner with one run per setting (no repeats), for comparison.

    python benchmarks/loader_tune.py [--max-workers 16] [--seconds 1.0]
    python benchmarks/loader_tune.py --hog [--hog-duty 0.5] [--hog-period 1.0] [--single]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

REPO = Path(__file__).resolve().parents[1]

#: The hog: busy bursts of random length around PERIOD, idle so that the busy share is DUTY.
HOG = """
import random, sys, time
duty, period = float(sys.argv[1]), float(sys.argv[2])
rng = random.Random()
while True:
    busy = rng.uniform(0.3, 1.7) * period
    end = time.monotonic() + busy
    x = 0
    while time.monotonic() < end:
        for _ in range(10000):
            x += 1
    if duty < 1.0:
        time.sleep(busy * (1.0 - duty) / duty)
"""


class Hog:
    """A CPU hog process, started and ended by this script (by its PID)."""

    def __init__(self, duty: float, period: float) -> None:
        self.duty, self.period = duty, period
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Hog:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOG, str(self.duty), str(self.period)],  # noqa: S603
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None:
            self.proc.terminate()  # SIGTERM to self.proc.pid, the process started above
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


Key = tuple[int, Any]


def measure(loader: Any, key: Key, seconds: float) -> float:
    from torchdoctor.probes.tune import measure_point

    return float(measure_point(loader, key[0], seconds, prefetch=key[1] if key[0] else None)["samples_per_s"])


def sweep(loader: Any, max_workers: int, seconds: float) -> tuple[dict[int, float], float]:
    start = time.perf_counter()
    out = {w: measure(loader, (w, None), seconds) for w in range(max_workers + 1)}
    return out, time.perf_counter() - start


def tuner(loader: Any, max_workers: int, seconds: float, max_runs: int | None = None) -> tuple[dict[str, Any], float]:
    from torchdoctor.probes.tune import MAX_RUNS, tune

    start = time.perf_counter()
    result = tune(
        loader, max_workers, seconds, lambda kind, data: None, max_runs=MAX_RUNS if max_runs is None else max_runs
    )
    return result, time.perf_counter() - start


def pick(result: dict[str, Any]) -> Key:
    c = result["chosen"]
    pf = c.get("prefetch_factor")
    return c["num_workers"], (None if pf in (None, 2) else pf)


def load() -> str:
    """The host's load average (other jobs share the machine: the figures depend on them)."""
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def runs_text(result: dict[str, Any]) -> str:
    return "  ".join(
        f"{p['num_workers']}{'/pf' + str(p['prefetch_factor']) if p['prefetch_factor'] == 4 else ''}"
        f":{p['samples_per_s']:,.0f}"
        for p in result["points"]
    )


def plain(args: argparse.Namespace, tune_targets: Any) -> bool:
    ok = True
    for name in args.loaders:
        loader = getattr(tune_targets, name)()
        result, t_time = tuner(loader, args.max_workers, args.seconds)
        measured, s_time = sweep(loader, args.max_workers, args.seconds)
        chosen = result["chosen"]["num_workers"]
        best_w = max(measured, key=lambda w: measured[w])
        quality = measured[chosen] / measured[best_w]
        cost = t_time / s_time
        ok &= quality >= 0.95 and cost <= 0.5
        print(f"== {name} ({load()})")
        print("   sweep  : " + "  ".join(f"{w}:{v:,.0f}" for w, v in measured.items()))
        print("   tuner  : " + runs_text(result))
        print(
            f"   sweep best  num_workers={best_w}: {measured[best_w]:,.0f} samples/s in {s_time:.1f} s "
            f"({args.max_workers + 1} settings)"
        )
        print(
            f"   tuner chose num_workers={chosen} (prefetch_factor={result['chosen']['prefetch_factor']}): "
            f"{measured[chosen]:,.0f} samples/s in the sweep, found in {t_time:.1f} s ({len(result['points'])} runs "
            f"of {len(result['settings'])} settings, {result['repeats']} repeated)"
        )
        print(
            f"   quality {quality:.3f} (target >= 0.95: {'PASS' if quality >= 0.95 else 'FAIL'})   "
            f"time ratio {cost:.3f} (target <= 0.50: {'PASS' if cost <= 0.5 else 'FAIL'})",
            flush=True,
        )
    return ok


def hogged(args: argparse.Namespace, tune_targets: Any) -> bool:
    ok = True
    for name in args.loaders:
        loader = getattr(tune_targets, name)()
        print(
            f"== {name}: tuning beside a CPU hog (duty {args.hog_duty}, bursts ~{args.hog_period} s; {load()})",
            flush=True,
        )
        results: dict[str, tuple[dict[str, Any], float]] = {}
        with Hog(args.hog_duty, args.hog_period) as hog:
            assert hog.proc is not None
            print(f"   hog pid {hog.proc.pid}", flush=True)
            results["repeating"] = tuner(loader, args.max_workers, args.seconds)
            if args.single:
                results["single run"] = tuner(loader, args.max_workers, args.seconds, max_runs=1)
        for label, (result, secs) in results.items():
            print(f"   tuner ({label}) under the hog, {secs:.1f} s, {len(result['points'])} runs: {runs_text(result)}")
            print(
                f"      chose {pick(result)} at {result['chosen']['samples_per_s']:,.0f} samples/s "
                f"(settled: {result['settled']})",
                flush=True,
            )
        print(f"   hog stopped ({load()})", flush=True)
        swept, s_time = sweep(loader, args.max_workers, args.seconds)
        print("   quiet sweep: " + "  ".join(f"{w}:{v:,.0f}" for w, v in swept.items()) + f"  ({s_time:.1f} s)")
        keys: list[Key] = [(w, None) for w in sorted(swept, key=lambda w: -swept[w])[: args.top]]
        for result, _ in results.values():
            if pick(result) not in keys:
                keys.append(pick(result))
        quiet: dict[Key, list[float]] = {k: [] for k in keys}
        for _ in range(args.quiet_runs):
            for k in keys:  # in turns, so that what noise is left falls on all of them
                quiet[k].append(measure(loader, k, args.seconds))
        value = {k: median(v) for k, v in quiet.items()}
        best = max(value, key=lambda k: value[k])
        print(
            "   quiet re-measure (median of "
            + str(args.quiet_runs)
            + "): "
            + "  ".join(f"{k[0]}{'/pf' + str(k[1]) if k[1] else ''}:{value[k]:,.0f}" for k in keys)
        )
        for label, (result, _) in results.items():
            ratio = value[pick(result)] / value[best]
            verdict = "PASS" if ratio >= 0.95 else "FAIL"
            if label == "repeating":
                ok &= ratio >= 0.95
            print(
                f"   {label}: pick {pick(result)} quiet {value[pick(result)]:,.0f} / best {best} quiet "
                f"{value[best]:,.0f} = ratio {ratio:.3f} (target >= 0.95: {verdict})",
                flush=True,
            )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-workers", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--loaders", nargs="+", default=["cpu_bound", "io_bound"], choices=["cpu_bound", "io_bound"])
    parser.add_argument("--hog", action="store_true", help="tune beside a CPU hog, then score the pick quietly")
    parser.add_argument("--hog-duty", type=float, default=0.5, help="busy share of the hog (1.0: always busy)")
    parser.add_argument("--hog-period", type=float, default=1.0, help="mean length of a busy burst, seconds")
    parser.add_argument("--top", type=int, default=3, help="quiet sweep's best settings re-measured")
    parser.add_argument("--quiet-runs", type=int, default=5, help="quiet re-measurements of each")
    parser.add_argument("--single", action="store_true", help="also run the tuner with one run per setting")
    args = parser.parse_args()
    if not 0 < args.hog_duty <= 1 or args.hog_period <= 0:
        parser.error("--hog-duty must be in (0, 1] and --hog-period > 0")
    sys.path.insert(0, str(REPO / "src"))
    sys.path.insert(0, str(REPO / "tests" / "fixtures" / "loader"))
    import tune_targets  # type: ignore[import-not-found]

    ok = hogged(args, tune_targets) if args.hog else plain(args, tune_targets)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
