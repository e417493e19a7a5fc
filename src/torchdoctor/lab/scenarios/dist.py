"""Distributed rendezvous and collectives on gloo, over loopback only, never with torch's 30-minute default timeout.

Rendezvous that is meant to fail uses a timeout of seconds; when every rank is started, joining may
take up to a minute (a loaded machine) and the collectives run on a group with a 4 s timeout.

Ranks are started the way users start them: ``torch.multiprocessing`` (``start_processes``) or
``torchrun`` (``python -m torch.distributed.run``), never by a launcher of our own. Under torchrun
the ranks run this module: ``python -m torchdoctor.lab.scenarios.dist MODE``.

Modes (what rank 1 does differently; rank 0 always joins and calls all_reduce):
``ok`` nothing; ``killed`` SIGKILLs itself after joining; ``hang`` sleeps past the collective timeout;
``oom`` runs out of memory under RLIMIT_AS; ``shape`` all_reduces a tensor of another shape;
``order`` calls broadcast where rank 0 calls all_reduce.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys

from ...facts.dist_env import free_port
from .. import scenario
from ..predict import FREE_PORT, Prediction

#: Timeout of the collectives (a separate group, torch's default is 30 minutes): what rank 0 waits for a hung peer.
TIMEOUT_S = 4.0
#: Rendezvous timeout when every rank is started: generous, so a loaded machine never fails a fixed variant.
JOIN_TIMEOUT_S = 60.0
#: Rendezvous-only scenarios fail at the store: a shorter timeout is enough.
STORE_TIMEOUT_S = 3.0
#: A client retries its connection once after the timeout (plus a random delay): keep each attempt short.
CONNECT_TIMEOUT_S = 1.5
#: How long rank 1 sleeps in ``hang``: past the collective timeout.
HANG_S = 30.0
#: After the first rank fails, how long torch.multiprocessing lets the others end on their own.
GRACE_S = 3.0
ENV_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
LOOPBACK = "127.0.0.1"
#: Keep gloo's own connections on the loopback interface.
DIST_ENV = {"GLOO_SOCKET_IFNAME": "lo"}
MiB = 1024 * 1024


def _timeout(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def _collective(rank: int, mode: str) -> None:
    """What every rank does once the default group exists; rank 1 misbehaves according to ``mode``.

    The collectives run on a group of their own with the short :data:`TIMEOUT_S`, so joining may
    take long on a loaded machine while a hung peer is still noticed within seconds.
    """
    import signal
    import time

    import torch
    import torch.distributed as dist

    group = dist.new_group(timeout=_timeout(TIMEOUT_S))
    if rank == 1 and mode == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 1 and mode == "hang":
        time.sleep(HANG_S)
    if rank == 1 and mode == "oom":
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (2048 * MiB, 2048 * MiB))
        torch.empty(4096 * MiB, dtype=torch.uint8)
    t = torch.ones(5 if (rank == 1 and mode == "shape") else 4)
    if rank == 1 and mode == "order":
        dist.broadcast(t, src=0, group=group)
        dist.all_reduce(t, group=group)
    else:
        dist.all_reduce(t, group=group)
        if mode == "order":
            dist.broadcast(t, src=0, group=group)
    sys.stdout.write(f"rank {rank}: all_reduce gave {t.tolist()}\n")  # one write: ranks share stdout
    sys.stdout.flush()


def _spawned_rank(rank: int, world: int, port: int, mode: str) -> None:
    """One rank under torch.multiprocessing; logs its own traceback (as a training script's logger would)."""
    import traceback

    import torch.distributed as dist

    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{LOOPBACK}:{port}",
            rank=rank,
            world_size=world,
            timeout=_timeout(JOIN_TIMEOUT_S),
        )
        _collective(rank, mode)
        dist.destroy_process_group()
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
        sys.exit(1)


def _spawn(mode: str, world: int = 2) -> None:
    import torch.multiprocessing as mp

    ctx = mp.start_processes(
        _spawned_rank, args=(world, free_port(), mode), nprocs=world, join=False, start_method="spawn"
    )
    while not ctx.join(grace_period=GRACE_S):
        pass


def _set_env(**values: str) -> None:
    """The env:// variables for this (child) process only; the other ones are removed."""
    for name in ENV_VARS:
        os.environ.pop(name, None)
    os.environ.update(values)


def _init_env(timeout_s: float = STORE_TIMEOUT_S) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://", timeout=_timeout(timeout_s))


# -- dist-env: a variable of env:// missing ----------------------------------------------------------


def _env_missing(missing: str, fixed: bool) -> None:
    import torch
    import torch.distributed as dist

    values = {"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1"}
    if not fixed:
        del values[missing]
    _set_env(**values)
    _init_env()
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.destroy_process_group()
    print(f"single-rank group: all_reduce gave {t.tolist()}")


def _declare_env_missing(var: str) -> None:
    slug = var.lower().replace("_", "-")

    @scenario(
        name=f"dist-env-missing-{slug}",
        family="dist-env",
        code="TD450",
        summary=f"init_process_group('gloo', init_method='env://') with {var} unset: "
        f"'environment variable {var} expected, but not set'",
        fix="set all four variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), as torchrun does",
        predict=Prediction(
            "check",
            ("--dist",),
            env=tuple(
                (k, v)
                for k, v in (("MASTER_ADDR", LOOPBACK), ("MASTER_PORT", FREE_PORT), ("RANK", "0"), ("WORLD_SIZE", "1"))
                if k != var
            ),
        ),
        seconds=2.0,
        timeout=60.0,
        memory_mb=1024,
        env=DIST_ENV,
    )
    def body(fixed: bool) -> None:
        _env_missing(var, fixed)


for _var in ENV_VARS:
    _declare_env_missing(_var)


# -- dist-port: MASTER_PORT already bound ------------------------------------------------------------


@scenario(
    name="dist-port-in-use",
    family="dist-port",
    code="TD451",
    summary="rank 0's store on a MASTER_PORT that another socket (opened by the body on 127.0.0.1) listens on: "
    "'failed to listen on any local network address ... EADDRINUSE'",
    fix="a free port (found by binding port 0) for MASTER_PORT",
    seconds=2.0,
    timeout=60.0,
    memory_mb=1024,
    env=DIST_ENV,
)
def dist_port_in_use(fixed: bool) -> None:
    import torch.distributed as dist

    holder = socket.socket()
    holder.bind((LOOPBACK, 0))
    holder.listen(1)
    try:
        port = free_port() if fixed else holder.getsockname()[1]
        _set_env(MASTER_ADDR=LOOPBACK, MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
        _init_env()
        dist.destroy_process_group()
        print(f"store listening on port {port}")
    finally:
        holder.close()


# -- dist-connect: ranks missing, no master ----------------------------------------------------------


@scenario(
    name="dist-rank0-alone",
    predict=Prediction(
        "dist",
        ("--timeout", "3"),
        env=(("MASTER_ADDR", LOOPBACK), ("MASTER_PORT", FREE_PORT), ("RANK", "0"), ("WORLD_SIZE", "2")),
    ),
    family="dist-connect",
    code="TD452",
    summary=f"rank 0 of WORLD_SIZE=2 starts alone; its store waits {STORE_TIMEOUT_S:g} s for the other rank: "
    "'Timed out after N seconds waiting for clients. 1/2 clients joined.'",
    fix="start every rank (torch.multiprocessing.start_processes with nprocs=WORLD_SIZE)",
    seconds=6.0,
    timeout=90.0,
    memory_mb=1536,
    env=DIST_ENV,
)
def dist_rank0_alone(fixed: bool) -> None:
    if fixed:
        _spawn("ok")
        return
    _set_env(MASTER_ADDR=LOOPBACK, MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="2")
    _init_env()


@scenario(
    name="dist-no-master",
    predict=Prediction(
        "dist",
        ("--timeout", "3"),
        env=(("MASTER_ADDR", LOOPBACK), ("MASTER_PORT", FREE_PORT), ("RANK", "1"), ("WORLD_SIZE", "2")),
    ),
    family="dist-connect",
    code="TD453",
    summary=f"rank 1 of 2 starts while nothing listens on MASTER_ADDR:MASTER_PORT (127.0.0.1); it tries twice for "
    f"{CONNECT_TIMEOUT_S:g} s: 'The client socket has timed out after ...ms while trying to connect to'",
    fix="start every rank, rank 0 included (torch.multiprocessing.start_processes with nprocs=WORLD_SIZE)",
    seconds=8.0,
    timeout=90.0,
    memory_mb=1536,
    env=DIST_ENV,
)
def dist_no_master(fixed: bool) -> None:
    if fixed:
        _spawn("ok")
        return
    _set_env(MASTER_ADDR=LOOPBACK, MASTER_PORT=str(free_port()), RANK="1", WORLD_SIZE="2")
    _init_env(CONNECT_TIMEOUT_S)


# -- dist-hang: a peer dies or hangs (torch.multiprocessing) -----------------------------------------


@scenario(
    name="dist-peer-killed",
    family="dist-hang",
    code="TD454",
    summary="two ranks under torch.multiprocessing; rank 1 is SIGKILLed before all_reduce: the survivor reports "
    "'Connection closed by peer', the parent 'process 1 terminated with signal SIGKILL'",
    fix="the peer survives (no kill): find and fix the first rank that died; its own error is the root cause",
    seconds=8.0,
    timeout=90.0,
    memory_mb=1536,
    env=DIST_ENV,
)
def dist_peer_killed(fixed: bool) -> None:
    _spawn("ok" if fixed else "killed")


@scenario(
    name="dist-peer-hangs",
    family="dist-hang",
    code="TD455",
    summary=f"two ranks under torch.multiprocessing; rank 1 sleeps instead of calling all_reduce: rank 0 gives up "
    f"after {TIMEOUT_S:g} s ('Timed out waiting ...ms for recv operation to complete')",
    fix="every rank reaches the collective (no sleep); find the rank that did not",
    seconds=10.0,
    timeout=90.0,
    memory_mb=1536,
    env=DIST_ENV,
    slow=True,
)
def dist_peer_hangs(fixed: bool) -> None:
    _spawn("ok" if fixed else "hang")


# -- the same under torchrun ---------------------------------------------------------------------------


def _torchrun(mode: str, extra_env: dict[str, str] | None = None) -> None:
    """Replace this child with torchrun starting two ranks of this module (one node, c10d rendezvous on loopback)."""
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{LOOPBACK}:{free_port()}",
        "--max-restarts",
        "0",
        "-m",
        "torchdoctor.lab.scenarios.dist",
        mode,
    ]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, {**os.environ, **DIST_ENV, **(extra_env or {})})


@scenario(
    name="torchrun-peer-killed",
    family="dist-hang",
    code="TD454",
    summary="torchrun, two ranks; rank 1 is SIGKILLed before all_reduce: rank 0 'Connection closed by peer', "
    "torchrun's ChildFailedError names rank 1 (exitcode -9) as the first failure",
    fix="the peer survives (no kill): find and fix the first rank that died; its own error is the root cause",
    seconds=6.0,
    timeout=90.0,
    memory_mb=1536,
    env=DIST_ENV,
    slow=True,
)
def torchrun_peer_killed(fixed: bool) -> None:
    _torchrun("ok" if fixed else "killed")


@scenario(
    name="torchrun-peer-hangs",
    family="dist-hang",
    code="TD455",
    summary=f"torchrun, two ranks; rank 1 sleeps instead of calling all_reduce: rank 0 times out after "
    f"{TIMEOUT_S:g} s, torchrun's ChildFailedError names rank 0",
    fix="every rank reaches the collective (no sleep); find the rank that did not",
    seconds=9.0,
    timeout=90.0,
    memory_mb=1536,
    env=DIST_ENV,
    slow=True,
)
def torchrun_peer_hangs(fixed: bool) -> None:
    _torchrun("ok" if fixed else "hang")


@scenario(
    name="torchrun-peer-oom",
    family="host-oom",
    code="TD270",
    summary="torchrun, two ranks; rank 1 runs out of memory (RLIMIT_AS) before all_reduce: its "
    "'DefaultCPUAllocator' error is the root cause, rank 0's 'Connection closed by peer' a cascade",
    fix="rank 1 allocates within its memory (no oversized tensor)",
    seconds=7.0,
    timeout=90.0,
    memory_mb=1536,
    env=DIST_ENV,
    slow=True,
)
def torchrun_peer_oom(fixed: bool) -> None:
    _torchrun("ok" if fixed else "oom")


# -- rank-divergence: collectives that do not match -----------------------------------------------------


@scenario(
    name="dist-collective-shape-mismatch",
    family="rank-divergence",
    code="TD456",
    summary="torchrun, TORCH_DISTRIBUTED_DEBUG=DETAIL; rank 0 all_reduces 4 elements, rank 1 five: "
    "'Detected mismatch between collectives on ranks'",
    fix="the same tensor shape on every rank",
    seconds=8.0,
    timeout=90.0,
    memory_mb=1536,
    env={**DIST_ENV, "TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
)
def dist_collective_shape_mismatch(fixed: bool) -> None:
    _torchrun("ok" if fixed else "shape")


@scenario(
    name="dist-collective-order-mismatch",
    family="rank-divergence",
    code="TD456",
    summary="torchrun, TORCH_DISTRIBUTED_DEBUG=DETAIL; rank 0 calls all_reduce then broadcast, rank 1 the other "
    "way round: 'Detected mismatch between collectives on ranks'",
    fix="the same collectives in the same order on every rank",
    seconds=8.0,
    timeout=90.0,
    memory_mb=1536,
    env={**DIST_ENV, "TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
    slow=True,
)
def dist_collective_order_mismatch(fixed: bool) -> None:
    _torchrun("ok" if fixed else "order")


def _torchrun_rank(mode: str) -> None:
    """A rank started by torchrun: env:// from the variables torchrun sets."""
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=_timeout(JOIN_TIMEOUT_S))
    _collective(dist.get_rank(), mode)
    dist.destroy_process_group()


if __name__ == "__main__":
    _torchrun_rank(sys.argv[1])
