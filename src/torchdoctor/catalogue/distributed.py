"""TD401-TD406, TD412, TD413: the distributed environment variables, launchers and backends.

Quoted torch error texts were produced on torch 2.13 (tests/fixtures/dist/torch_errors.txt).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from ..facts import Facts
from ..model import Evidence, Severity
from ..options import CheckOptions
from ..registry import Code, Hit, register
from . import PREFLIGHT_VARIANTS
from ._util import ev
from .log_dist import OMPI_MAPPING
from .log_dist import TD405 as _TD405_LOG

ENV_REQUIRED = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
RANKISH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")
TORCH_INTS = (*RANKISH, "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE")
DEBUG_LEVELS = ("OFF", "INFO", "DETAIL")
_PLACEHOLDER = {
    "MASTER_ADDR": "<rank-0 host>",
    "MASTER_PORT": "29500",
    "RANK": "<0..WORLD_SIZE-1>",
    "WORLD_SIZE": "<number of processes>",
}
FREE_PORT = "python -c 'import socket; s=socket.socket(); s.bind((\"\", 0)); print(s.getsockname()[1])'"


def env_of(facts: Facts) -> dict[str, str]:
    return facts.dist.env


def ints_of(facts: Facts) -> dict[str, int]:
    return facts.dist.ints


def env_ev(name: str, value: Any) -> Evidence:
    return ev(name, value, "environment")


def _plural(names: list[str], one: str, many: str) -> str:
    return one if len(names) == 1 else many


def _set(env: dict[str, str], name: str) -> bool:
    """torch treats an empty variable as unset (``if not env_val``)."""
    return bool(env.get(name))


# -- launcher mapping -----------------------------------------------------------------------------


def _launcher_ranks(facts: Facts) -> dict[str, Any] | None:
    """The launcher that started this task (not torchrun) and its own rank variables, if any."""
    ints = ints_of(facts)
    launcher = facts.dist.launcher
    if launcher.torchrun:
        return None
    if launcher.slurm_step and "SLURM_PROCID" in ints:
        size_var = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in ints else "SLURM_NTASKS"
        if size_var in ints:
            return {
                "name": "Slurm",
                "prefix": "SLURM_",
                "rank": "SLURM_PROCID",
                "size": size_var,
                "local": "SLURM_LOCALID",
                "local_size": None,
                "job": env_of(facts).get("SLURM_JOB_ID", "?"),
                "mapping": "srun bash -c 'RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID "
                "exec python train.py'",
                "launch": "srun --ntasks-per-node=1 torchrun --nnodes=$SLURM_NNODES --nproc-per-node=<GPUs per node> "
                "--rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT train.py",
            }
    mpi = launcher.mpi
    if mpi == "openmpi" and "OMPI_COMM_WORLD_RANK" in ints and "OMPI_COMM_WORLD_SIZE" in ints:
        return {
            "name": "Open MPI",
            "prefix": "OMPI_COMM_WORLD_",
            "rank": "OMPI_COMM_WORLD_RANK",
            "size": "OMPI_COMM_WORLD_SIZE",
            "local": "OMPI_COMM_WORLD_LOCAL_RANK",
            "local_size": "OMPI_COMM_WORLD_LOCAL_SIZE",
            "job": "mpirun",
            "mapping": OMPI_MAPPING,
            "launch": "mpirun -np <nodes> --map-by ppr:1:node torchrun --nnodes=<nodes> --nproc-per-node=<GPUs> "
            "--rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT train.py",
        }
    if mpi == "pmi" and "PMI_RANK" in ints and "PMI_SIZE" in ints:
        return {
            "name": "MPICH/Intel MPI",
            "prefix": "PMI_",
            "rank": "PMI_RANK",
            "size": "PMI_SIZE",
            "local": None,
            "local_size": None,
            "job": "mpiexec",
            "mapping": "mpiexec -n N bash -c 'RANK=$PMI_RANK WORLD_SIZE=$PMI_SIZE exec python train.py'",
            "launch": "mpiexec -n <nodes> -ppn 1 torchrun --nnodes=<nodes> --nproc-per-node=<GPUs> "
            "--rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT train.py",
        }
    return None


def _unmapped(facts: Facts) -> dict[str, Any] | None:
    """A multi-task launcher job whose task has no RANK/WORLD_SIZE of torch's own."""
    found, env, ints = _launcher_ranks(facts), env_of(facts), ints_of(facts)
    if not found or ints.get(found["size"], 0) <= 1:
        return None
    if _set(env, "RANK") and _set(env, "WORLD_SIZE"):
        return None
    return found


# -- TD401 ----------------------------------------------------------------------------------------


def _check_incomplete(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    dist, env = facts.dist, env_of(facts)
    if not dist or _unmapped(facts):
        return
    missing = [v for v in ENV_REQUIRED if not _set(env, v)]
    rankish = [v for v in RANKISH if v in env]
    requested = opts.dist or bool(dist.requested)
    if not missing or not (rankish or requested):
        return
    present = [f"{v}={env[v]}" for v in (*ENV_REQUIRED, *RANKISH) if _set(env, v) and v not in missing]
    empty = [v for v in missing if v in env]
    context = (
        f" while {', '.join(dict.fromkeys(present))} {_plural(present, 'is', 'are')} set"
        if present
        else " and no other distributed variable is set (checked because of --dist)"
    )
    evidence = [
        env_ev(v, env[v] if env[v] else "'' (empty)") for v in dict.fromkeys((*ENV_REQUIRED, *RANKISH)) if v in env
    ]
    evidence += [env_ev(v, "not set") for v in missing if v not in env]
    yield Hit(
        {
            "missing": ", ".join(missing),
            "verb": _plural(missing, "is", "are"),
            "context": context,
            "first": missing[0],
            "empty": f" ({', '.join(empty)} set but empty)" if empty else "",
            "exports": " ".join(f"{v}={_PLACEHOLDER[v]}" for v in missing),
        },
        tuple(evidence),
        severity=None if rankish else Severity.WARNING,
    )


TD401 = register(
    Code(
        code="TD401",
        name="dist-env-incomplete",
        family="dist-env",
        severity=Severity.ERROR,
        area="distributed",
        title="env:// rendezvous variables are missing",
        message="{missing} {verb} not set{empty}{context}; init_process_group() with the default env:// method stops "
        "with `environment variable {first} expected, but not set`.",
        fix="Start every rank with torchrun, which sets all four: `torchrun --nproc-per-node=<processes> train.py` (several "
        "nodes: add `--nnodes=<nodes> --rdzv-backend=c10d --rdzv-endpoint=<node0>:29500`); or export them for each "
        "rank before it starts: `export {exports}`.",
        meaning="The env:// rendezvous (the default of init_process_group) reads MASTER_ADDR, MASTER_PORT, RANK and "
        "WORLD_SIZE from the environment and raises as soon as one of them is unset or empty.",
        why="The script was started with plain `python` instead of torchrun, a launcher script exported only some of the "
        "variables, or a variable was set to an empty string.",
        false_positives="Scripts that pass rank= and world_size= to init_process_group, or use init_method='tcp://...' "
        "or 'file://...', need only some of these (or none).",
        related=("TD404", "TD402"),
        check=_check_incomplete,
    )
)


# -- TD402 / TD403 --------------------------------------------------------------------------------


def _check_not_int(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    not_int = facts.dist.not_int
    bad = {k: v for k, v in not_int.items() if k in TORCH_INTS and v != ""}  # empty means unset: TD401
    if not bad:
        return
    names = list(bad)
    yield Hit(
        {
            "vars": ", ".join(f"{k}={v!r}" for k, v in bad.items()),
            "verb": _plural(names, "is not an integer", "are not integers"),
            "first": next(iter(bad.values())),
            "names": " ".join(f"{k}=<integer>" for k in names),
        },
        tuple(env_ev(k, v) for k, v in bad.items()),
    )


TD402 = register(
    Code(
        code="TD402",
        name="dist-rank-not-integer",
        family="dist-env",
        severity=Severity.ERROR,
        area="distributed",
        title="a rank or world-size variable is not an integer",
        message="{vars} {verb}; torch (and scripts) read them with int(), which raises "
        "`ValueError: invalid literal for int() with base 10: '{first}'`.",
        fix="Set them to plain decimal integers (`export {names}`), or let torchrun set them.",
        meaning="RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK are integers; the env:// rendezvous and "
        "nearly every training script convert them with int().",
        why="A launcher template was not expanded (`RANK=$SLURM_PROCID` inside single quotes in the wrong place, "
        "`${RANK}` literally), or a value carries units or a list.",
        false_positives="None known: every consumer of these variables expects an integer.",
        related=("TD403", "TD401"),
        check=_check_not_int,
    )
)


def _range_problems(ints: dict[str, int]) -> Iterator[tuple[str, list[str]]]:
    rank, world = ints.get("RANK"), ints.get("WORLD_SIZE")
    local, local_world = ints.get("LOCAL_RANK"), ints.get("LOCAL_WORLD_SIZE")
    group, group_world = ints.get("GROUP_RANK"), ints.get("GROUP_WORLD_SIZE")
    if world is not None and world < 1:
        yield f"WORLD_SIZE={world} is less than 1", ["WORLD_SIZE"]
    for name, value in (("RANK", rank), ("LOCAL_RANK", local), ("GROUP_RANK", group)):
        if value is not None and value < 0:
            yield f"{name}={value} is negative", [name]
    pairs = (
        ("RANK", rank, "WORLD_SIZE", world),
        ("LOCAL_RANK", local, "LOCAL_WORLD_SIZE", local_world),
        ("GROUP_RANK", group, "GROUP_WORLD_SIZE", group_world),
    )
    for name, value, size_name, size in pairs:
        if value is not None and size is not None and size >= 1 and value >= size:
            yield f"{name}={value} is not below {size_name}={size} (valid: 0..{size - 1})", [name, size_name]
    if local_world is not None and world is not None and world >= 1 and local_world > world:
        yield f"LOCAL_WORLD_SIZE={local_world} is larger than WORLD_SIZE={world}", ["LOCAL_WORLD_SIZE", "WORLD_SIZE"]


def _check_out_of_range(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    ints = ints_of(facts)
    for problem, names in _range_problems(ints):
        yield Hit({"problem": problem}, tuple(env_ev(n, ints[n]) for n in names))


TD403 = register(
    Code(
        code="TD403",
        name="dist-rank-out-of-range",
        family="dist-env",
        severity=Severity.ERROR,
        area="distributed",
        title="a rank is outside its world size",
        message="{problem}; the rendezvous waits for ranks 0..WORLD_SIZE-1 and this process is not one of them, so the job "
        "hangs until the store timeout or fails.",
        fix="Give each process a distinct RANK in 0..WORLD_SIZE-1 and LOCAL_RANK in 0..LOCAL_WORLD_SIZE-1 (torchrun does "
        "this); under Slurm WORLD_SIZE is $SLURM_NTASKS and RANK is $SLURM_PROCID of the same step.",
        meaning="Ranks are numbered from 0; a rank equal to or above the world size (or negative) is never expected by the "
        "others, and rank 0, which hosts the store, may not exist at all.",
        why="WORLD_SIZE was set for one node while ranks were numbered across nodes, ranks counted from 1, or a "
        "hand-written launcher computed RANK = node * GPUs + local with the wrong GPU count.",
        false_positives="None for RANK/WORLD_SIZE; LOCAL_* and GROUP_* are read by scripts and torchrun, not by "
        "init_process_group, so a script that ignores them is unaffected by their values.",
        related=("TD402", "TD405"),
        check=_check_out_of_range,
    )
)


# -- TD404 / TD405 --------------------------------------------------------------------------------


def _check_unmapped(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    found = _unmapped(facts)
    if not found:
        return
    ints, env = ints_of(facts), env_of(facts)
    missing = [v for v in ("RANK", "WORLD_SIZE") if not _set(env, v)]
    yield Hit(
        {
            "launcher": found["name"],
            "rank": ints[found["rank"]],
            "size": ints[found["size"]],
            "job": found["job"],
            "missing": " and ".join(missing),
            "verb": _plural(missing, "is", "are"),
            "prefix": found["prefix"],
            "mapping": found["mapping"],
            "launch": found["launch"],
        },
        (
            env_ev(found["rank"], ints[found["rank"]]),
            env_ev(found["size"], ints[found["size"]]),
            *(env_ev(v, "not set") for v in missing),
        ),
    )


TD404 = register(
    Code(
        code="TD404",
        name="dist-launcher-not-mapped",
        family="dist-env",
        severity=Severity.WARNING,
        area="distributed",
        title="Slurm/MPI task without torch's RANK and WORLD_SIZE",
        message="This is task {rank} of {size} started by {launcher} ({job}), but {missing} {verb} not set: torch's env:// "
        "rendezvous does not read {prefix}* variables.",
        fix="Map the launcher's variables inside each task (single quotes, so every task expands its own): `{mapping}` "
        "with MASTER_ADDR/MASTER_PORT exported before; or start one torchrun per node: `{launch}`.",
        meaning="srun and mpirun number their tasks in their own variables (SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK); "
        "init_process_group() reads only RANK and WORLD_SIZE.",
        why="A script written for torchrun was submitted with srun or mpirun, which do not set torch's variables.",
        false_positives="Frameworks that read the launcher's variables themselves (Lightning's SLURMEnvironment, "
        "submitit, DeepSpeed's MPI discovery), and the 'mpi' backend, need no mapping.",
        related=("TD401", "TD405"),
        check=_check_unmapped,
    )
)


def _check_mismatch(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    found, ints = _launcher_ranks(facts), ints_of(facts)
    if not found or "WORLD_SIZE" not in ints or ints.get(found["size"], 0) < 1:
        return
    tasks, world = ints[found["size"]], ints["WORLD_SIZE"]
    pairs: list[tuple[str, str]] = []
    if world != tasks and (world < tasks or world % tasks):
        pairs.append(("WORLD_SIZE", found["size"]))
    elif world == tasks:  # one rank per task: the numbering must be the launcher's
        pairs += [
            (t, s)
            for t, s in (
                ("RANK", found["rank"]),
                ("LOCAL_RANK", found["local"]),
                ("LOCAL_WORLD_SIZE", found["local_size"]),
            )
            if s and t in ints and s in ints and ints[t] != ints[s]
        ]
    if not pairs:
        return
    hint = ""
    if ints.get("RANK") == 0 and ints.get(found["rank"], 0) != 0 and found["name"] == "Slurm":
        hint = (
            " RANK=0 on a task that is not the first usually means `export RANK=$SLURM_PROCID` ran once in the "
            "batch script, before srun started the tasks, so every task inherited 0."
        )
    yield Hit(
        {
            "launcher": found["name"],
            "diffs": ", ".join(f"{t}={ints[t]} but {s}={ints[s]}" for t, s in pairs),
            "hint": hint,
            "mapping": found["mapping"],
        },
        tuple(e for t, s in pairs for e in (env_ev(t, ints[t]), env_ev(s, ints[s]))),
    )


PREFLIGHT_VARIANTS["TD405"] = replace(
    _TD405_LOG,
    message="{diffs} in this {launcher} task: two tasks may claim the same rank, or the world size differs from the "
    "number of processes started, and the rendezvous hangs.{hint}",
    fix="Derive the variables from the launcher inside each task, not once in the batch script: `{mapping}`; or use "
    "torchrun, which numbers ranks itself.",
    check=_check_mismatch,
    signatures=(),
)


# -- MASTER_PORT ----------------------------------------------------------------------------------


def _check_port_invalid(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    env, ints = env_of(facts), ints_of(facts)
    raw = env.get("MASTER_PORT")
    if not raw:
        return
    port = ints.get("MASTER_PORT")
    if port is None:
        problem = "is not an integer; torch's env:// rendezvous calls int() on it and raises ValueError"
    elif port == 0:
        problem = "asks the OS for any free port, which the other ranks cannot know"
    elif not 1 <= port <= 65535:
        problem = f"is outside 1-65535; torch raises `port must have value from 0 to 65535 but was {port}`"
    else:
        return
    yield Hit({"value": raw, "problem": problem}, (env_ev("MASTER_PORT", raw),))


TD406 = register(
    Code(
        code="TD406",
        name="dist-master-port-invalid",
        family="dist-env",
        severity=Severity.ERROR,
        area="distributed",
        title="MASTER_PORT is not a usable TCP port",
        message="MASTER_PORT={value!r} {problem}.",
        fix="Use a fixed free port in 1024-65535 on rank 0's host, the same for every rank: `export MASTER_PORT=29500` "
        "(a free one: `" + FREE_PORT + "`).",
        meaning="MASTER_PORT is the TCP port of the rendezvous store that rank 0 opens on MASTER_ADDR; every rank must "
        "know the same port in advance.",
        why="A template left a placeholder, a port was computed from a job id without a modulo, or 0 was copied from "
        "torchrun's --standalone (where torchrun, not the user, picks and shares the port).",
        false_positives="A single-process job (WORLD_SIZE=1) works with MASTER_PORT=0.",
        related=("TD407", "TD401"),
        check=_check_port_invalid,
    )
)


# -- backends, debug level -----------------------------------------------------------------------


def _check_nccl_missing(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    torch = facts.torch
    devices = facts.gpu.devices
    if not (facts.dist.active or opts.dist) or not devices or not torch.installed:
        return
    if torch.backends.nccl is not False:
        return
    build = f"CUDA {torch.cuda}" if torch.cuda else "CPU-only build"
    yield Hit(
        {"gpus": len(devices), "version": torch.version or "?", "build": build},
        (
            ev("GPUs", len(devices), "gpu.devices (NVML)"),
            ev("torch", f"{torch.version} ({build})", "torch/version.py"),
            ev("nccl backend", False, torch.backends_source or "torch library folder"),
        ),
    )


TD412 = register(
    Code(
        code="TD412",
        name="dist-nccl-unavailable",
        family="dist-env",
        severity=Severity.WARNING,
        area="distributed",
        title="GPUs present but this torch build has no NCCL",
        message="This host has {gpus} GPU(s) but torch {version} ({build}) has no NCCL backend: "
        "init_process_group('nccl') fails, and 'gloo' runs collectives far slower.",
        fix="Install a CUDA build of torch (`pip install torch --index-url https://download.pytorch.org/whl/cu124`, "
        "matching your driver), or use backend='gloo' knowingly for a CPU job.",
        meaning="NCCL ships only in CUDA builds of torch; a CPU-only wheel on a GPU node cannot use the GPUs at all.",
        why="pip resolved the CPU wheel (a CPU index URL, a pinned +cpu version, or a platform without CUDA wheels).",
        false_positives="A job that trains on CPU on purpose on a GPU node needs only gloo.",
        related=("TD401",),
        check=_check_nccl_missing,
    )
)


def _check_debug_level(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    env = env_of(facts)
    if "TORCH_DISTRIBUTED_DEBUG" not in env or env["TORCH_DISTRIBUTED_DEBUG"].upper() in DEBUG_LEVELS:
        return
    value = env["TORCH_DISTRIBUTED_DEBUG"]
    yield Hit({"value": value}, (env_ev("TORCH_DISTRIBUTED_DEBUG", value),))


TD413 = register(
    Code(
        code="TD413",
        name="dist-debug-level-invalid",
        family="dist-env",
        severity=Severity.ERROR,
        area="distributed",
        title="TORCH_DISTRIBUTED_DEBUG has a value torch rejects",
        message="TORCH_DISTRIBUTED_DEBUG={value!r} is not OFF, INFO or DETAIL; `import torch` fails with `ValueError: "
        "The value of TORCH_DISTRIBUTED_DEBUG must be OFF, INFO, or DETAIL.`",
        fix="`export TORCH_DISTRIBUTED_DEBUG=DETAIL` (or INFO, or OFF), or `unset TORCH_DISTRIBUTED_DEBUG`.",
        meaning="torch.distributed reads this variable while it is imported (torch imports it itself) and accepts only "
        "OFF, INFO or DETAIL, in any case; an empty value or surrounding spaces are rejected too.",
        why="A boolean-style value (1, true) or a typo (DETAILED).",
        false_positives="None known on torch 2.x.",
        related=("TD401",),
        check=_check_debug_level,
    )
)
