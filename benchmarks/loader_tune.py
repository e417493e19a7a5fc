"""The tuner against an exhaustive sweep of num_workers, on a CPU-bound and an I/O-bound loader.

Target (issue 5): on each loader the tuner's choice reaches at least 95% of the best throughput
the exhaustive sweep measured, in at most half the sweep's time. Both measure each setting the
same way (`probes.tune.measure_point`: samples/s over `--seconds` after the first batch and the
prefetched ones); the tuner's time includes its prefetch_factor check. The choice is scored with
the sweep's own measurement of that setting, so both sides are compared on the same numbers.
Loaders: tests/fixtures/loader/tune_targets.py.

    python benchmarks/loader_tune.py [--max-workers 16] [--seconds 1.0]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def sweep(loader: Any, max_workers: int, seconds: float) -> tuple[dict[int, float], float]:
    from torchdoctor.probes.tune import measure_point

    start = time.perf_counter()
    out = {w: float(measure_point(loader, w, seconds)["samples_per_s"]) for w in range(max_workers + 1)}
    return out, time.perf_counter() - start


def tuner(loader: Any, max_workers: int, seconds: float) -> tuple[dict[str, Any], float]:
    from torchdoctor.probes.tune import tune

    start = time.perf_counter()
    result = tune(loader, max_workers, seconds, lambda kind, data: None)
    return result, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-workers", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    sys.path.insert(0, str(REPO / "tests" / "fixtures" / "loader"))
    import tune_targets  # type: ignore[import-not-found]

    ok = True
    for name in ("cpu_bound", "io_bound"):
        loader = getattr(tune_targets, name)()
        result, t_time = tuner(loader, args.max_workers, args.seconds)
        measured, s_time = sweep(loader, args.max_workers, args.seconds)
        chosen = result["chosen"]["num_workers"]
        best_w = max(measured, key=lambda w: measured[w])
        quality = measured[chosen] / measured[best_w]
        cost = t_time / s_time
        ok &= quality >= 0.95 and cost <= 0.5
        print(f"== {name}")
        print("   sweep  : " + "  ".join(f"{w}:{v:,.0f}" for w, v in measured.items()))
        print("   tuner  : " + "  ".join(f"{p['num_workers']}{'/pf' + str(p['prefetch_factor']) if p['prefetch_factor'] == 4 else ''}"
                                         f":{p['samples_per_s']:,.0f}" for p in result["points"]))
        print(f"   sweep best  num_workers={best_w}: {measured[best_w]:,.0f} samples/s in {s_time:.1f} s "
              f"({args.max_workers + 1} settings)")
        print(f"   tuner chose num_workers={chosen} (prefetch_factor={result['chosen']['prefetch_factor']}): "
              f"{measured[chosen]:,.0f} samples/s in the sweep, found in {t_time:.1f} s ({len(result['points'])} settings)")
        print(f"   quality {quality:.3f} (target >= 0.95: {'PASS' if quality >= 0.95 else 'FAIL'})   "
              f"time ratio {cost:.3f} (target <= 0.50: {'PASS' if cost <= 0.5 else 'FAIL'})", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
