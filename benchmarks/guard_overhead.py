"""What ``torchdoctor.guard()`` (and logging through ``torchdoctor.RankFile``) costs a training loop.

A small MLP (64 -> 256 -> 256 -> 10, batch 32, SGD) trained for ``--steps`` steps on one CPU thread,
in these variants, interleaved (the order rotates each round), ``--rounds`` times; medians of the
time per step, the median of the per-round ratios to ``base`` ("paired") and the ratio of the fastest
runs ("min vs min": the least disturbed by other processes):

* ``base``: the bare loop;
* ``guard-loop``: ``with torchdoctor.guard():`` around the whole loop (how it is meant to be used);
* ``guard-step``: ``@torchdoctor.guard()`` on the step function (the worst case: entered every step);
* ``log-file``: the bare loop printing one line per step to a plain ``open(path, "a")`` file (line
  buffered), the baseline for ``RankFile``;
* ``guard-rankfile``: ``guard-loop`` printing one line per step to a ``torchdoctor.RankFile``
  (only when ``torchdoctor.RankFile`` exists in this checkout).

Target: the guard plus a RankFile line per step cost at most 1% of the step time. On a busy machine
the loop-level figures move by several percent from run to run (the spread of ``base`` is printed),
more than the effect measured; so the last lines measure the costs alone, in tight loops, as a share
of the base step: entering and leaving a guard, and printing one line (the loop's own f-string) to a
RankFile, to a line-buffered ``open(path, "a", buffering=1)`` file, and to a block-buffered one.

    python benchmarks/guard_overhead.py [--steps 1000] [--rounds 21]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import torchdoctor


def make_step() -> Callable[[], float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    y = torch.randint(0, 10, (32,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


def run(variant: str, steps: int, tmp: Path) -> float:
    """Seconds per step of one variant."""
    step = make_step()
    for _ in range(50):  # warm up
        step()
    out: Any = None
    if variant == "log-file":
        out = open(tmp / "plain.log", "a", buffering=1)  # noqa: SIM115 - closed below
    elif variant == "guard-rankfile":
        out = torchdoctor.RankFile(tmp / "rank.log", prefix="[rank {rank}] ")
    started = time.perf_counter()
    if variant in ("base", "log-file"):
        for i in range(steps):
            loss = step()
            if out is not None:
                print(f"step {i} loss {loss:.4f}", file=out)
    elif variant in ("guard-loop", "guard-rankfile"):
        with torchdoctor.guard(report_dir=tmp / "reports"):
            for i in range(steps):
                loss = step()
                if out is not None:
                    print(f"step {i} loss {loss:.4f}", file=out)
    elif variant == "guard-step":
        guarded = torchdoctor.guard(report_dir=tmp / "reports")(step)
        for _ in range(steps):
            guarded()
    else:
        raise ValueError(variant)
    elapsed = time.perf_counter() - started
    if out is not None:
        out.close()
    return elapsed / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    torch.set_num_threads(1)
    has_rankfile = hasattr(torchdoctor, "RankFile")
    variants = ["base", "guard-loop", "guard-step", "log-file"] + (["guard-rankfile"] if has_rankfile else [])
    times: dict[str, list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for r in range(args.rounds):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            for v in order:
                times[v].append(run(v, args.steps, tmp))
        assert not (tmp / "reports").exists(), "a guard wrote a report on a passing run"
    med = {v: statistics.median(t) for v, t in times.items()}
    base = med["base"]
    spread = (max(times["base"]) - min(times["base"])) / base
    print(f"torch {torch.__version__}, 1 thread, {args.steps} steps x {args.rounds} rounds, pid {os.getpid()}")
    print(f"base spread (max-min)/median: {spread:.1%}")
    print(f"{'variant':16} {'us/step':>9} {'vs base':>9} {'paired':>9} {'min vs min':>11}")
    for v in variants:
        # paired: the median over rounds of (this variant / base in the same round): less sensitive to
        # slow drifts of the machine than the ratio of medians
        paired = statistics.median(t / b for t, b in zip(times[v], times["base"]))
        print(
            f"{v:16} {med[v] * 1e6:9.1f} {med[v] / base - 1:+9.2%} {paired - 1:+9.2%} "
            f"{min(times[v]) / min(times['base']) - 1:+11.2%}"
        )
    if has_rankfile:
        print(f"guard-rankfile vs log-file: {med['guard-rankfile'] / med['log-file'] - 1:+.2%}")
    else:
        print("torchdoctor.RankFile is not in this checkout: guard only")
    # the guard's own cost, measured directly: entering and leaving it, no work inside
    g = torchdoctor.guard()
    n = 200_000
    t0 = time.perf_counter()
    for _ in range(n):
        with g:
            pass
    per = (time.perf_counter() - t0) / n
    print(f"guard enter+exit alone: {per * 1e6:.2f} us = {per / base:.3%} of a base step")
    with tempfile.TemporaryDirectory() as d:
        lines = {
            "RankFile line": line_cost(lambda: torchdoctor.RankFile(Path(d) / "r.log", prefix="[rank {rank}] ")),
            "line-buffered file line": line_cost(lambda: open(Path(d) / "l.log", "a", buffering=1)),  # noqa: SIM115
            "block-buffered file line": line_cost(lambda: open(Path(d) / "b.log", "a")),  # noqa: SIM115
        }
    for name, cost in lines.items():
        print(f"{name + ' alone:':31} {cost * 1e6:5.2f} us = {cost / base:.3%} of a base step")
    total = per + lines["RankFile line"]
    verdict = "within" if total <= 0.01 * base else "ABOVE"
    print(f"guard + one RankFile line per step: {total / base:.3%} of a base step ({verdict} the 1% target)")


def line_cost(open_file: Callable[[], Any], n: int = 200_000, rounds: int = 5) -> float:
    """Seconds per ``print(f"step {i} loss {loss:.4f}", file=f)``: the best of ``rounds`` tight loops."""
    best = float("inf")
    for _ in range(rounds):
        f = open_file()
        t0 = time.perf_counter()
        for i in range(n):
            print(f"step {i} loss {0.25:.4f}", file=f)
        best = min(best, (time.perf_counter() - t0) / n)
        f.close()
    return best


if __name__ == "__main__":
    main()
