"""How many training processes will run on this node: the one answer every check uses.

/dev/shm (TD102), memory (TD204, TD208), pids and RLIMIT_NPROC (TD206, TD209), thread pools
(TD250, TD252, TD253), DataLoader workers (TD570) and GPUs (TD310) all multiply by it, so they must
agree on it for the same job: a Slurm step with 4 tasks per node is 4 processes for every one of
them, never 1 for /dev/shm and 4 for the GPUs.

Where the number comes from, first found wins:

1. ``--nproc-per-node`` (what the user says the run will start);
2. ``LOCAL_WORLD_SIZE``: set by torchrun (and torch's elastic agents) for every rank;
3. ``OMPI_COMM_WORLD_LOCAL_SIZE``: Open MPI's ranks on this node;
4. Slurm: ``SLURM_STEP_TASKS_PER_NODE`` inside ``srun``, else ``SLURM_NTASKS_PER_NODE``
   (``--ntasks-per-node``), else ``SLURM_TASKS_PER_NODE``; the per-node forms (``"4(x2),3"``)
   are read at this node's ``SLURM_NODEID``;
5. nothing: 1 process, an assumption (:attr:`LocalProcesses.known` is False).

Values that are not positive integers are skipped (TD402 reports them). Variables are read from
``host.env``, the process environment the ``host`` gatherer records.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..facts import Facts
from ..options import CheckOptions

_PER_NODE = re.compile(r"\s*(\d+)(?:\(x(\d+)\))?\s*")
#: Launcher variables in the order they are believed (see the module docstring).
SOURCES = (
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
)
_ASSUMED = "assumed: no --nproc-per-node, LOCAL_WORLD_SIZE or Slurm/MPI task count"


@dataclass(frozen=True)
class LocalProcesses:
    """Training processes on this node, and why that many."""

    count: int
    source: str
    """``--nproc-per-node``, the variable it was read from, or why 1 is assumed."""
    known: bool
    """False when nothing said: ``count`` is 1 by assumption."""


def per_node(value: str | None, node: str | None) -> int | None:
    """A Slurm per-node count (``"4"``: on every node; ``"2(x3),1"``: per node) at node number ``node``
    (``SLURM_NODEID``, 0 when unset)."""
    if not value:
        return None
    tokens = value.split(",")
    counts: list[int] = []
    for token in tokens:
        m = _PER_NODE.fullmatch(token)
        if not m:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    if len(tokens) == 1 and "(" not in value:
        return counts[0]  # one number: the same on every node (``--ntasks-per-node=4``)
    index = (node or "0").strip()
    if not index.isdigit():
        return None
    return counts[int(index)] if int(index) < len(counts) else None


def _positive(value: str | None) -> int | None:
    text = (value or "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def from_env(env: Mapping[str, str]) -> LocalProcesses | None:
    """The count the launcher's variables give, or None when none of them does."""
    for name in SOURCES:
        if name.startswith("SLURM_"):
            n = per_node(env.get(name), env.get("SLURM_NODEID"))
        else:
            n = _positive(env.get(name))
        if n is not None and n > 0:
            torchrun = name == "LOCAL_WORLD_SIZE" and "TORCHELASTIC_RUN_ID" in env
            return LocalProcesses(n, name + (" (torchrun)" if torchrun else ""), True)
    return None


def local_processes(facts: Facts, opts: CheckOptions) -> LocalProcesses:
    """Training processes that will run on this node (see the module docstring for the order)."""
    if opts.nproc_per_node:
        return LocalProcesses(max(1, opts.nproc_per_node), "--nproc-per-node", True)
    return from_env(facts.host.env) or LocalProcesses(1, _ASSUMED, False)


__all__ = ["LocalProcesses", "SOURCES", "from_env", "local_processes", "per_node"]
