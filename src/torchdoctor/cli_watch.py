"""``torchdoctor watch -- COMMAND ...`` / ``torchdoctor watch --pid PID``: early warning while a job runs.

Exit status: the job's own (128 + N when signal N ended it); with ``--pid``, 0 once the process
has ended; 2 for usage errors.
"""

from __future__ import annotations

import sys
from typing import IO

import click

from .cli import CONTEXT_SETTINGS, cli, finish
from .errors import UsageError


@cli.command(context_settings={**CONTEXT_SETTINGS, "ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--pid", type=click.IntRange(min=1), default=None, help="Attach to this running process and its children."
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.05, max=3600),
    default=1.0,
    show_default=True,
    help="Seconds between samples.",
)
@click.option(
    "--horizon",
    type=click.FloatRange(min=1, max=86400),
    default=30.0,
    show_default=True,
    help="Warn when a limit is projected within this many seconds.",
)
@click.option(
    "--timeline", type=click.Path(dir_okay=False), default=None, help="Write every sample and warning as JSON."
)
@click.option(
    "--report", type=click.Path(dir_okay=False), default=None, help="Write a self-contained HTML report with plots."
)
@click.option(
    "--log",
    "logs",
    multiple=True,
    type=click.Path(exists=True, dir_okay=True),
    help="Also explain this log at the end (with --pid: the job's own log). Repeatable.",
)
@click.option("-q", "--quiet", is_flag=True, help="No warning lines while the job runs (they stay in the timeline).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def watch(
    pid: int | None,
    interval: float,
    horizon: float,
    timeline: str | None,
    report: str | None,
    logs: tuple[str, ...],
    quiet: bool,
    command: tuple[str, ...],
) -> None:
    """Run a job (or attach to one) and warn before it runs out of a resource.

    Samples the whole process tree (new DataLoader workers and ranks as they appear) every
    --interval seconds: memory maps against vm.max_map_count, open files against each process's
    own RLIMIT_NOFILE, /dev/shm, the cgroup's memory (or the host's), RSS/PSS, threads, CPU and GPU
    memory (NVML). When a limit is near or projected within --horizon seconds it prints one line
    with the code, the process, the value, the limit, the rate and the time left, once per process
    and resource. The job's output passes through unchanged; signals are forwarded; the exit status
    is the job's. If it fails, its output is explained at the end, with the warning that came first.

    \b
      torchdoctor watch -- python train.py --epochs 10
      torchdoctor watch --timeline run.json --report run.html -- torchrun --nproc-per-node 4 train.py
      torchdoctor watch --pid 4312 --log train.log
    """
    from .watch.run import WatchOptions, attach, run_command

    if report and not report.lower().endswith((".html", ".htm")):
        raise UsageError(f"--report {report!r}: give an .html file name")
    if pid is not None and command:
        raise UsageError("give either --pid PID or a command after --, not both")
    if pid is None and not command:
        raise UsageError("nothing to watch: give a command (`torchdoctor watch -- python train.py`) or --pid PID")
    opts = WatchOptions(interval=interval, horizon=horizon, logs=logs, quiet=quiet)
    result = attach(pid, opts) if pid is not None else run_command(list(command), opts)
    if timeline:
        result.write(timeline)
    if report:
        from .watch.html import write_report

        write_report(result.to_json(), report)
    summary(result.to_json(), sys.stderr, timeline, report)
    finish(lambda: None, result.exit_code or 0 if pid is None else 0)


def summary(data: dict, err: IO[str], timeline: str | None, report: str | None) -> None:
    """The end of the run on stderr: how it ended, the diagnosis, the warning that came first."""
    lines = []
    code, sig = data.get("exit_code"), data.get("signal")
    warnings = data.get("warnings") or []
    if data.get("command") is not None:
        how = f"exit {code}" + (f", {sig}" if sig else "")
        lines.append(
            f"torchdoctor watch: the job ended ({how}) after {data['ended'] - data['started']:.1f} s; "
            f"{len(data.get('samples') or [])} samples, {len(warnings)} warning(s)"
        )
    d = data.get("diagnosis")
    if d:
        lines.append(f"torchdoctor watch: ✖ {d['code']} [{d['family']}] {d['message']}")
        if d.get("warned_before_seconds") is not None:
            lines.append(f"  warned {d['warned_before_seconds']:.1f} s before the end: {d['warned']['message']}")
        if d.get("fix"):
            lines.append(f"  fix: {d['fix']}")
    for path, what in ((timeline, "timeline"), (report, "report")):
        if path:
            lines.append(f"torchdoctor watch: {what} written to {path}")
    try:
        for line in lines:
            err.write(line + "\n")
        err.flush()
    except (OSError, ValueError):
        pass
