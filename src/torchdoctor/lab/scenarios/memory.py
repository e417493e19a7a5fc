"""host-oom: a per-process memory limit (RLIMIT_AS / RLIMIT_DATA) smaller than what the run allocates.

The limit is set inside the child only. It must be set *after* ``import torch``: torch's shared
libraries and thread pools need several hundred MB of address space to load at all, so a limit set
before the import fails there instead (see ``oom-rlimit-before-import``).
"""

from __future__ import annotations

from .. import scenario
from ..predict import Prediction

MiB = 1024 * 1024
#: The limit each scenario sets (address space of the whole process, libraries included).
LIMIT = 2048 * MiB
#: What the failing variant asks for: twice the limit, so the failure is certain.
TOO_MUCH = 4096 * MiB
#: What the fixed variant asks for: well inside the limit, with torch itself loaded.
FITS = 256 * MiB
#: A limit below what loading libtorch_cpu.so needs (it maps ~400 MB of segments on torch 2.13 CPU).
IMPORT_LIMIT = 300 * MiB


def _limit(resource_name: str, limit: int) -> None:
    import resource

    which = getattr(resource, resource_name)
    resource.setrlimit(which, (limit, limit))


def _allocate_tensor(resource_name: str, fixed: bool) -> None:
    import torch  # first: the limit is applied once torch is loaded

    _limit(resource_name, LIMIT)
    nbytes = FITS if fixed else TOO_MUCH
    x = torch.empty(nbytes, dtype=torch.uint8)
    x.fill_(1)  # touch it: the fixed variant really uses the memory
    print(f"allocated {x.numel() // MiB} MiB under {resource_name}={LIMIT // MiB} MiB")


@scenario(
    name="oom-rlimit-as",
    predict=Prediction("check", rlimits=(("AS", LIMIT),)),
    family="host-oom",
    code="TD270",
    summary=f"RLIMIT_AS of {LIMIT // MiB} MiB set after import torch, then a {TOO_MUCH // MiB} MiB CPU tensor: "
    "'DefaultCPUAllocator: can't allocate memory'",
    fix=f"allocate less than the limit ({FITS // MiB} MiB), or remove the limit (ulimit -v unlimited)",
    seconds=2.5,
    timeout=60.0,
    memory_mb=1024,
)
def oom_rlimit_as(fixed: bool) -> None:
    _allocate_tensor("RLIMIT_AS", fixed)


@scenario(
    name="oom-rlimit-data",
    predict=Prediction("check", rlimits=(("DATA", LIMIT),)),
    family="host-oom",
    code="TD270",
    summary=f"RLIMIT_DATA of {LIMIT // MiB} MiB set after import torch, then a {TOO_MUCH // MiB} MiB CPU tensor: "
    "'DefaultCPUAllocator: can't allocate memory'",
    fix=f"allocate less than the limit ({FITS // MiB} MiB), or remove the limit (ulimit -d unlimited)",
    seconds=2.5,
    timeout=60.0,
    memory_mb=1024,
)
def oom_rlimit_data(fixed: bool) -> None:
    _allocate_tensor("RLIMIT_DATA", fixed)


@scenario(
    name="oom-python-memoryerror",
    predict=Prediction("check", rlimits=(("AS", LIMIT),)),
    family="host-oom",
    code="TD271",
    summary=f"RLIMIT_AS of {LIMIT // MiB} MiB, then a {TOO_MUCH // MiB} MiB Python bytearray: a bare 'MemoryError'",
    fix=f"allocate less than the limit ({FITS // MiB} MiB), or remove the limit",
    needs=(),
    seconds=0.2,
    timeout=30.0,
    memory_mb=1024,
)
def oom_python_memoryerror(fixed: bool) -> None:
    _limit("RLIMIT_AS", LIMIT)
    buf = bytearray(FITS if fixed else TOO_MUCH)
    print(f"allocated {len(buf) // MiB} MiB under RLIMIT_AS={LIMIT // MiB} MiB")


@scenario(
    name="oom-rlimit-before-import",
    predict=Prediction("check", ("--no-torch",), rlimits=(("AS", IMPORT_LIMIT),)),
    family="host-oom",
    code="TD272",
    summary=f"RLIMIT_AS of {IMPORT_LIMIT // MiB} MiB set before import torch: the dynamic loader cannot map "
    "libtorch_cpu.so ('failed to map segment from shared object')",
    fix="set memory limits after the libraries are loaded, or make them large enough for torch itself "
    f"(it fits in {LIMIT // MiB} MiB)",
    seconds=1.0,
    timeout=60.0,
    memory_mb=1024,
)
def oom_rlimit_before_import(fixed: bool) -> None:
    _limit("RLIMIT_AS", LIMIT if fixed else IMPORT_LIMIT)
    import torch

    print(f"torch {torch.__version__} loaded; sum={torch.ones(8).sum().item()}")


# -- thread-oversubscription ------------------------------------------------------------------------
NOBODY = 65534
#: Tasks RLIMIT_NPROC leaves the scenario's user beyond those it already has: a process and a few threads.
NPROC_ROOM = 6
#: Threads the failing variant asks torch's OpenMP pool for: more than NPROC_ROOM leaves room for.
POOL_THREADS = 16


def _user_tasks(uid: int) -> int:
    """Tasks (threads) the user already has on this host: RLIMIT_NPROC counts all of them."""
    import psutil

    count = 0
    for p in psutil.process_iter(["uids", "num_threads"]):
        try:
            if p.info["uids"] and p.info["uids"].real == uid:
                count += p.info["num_threads"] or 1
        except psutil.Error:
            continue
    return count


def _run_as_nobody_with_nproc(name: str, fixed: bool, room: int = NPROC_ROOM) -> None:
    """As root: re-run this scenario as an unprivileged user whose RLIMIT_NPROC leaves room for a few tasks only."""
    import resource
    import subprocess
    import sys

    limit = _user_tasks(NOBODY) + room

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))

    argv = [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        "--",
        sys.executable,
        "-m",
        "torchdoctor.lab.child",
        name,
        *(["--fixed"] if fixed else []),
    ]
    print(f"RLIMIT_NPROC={limit} for uid {NOBODY}", flush=True)
    proc = subprocess.run(argv, preexec_fn=lower, cwd="/", check=False)  # noqa: S603 - argv list, no shell
    sys.exit(proc.returncode if proc.returncode >= 0 else 128 - proc.returncode)  # a signal: as a shell reports it


@scenario(
    name="threads-nproc-limit",
    family="thread-oversubscription",
    code="TD280",
    summary=f"an unprivileged process whose RLIMIT_NPROC leaves room for {NPROC_ROOM} tasks runs a matmul on a "
    f"{POOL_THREADS}-thread OpenMP pool: 'libgomp: Thread creation failed'",
    fix="torch.set_num_threads(1) (OMP_NUM_THREADS=1): no pool threads to create",
    needs=("torch", "root", "setpriv"),
    seconds=3.0,
    timeout=60.0,
    memory_mb=1024,
)
def threads_nproc_limit(fixed: bool) -> None:
    import os

    if os.geteuid() == 0:
        _run_as_nobody_with_nproc("threads-nproc-limit", fixed)
    import torch

    torch.set_num_threads(1 if fixed else POOL_THREADS)
    a = torch.ones(512, 512)
    print(f"matmul on {torch.get_num_threads()} thread(s): {(a @ a).sum().item()}")


#: The growing variant adds one OpenMP thread this often, with room for NPROC_GROWTH_ROOM tasks.
THREAD_EVERY = 0.15
NPROC_GROWTH_ROOM = 24


@scenario(
    name="threads-nproc-growth",
    family="thread-oversubscription",
    code="TD280",
    summary=f"an unprivileged process whose RLIMIT_NPROC leaves room for {NPROC_GROWTH_ROOM} tasks grows torch's "
    f"OpenMP pool by one thread every {THREAD_EVERY:g} s (a matmul after each): 'libgomp: Thread creation failed' "
    "once the room is used up",
    fix="a fixed, small pool: torch.set_num_threads(4) (OMP_NUM_THREADS=4)",
    needs=("torch", "root", "setpriv"),
    seconds=5.0,
    timeout=60.0,
    memory_mb=1024,
)
def threads_nproc_growth(fixed: bool) -> None:
    import os
    import time

    if os.geteuid() == 0:
        _run_as_nobody_with_nproc("threads-nproc-growth", fixed, room=NPROC_GROWTH_ROOM)
    import torch

    a = torch.ones(256, 256)
    for k in range(1, 4 * NPROC_GROWTH_ROOM):
        torch.set_num_threads(min(k, 4) if fixed else k)
        (a @ a).sum().item()
        time.sleep(THREAD_EVERY)
    print(f"matmul on up to {torch.get_num_threads()} thread(s)")


# -- growth: memory that builds up until the limit (what watch can see coming) -----------------------

#: How much the growing variant adds, and how often: about 320 MiB/s, so the limit comes in seconds.
STEP = 16 * MiB
STEP_EVERY = 0.05


@scenario(
    name="oom-rlimit-as-growth",
    predict=Prediction("check", rlimits=(("AS", LIMIT),)),
    family="host-oom",
    code="TD270",
    summary=f"RLIMIT_AS of {LIMIT // MiB} MiB set after import torch, then {STEP // MiB} MiB tensors kept every "
    f"{STEP_EVERY:g} s (a leak): 'DefaultCPUAllocator: can't allocate memory' once the address space is used up",
    fix="keep less (release what the loop no longer needs), or remove the limit (ulimit -v unlimited)",
    seconds=4.0,
    timeout=60.0,
    memory_mb=3072,
)
def oom_rlimit_as_growth(fixed: bool) -> None:
    import time

    import torch

    _limit("RLIMIT_AS", LIMIT)
    kept = []
    for i in range(4 * LIMIT // STEP):
        x = torch.empty(STEP, dtype=torch.uint8)
        x.fill_(1)
        if fixed:
            kept = [x]  # the fix: only the newest is kept
        else:
            kept.append(x)
        time.sleep(STEP_EVERY)
        if fixed and i > LIMIT // STEP + 8:
            break
    print(f"kept {len(kept)} tensors of {STEP // MiB} MiB under RLIMIT_AS={LIMIT // MiB} MiB")
