"""``torchdoctor runs diff A B`` / ``torchdoctor runs show A``: recorded runs, compared step by step.

Exit codes of ``runs diff``: 0 the runs agree on every step compared, 1 they part (finding TD477),
2 bad input (a directory that is missing or holds no run, a file that is not RunRecorder's).
"""

from __future__ import annotations

import json
import sys
from typing import IO, Any

import click

from .cli import CONTEXT_SETTINGS, FORMAT, cli, finish

TOLERANCE = click.FloatRange(min=0.0)


@cli.group(context_settings=CONTEXT_SETTINGS)
def runs() -> None:
    """Compare runs recorded with RunRecorder: where do two runs of the same script part?

    \b
    Record each run (every rank writes DIR/fingerprints-rank{R}.jsonl):
      from torchdoctor.ranks.fingerprint import RunRecorder
      rec = RunRecorder("runs/a", model=model)
      ... rec.record(step, loss=loss, model=model, batch=batch)   # after optimizer.step()
    \b
    Then:
      torchdoctor runs show runs/a
      torchdoctor runs diff runs/a runs/b
    """


@runs.command(context_settings=CONTEXT_SETTINGS)
@click.argument("run_a", metavar="RUN_A", type=click.Path())
@click.argument("run_b", metavar="RUN_B", type=click.Path())
@click.option("--format", "fmt", type=FORMAT, default="text", show_default=True, help="Output format.")
@click.option(
    "--rtol", type=TOLERANCE, default=0.0, show_default=True, help="Relative tolerance per value (0: bit for bit)."
)
@click.option("--atol", type=TOLERANCE, default=0.0, show_default=True, help="Absolute tolerance per value.")
def diff(run_a: str, run_b: str, fmt: str, rtol: float, atol: float) -> None:
    """Name the first step, the rank, and what differed first between two runs.

    Per rank and step it compares the batch checksum (the step's input), the loss and gradients
    (computed during the step) and the parameters (after the update), in that order, and says
    whether the runs parted at the data (different batches: unseeded workers, shuffling), the
    start (different initial parameters: no seed) or the computation (same batch, other results:
    non-deterministic operations), with the fix (TD477).

    \b
    Examples:
      torchdoctor runs diff runs/a runs/b
      torchdoctor runs diff runs/a runs/b --rtol 1e-6          ignore float noise below 1e-6
      torchdoctor runs diff runs/a runs/b --format json
    Exit status: 0 the runs agree, 1 they part, 2 bad input.
    """
    from .ranks.diff import diff_runs, render
    from .ranks.runfile import RunError, load_run

    a, b = load_run(run_a), load_run(run_b)
    result = diff_runs(a, b, rtol=rtol, atol=atol)
    if not result.compared and not result.parted:
        raise RunError(
            f"{run_a} and {run_b} have no step in common on any rank (A: {_extent(a)}; B: {_extent(b)}): "
            "nothing to compare; record both runs with the same step numbers and ranks"
        )
    finish(lambda: render(result, fmt, sys.stdout), 1 if result.parted else 0)


@runs.command(context_settings=CONTEXT_SETTINGS)
@click.argument("run", metavar="RUN", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def show(run: str, fmt: str) -> None:
    """A recorded run at a glance: per rank, its steps and its first and last loss.

    \b
    Example:
      torchdoctor runs show runs/a
    """
    from .ranks.runfile import load_run

    summary = run_summary(load_run(run))
    finish(lambda: _render_show(summary, fmt, sys.stdout), 0)


def _extent(run: Any) -> str:
    parts = [
        f"rank {r} steps {min(run.steps[r])}-{max(run.steps[r])}" if run.steps[r] else f"rank {r} no steps"
        for r in run.ranks
    ]
    return ", ".join(parts) or "no rank"


def run_summary(run: Any) -> dict[str, Any]:
    """What ``runs show`` prints, as data: the run's path, notes, and one row per rank."""
    from .ranks.runfile import finite

    rows = []
    for rank in run.ranks:
        steps = sorted(run.steps[rank])
        losses = run.losses(rank)
        head = run.meta.get(rank, {})
        fields = sorted({k for r in run.steps[rank].values() for k in r} - {"kind", "step", "t"})
        rows.append(
            {
                "rank": rank,
                "steps": len(steps),
                "first_step": steps[0] if steps else None,
                "last_step": steps[-1] if steps else None,
                "first_loss": losses[0] if losses else None,
                "last_loss": losses[-1] if losses else None,
                "fields": fields,
                "torch": head.get("torch"),
                "seed": head.get("seed"),
                "host": head.get("host"),
                "initial_params": "init" in head,
            }
        )
    return finite({"path": run.path, "ranks": rows, "notes": list(run.notes)})


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _render_show(summary: dict[str, Any], fmt: str, out: IO[str]) -> None:
    if fmt == "json":
        json.dump(summary, out, indent=2)
        out.write("\n")
        return
    from rich.table import Table
    from rich.text import Text

    from .report.text import make_console

    console = make_console(out)
    console.print(Text(f"{summary['path']}: {len(summary['ranks'])} rank(s)", style="bold"))
    table = Table(show_edge=False, header_style="bold")
    for name in ("rank", "steps", "first", "last", "first loss", "last loss", "seed", "recorded"):
        table.add_column(name)
    for r in summary["ranks"]:
        recorded = ", ".join(r["fields"]) + (", init" if r["initial_params"] else "")
        table.add_row(
            str(r["rank"]),
            str(r["steps"]),
            _fmt(r["first_step"]),
            _fmt(r["last_step"]),
            _fmt(r["first_loss"]),
            _fmt(r["last_loss"]),
            _fmt(r["seed"]),
            recorded,
        )
    console.print(table)
    for note in summary["notes"]:
        console.print(Text(note, style="dim"))
