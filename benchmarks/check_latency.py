"""Wall time of `torchdoctor check` against `python -m torch.utils.collect_env`, side by side.

Targets (issue 2): `torchdoctor check` (torch installed, no GPU) at most 1/5 of collect_env's
median, and under 0.3 s with `--no-torch`. Each command runs as a fresh process, the way a user
runs it; runs are interleaved so that background load hits both alike.

    python benchmarks/check_latency.py [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "collect_env": [sys.executable, "-m", "torch.utils.collect_env"],
    "check": [sys.executable, "-m", "torchdoctor", "check", "--fail-on", "never"],
    "check --no-torch": [sys.executable, "-m", "torchdoctor", "check", "--no-torch", "--fail-on", "never"],
}


def once(argv: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=300)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    for argv in COMMANDS.values():  # warm the page cache once, untimed
        once(argv)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.runs):
        for name, argv in COMMANDS.items():
            times[name].append(once(argv))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"{'command':<20} {'median':>9} {'min':>9} {'max':>9}   ({args.runs} runs each)")
    for name, ts in times.items():
        print(f"{name:<20} {med[name]:>8.3f}s {min(ts):>8.3f}s {max(ts):>8.3f}s")
    ratio = med["check"] / med["collect_env"]
    ok_ratio = ratio <= 0.2
    ok_fast = med["check --no-torch"] < 0.3
    print()
    print(f"check / collect_env = {ratio:.3f}  (target <= 0.200: {'PASS' if ok_ratio else 'FAIL'})")
    print(f"check --no-torch    = {med['check --no-torch']:.3f}s (target < 0.300 s: {'PASS' if ok_fast else 'FAIL'})")
    return 0 if ok_ratio and ok_fast else 1


if __name__ == "__main__":
    sys.exit(main())
