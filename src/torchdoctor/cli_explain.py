"""``torchdoctor explain``: name the root cause of a failed run from its logs (registers on ``cli``).

Exit codes: 0 a diagnosis names what happened (a root cause, or at least a cascade); 1 nothing
matched (the most relevant unmatched error lines are shown); 2 usage errors (a missing file, bad
options) with one line on stderr.
"""

from __future__ import annotations

import sys

import click

from .cli import CONTEXT_SETTINGS, FORMAT, cli
from .errors import UsageError


@cli.command(context_settings=CONTEXT_SETTINGS)
@click.argument("inputs", nargs=-1, metavar="[LOG|DIR|-]...")
@click.option("--format", "fmt", type=FORMAT, default="text", show_default=True, help="Output format.")
def explain(inputs: tuple[str, ...], fmt: str) -> None:
    """Name the root cause of a failed run from its logs, across ranks.

    Reads files (plain or gzip), directories (torchrun --log-dir layouts with per-rank
    stdout/stderr and error.json, Slurm output, any *.log/*.out/*.err/*.txt) and - for stdin.
    Understands rank prefixes ([rank3]:, [default3]:, srun --label) and torchrun's failure summary;
    the earliest root cause wins over later cascades such as watchdog timeouts.

    \b
    Examples:
      torchdoctor explain slurm-123456.out
      torchdoctor explain /tmp/torchrun-logs/ --format json
      kubectl logs trainer-0 | torchdoctor explain -
    """
    from .explain import explain_paths
    from .explain.render import render

    if not inputs:
        if sys.stdin is None or sys.stdin.isatty():
            raise UsageError("give a log file, a directory, or - to read standard input (torchdoctor explain --help)")
        inputs = ("-",)
    report = explain_paths(inputs)
    render(report, fmt, sys.stdout)
    sys.stdout.flush()
    sys.exit(int(report.exit_code))
