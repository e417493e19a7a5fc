"""``torchdoctor explain``: name the root cause of a failed run from its logs (registers on ``cli``).

Exit codes: 0 a diagnosis names what happened (a root cause, or at least a cascade); 1 nothing
matched (the most relevant unmatched error lines are shown); 2 usage errors (a missing file, bad
options) with one line on stderr.
"""

from __future__ import annotations

import sys

import click

from .cli import CONTEXT_SETTINGS, FORMAT, cli, finish
from .errors import UsageError


@cli.command(context_settings=CONTEXT_SETTINGS)
@click.argument("inputs", nargs=-1, metavar="[LOG|DIR|-]...")
@click.option("--format", "fmt", type=FORMAT, default="text", show_default=True, help="Output format.")
@click.option(
    "--no-redact",
    is_flag=True,
    help="Quote the log lines as they are: do not replace secrets (URL credentials, tokens, "
    "password=/token=/key= values, Bearer headers) with <redacted>.",
)
def explain(inputs: tuple[str, ...], fmt: str, no_redact: bool) -> None:
    """Name the root cause of a failed run from its logs, across ranks.

    Reads files (plain or gzip), directories (torchrun --log-dir layouts with per-rank
    stdout/stderr and error.json, Slurm output, any *.log/*.out/*.err/*.txt) and - for stdin.
    Understands rank prefixes ([rank3]:, [default3]:, srun --label) and torchrun's failure summary;
    the earliest root cause wins over later cascades such as watchdog timeouts.

    Secrets the logs quote are replaced by <redacted> in every format, so the report can be pasted
    into a public bug report: credentials in URLs (postgres://user:pw@...), token=, password=,
    api_key=, AccountKey= values, Bearer tokens, GitHub/Slack/AWS/Hugging Face/OpenAI tokens, JWTs.

    --no-redact shows them as they are (for your own eyes only).

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
    finish(lambda: render(report, fmt, sys.stdout, redact=not no_redact), int(report.exit_code))
