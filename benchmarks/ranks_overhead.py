"""What ``DoctorCallback`` costs a Lightning training step: a tiny model, ``ddp`` on gloo, 2 CPU processes.

Target: at most 1% of the step time, with ``sync_every=100`` (``check_in_sync``) and run fingerprints
recorded every step (loss and batch checksum each step; parameter and gradient checksums, whose
``sqrt(sumsq)`` is the gradient norm, every ``params_every`` steps), plus memory samples.

Two measurements, side by side in one run:

* **loops**: the same job without and with the callback (``base`` / ``doctor``; ``doctor-10``: with
  ``fingerprint_every=10``, a record every 10th step), interleaved, ``--rounds``
  times each; the time per step between the first batch and ``on_train_end`` on rank 0, wall and CPU time
  (start-up, preflight and the determinism audit, once per fit, are outside). Medians, the per-round ratio, and the
  spread of ``base``: on a shared 2-core VM the loops move by several percent between runs, more than the
  effect measured.
* **inside**: in the ``doctor`` runs, the time spent inside the callback's per-step hook
  (``on_train_batch_end``), measured around each call, as a share of the step. That is the
  callback's own cost and does not depend on the noise of the loop.
* **parts**: a fourth run (``parts``, fingerprints every step) with a stopwatch around each part the
  hook calls, to say where the time goes; its stopwatches cost a little each, so it is not one of the
  measured runs.

    python benchmarks/ranks_overhead.py [--steps 1500] [--rounds 3] [--variants base,doctor,doctor-10,parts]

Lightning starts rank 1 by running this script again with the same arguments (``--child``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PER_STEP_HOOKS = ("on_train_batch_end",)
VARIANTS = ("base", "doctor", "doctor-10", "parts")


def _switches() -> int:
    """Involuntary context switches of this process so far (another process or thread took the CPU)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


def child(args: argparse.Namespace) -> None:
    """One training job (both ranks run this)."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from torchdoctor.lab.scenarios.lightning import cpu_trainer, tiny_module
    from torchdoctor.lightning import DoctorCallback

    class Clock(L.Callback):
        """From the first batch's start (after every callback's ``on_train_start``: DoctorCallback's determinism
        audit runs once per fit there) to ``on_train_end`` (called on this callback first); wall time and this
        process's CPU time, all its threads (gloo's too)."""

        started = ended = cpu_started = cpu_ended = 0.0
        steps_before = 0

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if not self.started:
                self.started, self.cpu_started = time.perf_counter(), time.process_time()
                self.steps_before = int(trainer.global_step)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self.ended, self.cpu_ended = time.perf_counter(), time.process_time()

    class TimedDoctor(DoctorCallback):
        """DoctorCallback with a stopwatch around its per-step hooks."""

        inside = 0.0
        inside_cpu = 0.0
        switches = 0

    for name in PER_STEP_HOOKS:

        def timed(self: Any, *a: Any, __name: str = name, **k: Any) -> Any:
            # nested: the getrusage calls (about 1 us each) outside the CPU-time window, and that window's own
            # clock reads outside the wall-time one
            s0 = _switches()
            c0 = time.thread_time()
            t0 = time.perf_counter()
            try:
                return getattr(DoctorCallback, __name)(self, *a, **k)
            finally:
                t1 = time.perf_counter()
                c1 = time.thread_time()
                self.switches += _switches() - s0
                self.inside += t1 - t0
                self.inside_cpu += c1 - c0

        setattr(TimedDoctor, name, timed)

    # where the time goes: the parts the hooks call, each with its own stopwatch (seconds summed over the run)
    from torchdoctor.ranks.fingerprint import RunRecorder
    from torchdoctor.ranks.memory import MemoryTracker

    parts: dict[str, float] = {}

    def stopwatch(owner: Any, attr: str, label: str) -> None:
        fn = getattr(owner, attr)
        parts[label] = 0.0  # declared in this order, reported in it

        def wrapped(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                parts[label] = parts.get(label, 0.0) + time.perf_counter() - t0

        setattr(owner, attr, wrapped)

    import torchdoctor.ranks.fingerprint as fpm
    import torchdoctor.ranks.sync as sync
    from torchdoctor.guards.rankfile import RankFile

    if args.variant == "parts":  # stopwatches cost a little each: their own run, not the measured ones
        stopwatch(RunRecorder, "record", "fingerprint record")
        stopwatch(fpm, "quick_capture", "  of which keeping the step's loss and batch for the flush")
        stopwatch(fpm, "capture_batch", "  of which keeping a batch off the common road")
        stopwatch(fpm, "fingerprint_module", "  of which parameter and gradient checksums")
        stopwatch(RunRecorder, "flush", "  of which flushes (checksums, losses, lines)")
        stopwatch(RankFile, "write", "    of which the write")
        stopwatch(MemoryTracker, "sample", "memory sample")
        import torchdoctor.ranks.memory as memory

        stopwatch(memory, "_status_sample", "  of which /proc/self/status (until getrusage is trusted)")
        stopwatch(sync, "start_check", "sync check: checksums, gather started")
        stopwatch(DoctorCallback, "_sync_report", "sync check: report read a step later")

    torch.manual_seed(0)
    torch.set_num_threads(1)
    n = args.steps * 32 * 2
    data = DataLoader(TensorDataset(torch.randn(n, 32), torch.randn(n, 1)), batch_size=32)
    clock = Clock()
    callbacks: list[Any] = [clock]
    doctor = None
    if args.variant.startswith("doctor") or args.variant == "parts":
        every = int(args.variant.partition("-")[2] or 1) if args.variant != "parts" else 1
        doctor = TimedDoctor(
            sync_every=100,
            fingerprints=Path(args.out) / "fingerprints",
            fingerprint_every=every,
            report_dir=Path(args.out),
        )
        callbacks.append(doctor)
    trainer = cpu_trainer(callbacks)
    trainer.fit(tiny_module(inputs=32, hidden=256, layers=2), data)
    if trainer.global_rank == 0:
        steps = int(trainer.global_step)
        result = {
            "per_step": (clock.ended - clock.started) / (steps - clock.steps_before),
            "cpu_per_step": (clock.cpu_ended - clock.cpu_started) / (steps - clock.steps_before),
            "inside": (doctor.inside / steps) if doctor is not None else 0.0,
            "inside_cpu": (doctor.inside_cpu / steps) if doctor is not None else 0.0,
            "switches": (doctor.switches / steps) if doctor is not None else 0.0,
            "steps": steps,
            "syncs": len(doctor.sync_reports) if doctor is not None else 0,
            "parts": {k: v / steps for k, v in parts.items()},
        }
        (Path(args.out) / "result.json").write_text(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="which runs, comma-separated (default: all four; the summary needs base and both doctor runs)",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="base", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return

    import lightning
    import torch

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["GLOO_SOCKET_IFNAME"] = "lo"
    variants = tuple(v for v in args.variants.split(",") if v)
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        sys.exit(f"--variants: unknown {', '.join(sorted(unknown))} ({', '.join(VARIANTS)})")
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu_times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    inside: dict[str, list[float]] = {v: [] for v in VARIANTS}
    inside_cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    switches: dict[str, list[float]] = {v: [] for v in VARIANTS}
    parts: dict[str, dict[str, list[float]]] = {v: {} for v in VARIANTS}
    syncs = 0
    with tempfile.TemporaryDirectory(prefix="td-ranks-bench-") as d:
        for r in range(args.rounds):
            for variant in variants[r % len(variants) :] + variants[: r % len(variants)]:
                out = Path(d) / f"{variant}-{r}"
                out.mkdir()
                cmd = [sys.executable, __file__, "--child", "--variant", variant, "--out", str(out)]
                proc = subprocess.run(
                    [*cmd, "--steps", str(args.steps)], env=env, cwd=out, capture_output=True, text=True, timeout=900
                )
                # torch 2.13's gloo aborts a finished job at exit now and then ("terminate called without an
                # active exception", also without torchdoctor): the run is measured when it wrote its result
                aborted_at_exit = "terminate called without an active exception" in proc.stderr
                if proc.returncode != 0 and not (aborted_at_exit and (out / "result.json").exists()):
                    sys.exit(f"{variant} run failed:\n{proc.stderr[-3000:]}")
                res = json.loads((out / "result.json").read_text())
                times[variant].append(res["per_step"])
                cpu_times[variant].append(res["cpu_per_step"])
                inside[variant].append(res["inside"])
                inside_cpu[variant].append(res["inside_cpu"])
                switches[variant].append(res["switches"])
                for label, value in res["parts"].items():
                    parts[variant].setdefault(label, []).append(value)
                syncs = max(syncs, res["syncs"])
                print(f"round {r + 1}/{args.rounds} {variant:6}: {res['per_step'] * 1e3:.3f} ms/step", flush=True)
    base_times = times["base"] or times[variants[0]]  # without a base run: the first run's step stands in
    base = statistics.median(base_times)
    spread = (max(base_times) - min(base_times)) / base
    print(
        f"torch {torch.__version__}, lightning {lightning.__version__}, ddp/gloo 2 CPU processes, "
        f"{args.steps} steps x {args.rounds} rounds; DoctorCallback(sync_every=100) ({syncs} sync checks per run)"
    )
    print(f"base: {base * 1e3:.3f} ms/step, spread (max-min)/median {spread:.1%}")
    base_cpu = cpu_times["base"] or cpu_times[variants[0]]
    print(
        f"base: {statistics.median(base_cpu) * 1e3:.3f} ms CPU/step (rank 0, all its threads), spread "
        f"{(max(base_cpu) - min(base_cpu)) / statistics.median(base_cpu):.1%}"
    )
    for variant, what in (("doctor", "fingerprints every step"), ("doctor-10", "fingerprint_every=10")):
        if not times[variant]:
            continue
        doc = statistics.median(times[variant])
        paired = statistics.median(dt / bt for dt, bt in zip(times[variant], base_times))
        own = statistics.median(inside[variant])
        verdict = "within" if own <= 0.01 * base else "ABOVE"
        print(
            f"{variant:9} ({what}): loop {doc * 1e3:.3f} ms/step, {doc / base - 1:+.2%} (paired {paired - 1:+.2%}); "
            f"inside its per-step hooks {own * 1e6:.1f} us = {own / base:.2%} of a base step ({verdict} the 1% target)"
        )
        cpu_step = statistics.median(cpu_times[variant])
        print(
            f"{'':9}  loop CPU time (rank 0's threads): {cpu_step * 1e3:.3f} ms/step, "
            f"{cpu_step / statistics.median(base_cpu) - 1:+.2%} (paired "
            f"{statistics.median(d / b for d, b in zip(cpu_times[variant], base_cpu)) - 1:+.2%})"
        )
        cpu = statistics.median(inside_cpu[variant])
        print(
            f"{'':9}  of which this thread on a CPU: {cpu * 1e6:.1f} us = {cpu / base:.2%}; the rest, "
            f"{(own - cpu) * 1e6:.1f} us, it waited for a CPU (2 ranks and their gloo threads share 2 cores; "
            f"{statistics.median(switches[variant]):.3f} involuntary switches a step inside the hook)"
        )
    if not times["parts"]:
        return
    print(
        f"where the time goes (fingerprints every step; a separate run with a stopwatch around each part, "
        f"inside {statistics.median(inside['parts']) * 1e6:.1f} us a step there):"
    )
    for label, values in parts["parts"].items():  # in the order the child declared its stopwatches
        print(f"    {label}: {statistics.median(values) * 1e6:.1f} us a step")


if __name__ == "__main__":
    main()
