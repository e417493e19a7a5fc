"""``torchdoctor loader TARGET``: probe a real DataLoader, predict its failures, tune it.

Exit codes as everywhere (:class:`~torchdoctor.model.ExitCode`): 0 nothing at or above
``--fail-on``, 1 findings at or above it (including a crash, hang or error of the target's own
code, which are findings with the child's traceback), 2 usage errors (TARGET not found, not a
DataLoader or Dataset, bad options).
"""

from __future__ import annotations

import sys
from typing import IO, Any

import click

from .cli import CONTEXT_SETTINGS, FAIL_ON, FORMAT, SIZE, cli, exit_code_for
from .units import human_bytes

METHODS = click.Choice(["fork", "spawn", "forkserver"])


@cli.command(context_settings=CONTEXT_SETTINGS)
@click.argument("target")
@click.option("--format", "fmt", type=FORMAT, default="text", show_default=True, help="Output format.")
@click.option(
    "--fail-on",
    type=FAIL_ON,
    default="error",
    show_default=True,
    help="Exit 1 when a finding is at or above this severity ('never': always exit 0).",
)
@click.option("--static", "static", is_flag=True, help="Only inspect the loader; start no workers.")
@click.option(
    "--parent-start-method",
    type=METHODS,
    default=None,
    help="Start method of the process the loader will run in (e.g. spawn: it runs inside a spawn child).",
)
@click.option(
    "--sharing-strategy",
    type=click.Choice(["file_descriptor", "file_system"]),
    default=None,
    help="torch.multiprocessing sharing strategy the run sets (default: what the target sets, else torch's).",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="Override the loader's batch size.")
@click.option("--num-workers", type=click.IntRange(min=0), default=None, help="Override num_workers.")
@click.option("--multiprocessing-context", type=METHODS, default=None, help="Override multiprocessing_context.")
@click.option("--prefetch-factor", type=click.IntRange(min=1), default=None, help="Override prefetch_factor.")
@click.option("--pin-memory/--no-pin-memory", default=None, help="Override pin_memory.")
@click.option("--persistent-workers/--no-persistent-workers", default=None, help="Override persistent_workers.")
@click.option(
    "--batches",
    type=click.IntRange(min=2),
    default=8,
    show_default=True,
    help="Batches over which the live run follows worker memory and threads (its throughput is "
    "timed after them, over --tune-seconds).",
)
@click.option("--force-live", is_flag=True, help="Run the workers even when a failure is predicted (to see it happen).")
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=None,
    help="Hard limit in seconds for the whole probe [default: 60, with --tune 600].",
)
@click.option(
    "--memory-cap", type=SIZE, default=None, help="Kill the probe when its processes pass this PSS (e.g. 4GiB)."
)
@click.option("--tune", is_flag=True, help="Search num_workers (and prefetch_factor) for the best throughput.")
@click.option(
    "--max-workers",
    type=click.IntRange(min=1),
    default=None,
    help="Largest num_workers the tuner tries [default: max(8, 4 × usable cores)].",
)
@click.option(
    "--tune-seconds",
    type=click.FloatRange(min=0.1),
    default=1.0,
    show_default=True,
    help="Measuring window per run of a setting (the live run's throughput uses the same window).",
)
@click.option(
    "--tune-budget",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds the tuner may spend in all before it stops repeating settings whose readings "
    "disagree [default: 30 × --tune-seconds].",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="With --tune: write throughput against num_workers to this .png or .svg.",
)
def loader(
    target: str,
    fmt: str,
    fail_on: str,
    static: bool,
    parent_start_method: str | None,
    sharing_strategy: str | None,
    batch_size: int | None,
    num_workers: int | None,
    multiprocessing_context: str | None,
    prefetch_factor: int | None,
    pin_memory: bool | None,
    persistent_workers: bool | None,
    batches: int,
    force_live: bool,
    timeout: float | None,
    memory_cap: int | None,
    tune: bool,
    max_workers: int | None,
    tune_seconds: float,
    tune_budget: float | None,
    plot_path: str | None,
) -> None:
    """Probe a real DataLoader before a long job: predict its failures, measure it, tune it.

    TARGET is `package.module:function` or `path/to/file.py:function`; the function takes no
    arguments and returns a DataLoader (or a Dataset, built into one with the flags below). It
    runs in an isolated child with a hard timeout: a crash, hang or error of that code becomes a
    finding with its own traceback, and every process the probe starts is gone when it returns.

    \b
    Examples:
      torchdoctor loader train.py:make_loader
      torchdoctor loader mypkg.data:build --parent-start-method spawn --static
      torchdoctor loader train.py:make_dataset --batch-size 64 --num-workers 8
      torchdoctor loader train.py:make_loader --tune --plot throughput.png
    """
    from .errors import UsageError
    from .probes import ProbeOptions, probe_loader
    from .report import render_findings

    if plot_path and not tune:
        raise UsageError("--plot draws the --tune results: add --tune")
    if tune_budget is not None and not tune:
        raise UsageError("--tune-budget limits the --tune search: add --tune")
    if tune and static:
        raise UsageError("--tune runs workers; it cannot be combined with --static")
    opts = ProbeOptions(
        batch_size=batch_size,
        num_workers=num_workers,
        multiprocessing_context=multiprocessing_context,
        prefetch_factor=prefetch_factor,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers,
        parent_start_method=parent_start_method,
        sharing_strategy=sharing_strategy,
        static=static,
        force_live=force_live,
        batches=batches,
        timeout=timeout,
        memory_cap=memory_cap,
        tune=tune,
        max_workers=max_workers,
        tune_seconds=tune_seconds,
        tune_budget=tune_budget,
    )
    with _Progress(tune) as progress:
        report = probe_loader(target, opts, on_event=progress.event)
    section = report.section
    plotted = None
    if plot_path and section.get("tune"):
        from .probes.plot import plot_tune

        plotted = str(plot_tune(section["tune"], plot_path, title=f"torchdoctor loader {target}"))
    context: dict[str, Any] = {"source": "this host", "target": target, "probe": section}
    if plotted:
        context["plot"] = plotted
    render_findings(report.findings, fmt, "loader", sys.stdout, context)
    if fmt == "text":
        _summary(section, plotted, sys.stdout)
    sys.exit(int(exit_code_for(report.findings, fail_on)))


class _Progress:
    """A rich progress bar on stderr while tuning (a spinner with the phase otherwise), TTY only."""

    def __init__(self, tune: bool) -> None:
        self.tune = tune
        self.bar: Any = None
        self.task: Any = None

    def __enter__(self) -> _Progress:
        if not sys.stderr.isatty():
            return self
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[best]}"),
            TimeElapsedColumn(),
            console=Console(file=sys.stderr),
            transient=True,
        )
        self.bar.start()
        self.task = self.bar.add_task("starting the probe", total=None, best="")
        return self

    def event(self, e: dict[str, Any]) -> None:
        if self.bar is None:
            return
        kind = e.get("event")
        if kind == "phase":
            self.bar.update(self.task, description=f"probe: {e['phase']}")
        elif kind == "tune-start":
            extra = f", prefetch_factor={e['prefetch_factor']}" if e.get("prefetch_factor") else ""
            self.bar.update(self.task, description=f"tuning: num_workers={e['num_workers']}{extra}")
        elif kind == "tune-point":
            done = e["step"]
            self.bar.update(
                self.task,
                total=max(done + 2, 6),
                completed=done,
                best=f"{e['num_workers']} workers: {e['samples_per_s']:,.0f} samples/s",
            )
        elif kind == "progress":
            self.bar.update(self.task, description=f"live run: batch {e['batch']}/{e['of']}")

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()


def _summary(section: dict[str, Any], plotted: str | None, out: IO[str]) -> None:
    """What was measured, after the findings (text format only; JSON carries it under "probe")."""
    from rich.table import Table
    from rich.text import Text

    from .report.text import stripped

    rows: list[tuple[str, str]] = []
    desc, st, batch, live = (section.get(k) or {} for k in ("loader", "static", "batch", "live"))
    if desc:
        rows.append(
            (
                "loader",
                f"{desc.get('dataset_type')} × {desc.get('dataset_len')}, batch_size "
                f"{desc.get('batch_size')}, num_workers {desc.get('num_workers')}, prefetch_factor "
                f"{desc.get('prefetch_factor')}",
            )
        )
    if st:
        sto = st.get("storages") or {}
        rows.append(("workers start with", f"{st['start_method']['method']} ({st['start_method']['source']})"))
        rows.append(
            (
                "sent to each worker",
                f"{sto.get('pickle_bytes', 0):,} pickled bytes, {sto.get('count', 0):,} "
                f"tensor storages ({human_bytes(sto.get('bytes'))})",
            )
        )
    if batch:
        rows.append(
            (
                "one batch",
                f"{human_bytes(batch.get('bytes'))} in {batch.get('tensors')} tensors, "
                f"{batch.get('seconds')} s to make without workers",
            )
        )
    if live.get("ran"):
        rate = live.get("rate") or {}
        window = (
            f" (steady over {rate['window_batches']} batches in {rate['window_seconds']} s)"
            if rate.get("window_batches")
            else ""
        )
        rows.append(
            (
                "live run",
                f"first batch after {live['first_batch_seconds']} s, {live.get('samples_per_s')} samples/s{window}",
            )
        )
        if live.get("epoch_restart_seconds"):
            rows.append(
                (
                    "per epoch",
                    f"{live['epoch_seconds']} s with a worker restart of "
                    f"{live['epoch_restart_seconds']} s each: {live['epoch_samples_per_s']} samples/s "
                    "over whole epochs (persistent_workers=True keeps the workers)",
                )
            )
    elif live.get("skipped"):
        rows.append(("live run", f"skipped: {live['skipped']} (--force-live runs it anyway)"))
    tune = section.get("tune")
    if tune:
        c = tune["chosen"]
        rows.append(
            (
                "recommended",
                f"num_workers={c['num_workers']}, prefetch_factor={c.get('prefetch_factor')}, "
                f"persistent_workers={c.get('persistent_workers')}: "
                f"{c['samples_per_s']:,.0f} samples/s",
            )
        )
    if plotted:
        rows.append(("plot", plotted))
    with stripped(out) as console:
        if rows:
            console.print()
            grid = Table(title="measured", title_justify="left", show_header=False, box=None, padding=(0, 1))
            grid.add_column(style="dim", no_wrap=True)
            grid.add_column()
            for k, v in rows:
                grid.add_row(k, v)
            console.print(grid)
        if tune:
            console.print()
            table = Table(title="tuning (settings in the order first measured)", title_justify="left")
            for col in ("#", "num_workers", "prefetch", "samples/s", "runs", "spread", "vs best", "start-up s"):
                table.add_column(col, justify="right")
            points = tune["points"]
            best = max(float(x["samples_per_s"]) for x in tune["settings"]) or 1.0
            chosen = (tune["chosen"]["num_workers"], tune["chosen"].get("prefetch_factor"))
            first: dict[tuple[Any, Any], dict[str, Any]] = {}
            for r in points:
                first.setdefault((r["num_workers"], r.get("prefetch_factor")), r)
            for x in sorted(tune["settings"], key=lambda x: first[(x["num_workers"], x["prefetch_factor"])]["step"]):
                key = (x["num_workers"], x["prefetch_factor"])
                mark = " ★" if key == chosen else ""
                agreed = "" if x["settled"] else " ?"
                table.add_row(
                    str(first[key]["step"]),
                    f"{x['num_workers']}{mark}",
                    str(x["prefetch_factor"] or "-"),
                    f"{x['samples_per_s']:,.1f}{agreed}",
                    str(x["runs"]),
                    f"{100 * x['spread']:.0f}%",
                    f"{100 * x['samples_per_s'] / best:.0f}%",
                    f"{first[key]['startup_s']:.2f}",
                )
            console.print(table)
            note = (
                f"{len(points)} runs of {len(tune['settings'])} settings in {tune['seconds']} s "
                f"({tune.get('repeats', 0)} repeated because their readings disagreed)"
            )
            if not tune.get("settled", True):
                note += "; ? = readings still disagree (busy machine, or --tune-budget spent)"
            console.print(Text(note, style="dim"))
        out.write("\n")
