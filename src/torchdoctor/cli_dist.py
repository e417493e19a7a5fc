"""``torchdoctor dist``: a distributed smoke test that names the failing step, rank and host.

Exit codes: 0 every step passed on every rank, 1 a step failed (or a rank died, hung or never
joined), 2 usage errors.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from .cli import CONTEXT_SETTINGS, FORMAT, cli, finish
from .errors import UsageError
from .units import parse_bytes


def _sizes(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        sizes = tuple(parse_bytes(part.strip()) for part in value.split(",") if part.strip())
    except ValueError as exc:
        raise click.BadParameter(f"{exc} (expected a comma-separated list such as 4KiB,1MiB,64MiB)") from None
    if not sizes or any(s < 4 or s > 4 * 1024**3 for s in sizes):
        raise click.BadParameter("each size must be between 4 bytes and 4GiB (e.g. 4KiB,1MiB,64MiB)")
    return sizes


def _fault(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if not value:
        return None
    from .dist.probe import Fault

    try:
        return Fault.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def inside_launcher(env: dict[str, str]) -> str | None:
    """Which launcher started this process as a rank (torchrun, srun, another), or None."""
    if env.get("TORCHELASTIC_RUN_ID") and "RANK" in env:
        return "torchrun"
    if "RANK" in env or "WORLD_SIZE" in env:
        return "env"
    tasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or ""
    if "SLURM_PROCID" in env and tasks.isdigit() and int(tasks) > 1:
        return "slurm"
    return None


@cli.command(context_settings=CONTEXT_SETTINGS)
@click.option(
    "--nproc",
    "--nproc-per-node",
    "nproc",
    type=click.IntRange(min=1, max=1024),
    default=None,
    help="Ranks on this machine (default: one per visible GPU, else 2).",
)
@click.option("--nnodes", type=click.IntRange(min=1), default=1, show_default=True, help="Machines in the job.")
@click.option(
    "--node-rank", type=click.IntRange(min=0), default=0, show_default=True, help="This machine's number (0: the host)."
)
@click.option(
    "--rdzv-endpoint",
    "endpoint",
    metavar="HOST:PORT",
    default=None,
    help="Rendezvous address (default: MASTER_ADDR:MASTER_PORT when set, else a free local port; "
    "required with --nnodes > 1).",
)
@click.option(
    "--backend",
    type=click.Choice(["gloo", "nccl"]),
    default=None,
    help="Process-group backend (default: nccl when each rank sees a GPU, else gloo).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1.0, max=3600.0),
    default=30.0,
    show_default=True,
    help="Deadline of each step, in seconds (torch's own default is 30 minutes).",
)
@click.option(
    "--sizes",
    callback=_sizes,
    default=None,
    metavar="LIST",
    help="Message sizes for the bandwidth table (default 4KiB,64KiB,1MiB,16MiB).",
)
@click.option("--format", "fmt", type=FORMAT, default="text", show_default=True, help="Output format.")
@click.option("--plot", metavar="FILE.png|svg", default=None, help="Also draw bandwidth against message size.")
@click.option(
    "--log-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Keep each rank's journal and output in a new directory under this one (default: removed).",
)
@click.option(
    "--inject",
    callback=_fault,
    metavar="RANK:STEP:FAULT",
    default=None,
    help="Make one rank fail on purpose to see what a failure looks like: FAULT is kill, exit, hang, stop or "
    "wrong (e.g. 1:collectives:kill).",
)
def dist(
    nproc: int | None,
    nnodes: int,
    node_rank: int,
    endpoint: str | None,
    backend: str | None,
    timeout: float,
    sizes: tuple[int, ...] | None,
    fmt: str,
    plot: str | None,
    log_dir: str | None,
    inject: Any,
) -> None:
    """Smoke-test distributed training: every step, every rank, each with its own deadline.

    Starts the ranks with torch's elastic launcher (what torchrun uses), then on every rank:
    env (the environment checks), rendezvous (TCPStore), init (init_process_group), barrier,
    collectives (all_reduce, all_gather, broadcast, reduce_scatter; results checked), bandwidth
    (all_reduce over message sizes), devices (each rank's GPU; two ranks on one GPU), consistency
    (torch/CUDA/NCCL versions and limits compared across ranks). A rank that dies, hangs or never
    joins is named with its host, pid and the step it reached; the first failure comes with its code
    and fix. Nothing is left running.

    \b
    One machine:        torchdoctor dist --nproc 4
    Two machines:       torchdoctor dist --nnodes 2 --node-rank 0 --nproc 8 --rdzv-endpoint node0:29400
                        torchdoctor dist --nnodes 2 --node-rank 1 --nproc 8 --rdzv-endpoint node0:29400
    Under torchrun:     torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
                          --rdzv-endpoint node0:29400 -m torchdoctor.dist
    Under Slurm:        srun --ntasks-per-node 8 python -m torchdoctor.dist
    See a failure:      torchdoctor dist --inject 1:collectives:kill
    """
    from .dist.probe import DEFAULT_SIZES, ProbeConfig

    if plot and not plot.lower().endswith((".png", ".svg")):
        raise UsageError(f"--plot {plot!r}: use a .png or .svg file name")
    launcher = inside_launcher(dict(os.environ))
    if launcher:
        # this process is one rank already (torchrun, srun, or RANK/WORLD_SIZE set by hand): probe it
        from .dist.probe import CONFIG_VAR
        from .dist.probe import main as rank_main

        if os.environ.get(CONFIG_VAR):  # a rank our own launcher started: its options came with it
            cfg = ProbeConfig.from_env()
        else:
            cfg = ProbeConfig(
                backend=backend, timeout=timeout, sizes=sizes or DEFAULT_SIZES, fault=inject, gather=True, report=fmt
            )
        sys.exit(rank_main(cfg))
    from .dist.launch import LaunchOptions, run
    from .dist.report import render

    if nnodes > 1 and node_rank >= nnodes:
        raise UsageError(f"--node-rank {node_rank} is not below --nnodes {nnodes}")
    opts = LaunchOptions(
        nproc=nproc or _default_nproc(),
        nnodes=nnodes,
        node_rank=node_rank,
        endpoint=endpoint,
        backend=backend,
        timeout=timeout,
        sizes=sizes or DEFAULT_SIZES,
        fault=inject,
        log_dir=log_dir,
    )
    with _Status() as status:
        report = run(opts, progress=status.update)
    finish(lambda: render(report, fmt, sys.stdout, plot=plot), 0 if report.ok else 1)


def _default_nproc() -> int:
    """One rank per GPU this process can see (NVML, no CUDA context), else 2."""
    from .facts import GatherContext, gather

    facts = gather(GatherContext(torch=False), sections=["gpu"])
    from .catalogue.gpu import _visible

    n = len(_visible(facts)) if facts.gpu.available else 0
    return n or 2


class _Status:
    """A one-line spinner on stderr while the ranks run (TTY only)."""

    def __enter__(self) -> _Status:
        self.live: Any = None
        if sys.stderr.isatty():
            from rich.console import Console

            self.live = Console(stderr=True).status("starting the launcher...")
            self.live.__enter__()
        return self

    def update(self, text: str) -> None:
        if self.live is not None:
            self.live.update(text)

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)
