"""The distributed environment: launcher variables, MASTER_ADDR/MASTER_PORT, socket interfaces.

Everything is read from ``ctx.env`` (never ``os.environ`` directly). When the process looks like a
rank (or ``--dist`` was given) MASTER_ADDR is resolved with a bounded ``getaddrinfo``; when this
host would run the rendezvous store (rank 0, or MASTER_ADDR is one of its addresses) MASTER_PORT
is test-bound the way TCPStore binds it (wildcard address, SO_REUSEADDR) and released at once.
Nothing here connects anywhere: no packet leaves this machine.
"""

from __future__ import annotations

import errno as errno_mod
import ipaddress
import os
import re
import socket
import threading
import time
from typing import Any

from .context import GatherContext
from .redact import is_secret_name, redact_argv, redact_text

#: Variables torch's launchers set for every rank (torchrun sets all of them).
TORCH_RANK_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
)
#: What ``init_process_group(init_method="env://")`` reads (torch/distributed/rendezvous.py).
ENV_REQUIRED = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
TORCHRUN_VARS = (
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
)
SLURM_VARS = (
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NNODES",
    "SLURM_JOB_NUM_NODES",
    "SLURM_STEP_NUM_NODES",
    "SLURM_NODEID",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
    "SLURM_STEP_NODELIST",
    "SLURMD_NODENAME",
)
MPI_VARS = (
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
)
IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
OTHER_VARS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCH_DISTRIBUTED_DEBUG",
    "NCCL_DEBUG",
    "GLOO_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
)
_PREFIXES = ("NCCL_", "TORCH_NCCL_")

INT_VARS = (
    *TORCH_RANK_VARS,
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_LOCALID",
    "SLURM_NNODES",
    "SLURM_JOB_NUM_NODES",
    "SLURM_STEP_NUM_NODES",
    "SLURM_NODEID",
    *MPI_VARS,
)
#: Presence of any of these means "this process is (or is about to start) a distributed job".
ACTIVE_VARS = (
    *TORCH_RANK_VARS,
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
)

RESOLVE_TIMEOUT = 2.0
_INT_RE = re.compile(r"\s*[+-]?\d+\s*")


def gather(ctx: GatherContext) -> dict[str, Any]:
    env = _dist_env(ctx)
    ints, not_int = _parse_ints(env)
    because = [name for name in ACTIVE_VARS if name in env]
    if _slurm_multi_task(ints):
        because.append("SLURM_NTASKS>1")
    if ctx.dist:
        because.append("--dist")
    out: dict[str, Any] = {
        "active": bool(because),
        "active_because": because,
        "requested": ctx.dist,
        "env": env,
        "ints": ints,
        "not_int": not_int,
        "launcher": _launcher(env, ints),
        "hostname": socket.gethostname(),
        "master": None,
        "store": None,
        "interfaces": None,
    }
    if out["active"] or any(name in env for name in IFNAME_VARS):
        out["interfaces"] = _interfaces(ctx)
    if not out["active"]:
        return out
    if "MASTER_ADDR" in env:
        out["master"] = _master(ctx, env["MASTER_ADDR"], out["interfaces"], out["hostname"])
    port = ints.get("MASTER_PORT")
    if port is not None and 1 <= port <= 65535:
        out["store"] = _store(ctx, port, _own_rank(ints, out["launcher"]), out["master"])
    return out


# -- environment ----------------------------------------------------------------------------------


def _dist_env(ctx: GatherContext) -> dict[str, str]:
    """Every distributed-related variable that is set, raw (secret-looking names are left out)."""
    known = set(TORCH_RANK_VARS + TORCHRUN_VARS + SLURM_VARS + MPI_VARS + OTHER_VARS)
    out: dict[str, str] = {}
    for name, value in ctx.env.items():
        if (name in known or name.startswith(_PREFIXES)) and not is_secret_name(name):
            out[name] = redact_text(str(value))
    return dict(sorted(out.items()))


def _parse_ints(env: dict[str, str]) -> tuple[dict[str, int], dict[str, str]]:
    ints: dict[str, int] = {}
    bad: dict[str, str] = {}
    for name in INT_VARS:
        if name not in env:
            continue
        if _INT_RE.fullmatch(env[name]):
            ints[name] = int(env[name])
        else:
            bad[name] = env[name]
    return ints, bad


def _slurm_multi_task(ints: dict[str, int]) -> bool:
    tasks = ints.get("SLURM_STEP_NUM_TASKS", ints.get("SLURM_NTASKS"))
    return "SLURM_PROCID" in ints and tasks is not None and tasks > 1


def _own_rank(ints: dict[str, int], launcher: dict[str, Any]) -> tuple[str, int] | None:
    """This process's global rank: torch's RANK, else the launcher's task number."""
    names = ["RANK"]
    if launcher.get("slurm_step"):
        names.append("SLURM_PROCID")
    names += ["OMPI_COMM_WORLD_RANK", "PMI_RANK"]
    return next(((n, ints[n]) for n in names if n in ints), None)


def _launcher(env: dict[str, str], ints: dict[str, int]) -> dict[str, Any]:
    return {
        "torchrun": "TORCHELASTIC_RUN_ID" in env,
        "agent_store": env.get("TORCHELASTIC_USE_AGENT_STORE", "").strip().lower() == "true",
        "slurm": "SLURM_JOB_ID" in env,
        "slurm_step": "SLURM_STEP_ID" in env or "SLURM_STEP_NUM_TASKS" in env,
        "mpi": "openmpi" if "OMPI_COMM_WORLD_RANK" in env else ("pmi" if "PMI_RANK" in env else None),
    }


# -- MASTER_ADDR ----------------------------------------------------------------------------------


def resolve(host: str, timeout: float = RESOLVE_TIMEOUT) -> dict[str, Any]:
    """``getaddrinfo(host)`` in a daemon thread, abandoned after ``timeout`` seconds."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            box["addresses"] = sorted({str(info[4][0]).split("%")[0] for info in infos})
        except OSError as exc:
            box["error"] = str(exc)
            box["errno"] = exc.errno
        except Exception as exc:  # noqa: BLE001 - a broken resolver is an unknown, not a crash
            box["error"] = f"{type(exc).__name__}: {exc}"

    started = time.monotonic()
    thread = threading.Thread(target=work, name="torchdoctor-resolve", daemon=True)
    thread.start()
    thread.join(timeout)
    out: dict[str, Any] = {
        "addresses": box.get("addresses"),
        "error": box.get("error"),
        "errno": box.get("errno"),
        "timed_out": thread.is_alive(),
        "seconds": round(time.monotonic() - started, 3),
    }
    if out["timed_out"]:
        out["error"] = f"no answer within {timeout:g} s"
    return out


def _master(ctx: GatherContext, host: str, interfaces: dict[str, Any] | None, hostname: str) -> dict[str, Any]:
    out: dict[str, Any] = {"addr": host, **resolve(host)}
    addrs = out["addresses"]
    if not addrs:
        ctx.unknown("dist.master.is_local", f"MASTER_ADDR={host!r} did not resolve: {out['error']}")
        out.update(loopback=None, is_local=None, local_because=None)
        return out
    local = {a for iface in (interfaces or {}).get("names", {}).values() for a in iface.get("addresses", [])}
    loop = [a for a in addrs if _is_loopback(a)]
    out["loopback"] = len(loop) == len(addrs)
    matched = sorted(set(addrs) & local)
    if loop:
        out["is_local"], out["local_because"] = True, f"{loop[0]} is a loopback address"
    elif matched:
        out["is_local"], out["local_because"] = True, f"{matched[0]} is an address of this host"
    elif host.split(".")[0] == hostname.split(".")[0]:
        out["is_local"], out["local_because"] = True, f"{host} is this host's name"
    elif interfaces is None:
        out["is_local"], out["local_because"] = None, None
        ctx.unknown("dist.master.is_local", "the addresses of this host could not be listed")
    else:
        out["is_local"], out["local_because"] = False, None
    return out


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


# -- MASTER_PORT ----------------------------------------------------------------------------------


def _store(
    ctx: GatherContext, port: int, rank: tuple[str, int] | None, master: dict[str, Any] | None
) -> dict[str, Any]:
    """Would the rendezvous store be able to listen on ``port`` here? Bound and released at once.

    Only the process that will open the store is tested: rank 0, or (before launch, no rank yet)
    any process on the host MASTER_ADDR names. Another rank would find rank 0's store there.
    """
    master_local = bool(master and master.get("is_local"))
    if rank is not None:
        this_host, why = rank[1] == 0, f"{rank[0]}={rank[1]}"
    else:
        this_host, why = master_local, "MASTER_ADDR is this host" if master_local else "MASTER_ADDR is another host"
    out: dict[str, Any] = {
        "port": port,
        "this_host": this_host,
        "tested": False,
        "why": why,
        "bind": [],
        "in_use": None,
        "holder": None,
    }
    if not out["this_host"]:
        return out
    addresses = ["::", "0.0.0.0"]  # TCPStore listens on the wildcard (dual-stack '::' first)
    for addr in (master or {}).get("addresses") or []:
        if master_local and addr not in addresses:
            addresses.append(addr)
    out["bind"] = [try_bind(addr, port) for addr in addresses]
    out["tested"] = True
    # No IPv6 in this kernel, or a resolved address that is not ours: those attempts say nothing.
    tried = [b for b in out["bind"] if b["errno"] not in (errno_mod.EAFNOSUPPORT, errno_mod.EADDRNOTAVAIL)]
    out["in_use"] = any(b["errno"] == errno_mod.EADDRINUSE for b in tried)
    out["bindable"] = all(b["ok"] for b in tried) if tried else None
    if out["bindable"] is False:
        out["holder"] = port_holder(ctx, port)
    return out


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (bind to port 0 and let the kernel choose)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def try_bind(addr: str, port: int) -> dict[str, Any]:
    """Bind ``addr:port`` with SO_REUSEADDR (as TCPStore does), then close. Never listens."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    result: dict[str, Any] = {"address": addr, "ok": False, "errno": None, "error": None}
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        result.update(errno=exc.errno, error=_errtext(exc))
        return result
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((addr, port))
        result["ok"] = True
    except OSError as exc:
        result.update(errno=exc.errno, error=_errtext(exc))
    finally:
        sock.close()
    return result


def _errtext(exc: OSError) -> str:
    name = errno_mod.errorcode.get(exc.errno or 0, "")
    return f"{name}: {exc.strerror}" if name and exc.strerror else str(exc)


def port_holder(ctx: GatherContext, port: int) -> dict[str, Any] | None:
    """The process listening on ``port`` on this host, if psutil can tell (others' need root)."""
    try:
        import psutil

        conns = psutil.net_connections(kind="tcp")
    except Exception as exc:  # noqa: BLE001 - AccessDenied, missing /proc: degrade to unknown
        ctx.unknown("dist.store.holder", f"cannot list sockets: {type(exc).__name__}: {exc}")
        return None
    mine = [c for c in conns if c.laddr and c.laddr.port == port]
    mine.sort(key=lambda c: (c.status != psutil.CONN_LISTEN, c.pid is None))
    if not mine:
        ctx.unknown("dist.store.holder", f"no socket on port {port} is visible to this user")
        return None
    conn = mine[0]
    holder: dict[str, Any] = {
        "pid": conn.pid,
        "status": conn.status,
        "address": f"{conn.laddr.ip}:{conn.laddr.port}",
        "name": None,
        "cmdline": None,
        "user": None,
        "is_self": False,
        "is_ancestor": False,
    }
    if conn.pid is None:
        ctx.unknown("dist.store.holder.pid", "the socket's owner is not visible to this user (needs root)")
        return holder
    holder["is_self"] = conn.pid == os.getpid()
    try:
        holder["is_ancestor"] = conn.pid in {p.pid for p in psutil.Process().parents()}
        proc = psutil.Process(conn.pid)
        holder["name"] = proc.name()
        holder["user"] = proc.username()
        holder["cmdline"] = redact_argv(proc.cmdline())[:200]  # secret flags' values and shapes removed
    except Exception as exc:  # noqa: BLE001 - the process may have exited meanwhile
        ctx.unknown("dist.store.holder.name", f"cannot inspect pid {conn.pid}: {type(exc).__name__}")
    return holder


# -- interfaces -----------------------------------------------------------------------------------


def _interfaces(ctx: GatherContext) -> dict[str, Any] | None:
    """Network interfaces of this host: their IPv4/IPv6 addresses and whether they are up."""
    try:
        import psutil

        addrs = psutil.net_if_addrs()
        stats = psutil.net_if_stats()
    except Exception as exc:  # noqa: BLE001 - degrade, never crash
        ctx.unknown("dist.interfaces", f"cannot list network interfaces: {type(exc).__name__}: {exc}")
        return None
    names: dict[str, Any] = {}
    for name in sorted(set(addrs) | set(stats)):
        inet = [a.address.split("%")[0] for a in addrs.get(name, []) if a.family in (socket.AF_INET, socket.AF_INET6)]
        st = stats.get(name)
        names[name] = {"addresses": inet, "up": st.isup if st else None}
    return {"names": names, "source": "psutil.net_if_addrs, psutil.net_if_stats"}
