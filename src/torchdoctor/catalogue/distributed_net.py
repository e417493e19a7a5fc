"""TD407-TD411: the network side of the rendezvous: MASTER_PORT in use, MASTER_ADDR, interfaces.

Quoted torch error texts were produced on torch 2.13 (tests/fixtures/dist/torch_errors.txt).
"""

from __future__ import annotations

import errno
from collections.abc import Iterator, Mapping
from typing import Any

from ..facts import Facts
from ..facts.schema import Interface, PortHolder
from ..model import Severity
from ..options import CheckOptions
from ..registry import Code, Hit, register
from ._util import ev
from .distributed import FREE_PORT, env_ev, env_of, ints_of

# -- MASTER_PORT ----------------------------------------------------------------------------------


def _holder_text(holder: PortHolder) -> tuple[str, str]:
    if not holder or holder.pid is None:
        return "", ""
    who = ", ".join(str(x) for x in (holder.name, f"user {holder.user}" if holder.user else None) if x)
    text = f"; it is held by pid {holder.pid}" + (f" ({who})" if who else "")
    kill = (
        f" (pid {holder.pid}: check it is yours with `ps -o user,pid,args -p {holder.pid}`, then `kill {holder.pid}`)"
    )
    return text, kill


def _check_port_in_use(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    dist = facts.dist
    store = dist.store
    if not store.tested or store.bindable is not False:
        return
    holder = store.holder
    if holder and (holder.is_self or holder.is_ancestor):
        return  # our own launcher (torchrun's agent store) or this very process holds it: expected
    if dist.launcher.agent_store and not (holder and holder.pid):
        return  # a torchrun worker: the agent holds the port, even when its pid is not visible
    # EAFNOSUPPORT (no IPv6) and EADDRNOTAVAIL (an address not on this host) say nothing about the port
    failed = [b for b in store.bind if not b.ok and b.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL)]
    if not failed:
        return
    error = failed[0].error or f"errno {failed[0].errno}"
    in_use = bool(store.in_use)
    held, kill = _holder_text(holder)
    denied = any(b.errno == errno.EACCES for b in failed)
    hint = (
        " Ports below 1024 need root or CAP_NET_BIND_SERVICE (net.ipv4.ip_unprivileged_port_start)." if denied else ""
    )
    evidence = [env_ev("MASTER_PORT", store.port), env_ev("MASTER_ADDR", env_of(facts).get("MASTER_ADDR", "not set"))]
    evidence += [
        ev(f"bind {b.address}:{store.port}", b.error or "ok", "socket.bind with SO_REUSEADDR") for b in store.bind
    ]
    if holder and holder.pid is not None:
        cmdline = holder.cmdline or ""
        evidence.append(
            ev("held by", f"pid {holder.pid} {holder.name or ''} {cmdline or ''}".strip(), "psutil.net_connections")
        )
    yield Hit(
        {
            "port": store.port,
            "error": error,
            "state": "is already in use" if in_use else "cannot be bound",
            "why": store.why or "",
            "held": held,
            "kill": kill,
            "hint": hint,
        },
        tuple(evidence),
    )


TD407 = register(
    Code(
        code="TD407",
        name="dist-master-port-in-use",
        family="dist-port",
        severity=Severity.ERROR,
        area="distributed",
        title="MASTER_PORT is already in use on the rendezvous host",
        message="MASTER_PORT {port} {state} on this host ({why}): bind failed with {error}{held}. The store rank 0 opens "
        "here fails with `The server socket has failed to listen on any local network address`.{hint}",
        fix="Choose another port for every rank (`export MASTER_PORT=$("
        + FREE_PORT
        + ")` on rank 0's host); on one node let torchrun pick one: `torchrun --standalone --nproc-per-node=<N> "
        "train.py`; or end the stale job holding it{kill}.",
        meaning="Rank 0 (or torchrun's agent) listens on MASTER_PORT on every address of its host; if any process already "
        "listens there, init_process_group fails at once with EADDRINUSE.",
        why="A previous run that crashed or is still shutting down, a second job on the same node with the default 29500, "
        "or an unrelated service on that port.",
        false_positives="A worker started by torchrun connects to its agent's store, which holds the port by design: the "
        "check is skipped when the holder is an ancestor of this process or TORCHELASTIC_USE_AGENT_STORE "
        "is True.",
        related=("TD406",),
        check=_check_port_in_use,
    )
)


# -- MASTER_ADDR ----------------------------------------------------------------------------------


def _check_unresolvable(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    master = facts.dist.master
    if not master or master.addresses or not master.error:
        return
    port = env_of(facts).get("MASTER_PORT", "<port>")
    yield Hit(
        {"addr": master.addr, "error": master.error, "port": port},
        (env_ev("MASTER_ADDR", master.addr), ev("getaddrinfo", master.error, f"getaddrinfo({master.addr!r})")),
        severity=Severity.WARNING if master.timed_out else None,
    )


TD408 = register(
    Code(
        code="TD408",
        name="dist-master-addr-unresolvable",
        family="dist-connect",
        severity=Severity.ERROR,
        area="distributed",
        title="MASTER_ADDR does not resolve",
        message="MASTER_ADDR={addr} does not resolve on this host ({error}); each rank's store client retries until the "
        "timeout, then fails with `The client socket has timed out after ...ms while trying to connect to "
        "({addr}, {port})`.",
        fix="Set MASTER_ADDR to rank 0's host as every node can resolve it (check with `getent hosts {addr}`); under Slurm: "
        '`export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)`; or use an IP address.',
        meaning="Every rank, rank 0 included, connects to the store at MASTER_ADDR:MASTER_PORT; a name that does not "
        "resolve leaves each of them retrying until the rendezvous timeout (30 minutes by default).",
        why="A typo, a short host name outside the DNS search domain, a name that exists only on the login node's "
        "/etc/hosts, or a Kubernetes service that is not created yet.",
        false_positives="A name that resolves only later (a pod or service still starting) reports here while the job "
        "would eventually connect; a resolver that does not answer within 2 s is reported as a warning.",
        related=("TD409", "TD410", "TD449"),
        check=_check_unresolvable,
    )
)


def _nodes(ints: dict[str, int]) -> tuple[int, str] | None:
    step = ints.get("SLURM_STEP_NUM_NODES")
    for var in (("SLURM_STEP_NUM_NODES",) if step is not None else ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")) + (
        "GROUP_WORLD_SIZE",
    ):
        if ints.get(var, 0) > 1:
            return ints[var], f"{var}={ints[var]}"
    world, local = ints.get("WORLD_SIZE"), ints.get("LOCAL_WORLD_SIZE")
    if world and local and world > local >= 1:
        return -(-world // local), f"WORLD_SIZE={world} > LOCAL_WORLD_SIZE={local}"
    return None


def _check_loopback_multinode(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    master = facts.dist.master
    nodes = _nodes(ints_of(facts))
    if not master.loopback or not nodes:
        return
    addrs = ", ".join(master.addresses or ())
    yield Hit(
        {"addr": master.addr, "addresses": addrs, "nodes": nodes[0], "evidence": nodes[1]},
        (
            env_ev("MASTER_ADDR", master.addr),
            ev("resolves to", addrs, "getaddrinfo"),
            ev("nodes", nodes[1], "environment"),
        ),
    )


TD409 = register(
    Code(
        code="TD409",
        name="dist-master-loopback-multinode",
        family="dist-connect",
        severity=Severity.ERROR,
        area="distributed",
        title="MASTER_ADDR is a loopback address in a multi-node job",
        message="MASTER_ADDR={addr} resolves to loopback ({addresses}) but the job spans {nodes} nodes ({evidence}); ranks "
        "on the other nodes connect to their own loopback and never reach rank 0's store.",
        fix="Set MASTER_ADDR to an address of rank 0's node that the others can reach: under Slurm `export "
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)`; with torchrun '
        "`--rdzv-endpoint=<node0 hostname>:29500` on every node.",
        meaning="127.0.0.0/8 and ::1 are private to each machine: the same MASTER_ADDR means a different host on every node.",
        why="A single-node recipe (`MASTER_ADDR=localhost`) reused for a multi-node run, or a hostname that /etc/hosts "
        "maps to 127.0.1.1 (Debian/Ubuntu default).",
        false_positives="None for multi-node jobs; the node count is taken from Slurm's node count, torchrun's "
        "GROUP_WORLD_SIZE, or WORLD_SIZE > LOCAL_WORLD_SIZE.",
        related=("TD408", "TD410"),
        check=_check_loopback_multinode,
    )
)


def _check_rank0_elsewhere(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    dist = facts.dist
    master, launcher = dist.master, dist.launcher
    if ints_of(facts).get("RANK") != 0 or master.is_local is not False or launcher.agent_store or launcher.torchrun:
        return
    addrs = ", ".join(master.addresses or ())
    yield Hit(
        {"addr": master.addr, "addresses": addrs, "hostname": dist.hostname or "this host"},
        (
            env_ev("RANK", 0),
            env_ev("MASTER_ADDR", master.addr),
            ev("resolves to", addrs, "getaddrinfo"),
            ev("this host", dist.hostname, "psutil.net_if_addrs, gethostname"),
        ),
    )


TD410 = register(
    Code(
        code="TD410",
        name="dist-rank0-not-on-master",
        family="dist-connect",
        severity=Severity.WARNING,
        area="distributed",
        title="rank 0 is not on the host MASTER_ADDR names",
        message="This process is RANK=0, which opens the store on this host ({hostname}), but MASTER_ADDR={addr} "
        "({addresses}) is none of its addresses; every rank, this one included, will look for the store there.",
        fix="Start rank 0 on the host MASTER_ADDR names, or point MASTER_ADDR at this host on every rank "
        "(`export MASTER_ADDR={hostname}`); under Slurm derive both from the same node list, or use torchrun.",
        meaning="With env://, rank 0 listens for the store on its own host and all ranks connect to MASTER_ADDR; the "
        "two must be the same machine.",
        why="Ranks were numbered in a different order from the node list MASTER_ADDR was taken from, or MASTER_ADDR was "
        "exported on another node and copied.",
        false_positives="NAT, port forwarding or a Kubernetes ClusterIP service can route an address that is not on this "
        "host to it; torchrun workers (which use the agent's store) are skipped.",
        related=("TD408", "TD409"),
        check=_check_rank0_elsewhere,
    )
)


# -- socket interfaces ----------------------------------------------------------------------------


def _has_address(iface: Interface | Mapping[str, Any]) -> bool:
    return bool(iface.addresses if isinstance(iface, Interface) else iface.get("addresses"))


def ifname_unmatched(
    var: str, value: str, names: Mapping[str, Interface] | Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Entries of a *_SOCKET_IFNAME value that name no interface with an address ([] when usable).

    NCCL takes prefixes (``eth`` matches eth0), ``=name`` for an exact name and a leading ``^`` for an
    exclusion list, and needs one match; gloo and TensorPipe take exact names and need every one.
    """
    usable = {n for n, i in names.items() if _has_address(i)}
    entries = [e.strip() for e in value.split(",") if e.strip()]
    if var == "NCCL_SOCKET_IFNAME":
        if value.startswith("^"):
            return []
        hits = [e for e in entries if any(n == e[1:] if e.startswith("=") else n.startswith(e) for n in usable)]
        return [] if hits else entries
    return [e for e in entries if e not in usable]


def _describe_entry(entry: str, names: dict[str, Interface], prefix: bool) -> str:
    exact = not prefix or entry.startswith("=")
    key = entry[1:] if entry.startswith("=") else entry
    found = [n for n in names if (n == key if exact else n.startswith(key))]
    if not found:
        return f"no interface {'is named' if exact else 'starts with'} {key}"
    down = [n for n in found if names[n].up is False]
    return f"{', '.join(found)} {'has' if len(found) == 1 else 'have'} no IPv4/IPv6 address" + (
        f" ({', '.join(down)} down)" if down else ""
    )


_IFNAME_EFFECT = {
    "GLOO_SOCKET_IFNAME": "the gloo backend stops with `Unable to find address for: {name}`",
    "NCCL_SOCKET_IFNAME": "NCCL has no socket interface to bootstrap over",
    "TP_SOCKET_IFNAME": "TensorPipe (torch.distributed.rpc) has no interface to listen on",
}


def _check_ifname(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    names = facts.dist.interfaces.names
    if not names:
        return
    env = env_of(facts)
    usable = [n for n, i in names.items() if i.addresses]
    suggest = next((n for n in usable if n != "lo" and names[n].up), "lo")
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
        value = env.get(var)
        if not value or not (bad := ifname_unmatched(var, value, names)):
            continue
        detail = "; ".join(_describe_entry(e, names, var == "NCCL_SOCKET_IFNAME") for e in bad)
        available = ", ".join(f"{n} {names[n].addresses[0]}" for n in usable) or "none"
        yield Hit(
            {
                "var": var,
                "value": value,
                "detail": detail,
                "available": available,
                "suggest": suggest,
                "effect": _IFNAME_EFFECT[var].format(name=bad[0].lstrip("=")),
            },
            (env_ev(var, value), ev("interfaces with an address", available, "psutil.net_if_addrs")),
        )


TD411 = register(
    Code(
        code="TD411",
        name="dist-socket-ifname-missing",
        family="dist-connect",
        severity=Severity.ERROR,
        area="distributed",
        title="a *_SOCKET_IFNAME variable names no usable interface",
        message="{var}={value}: {detail}; {effect}.",
        fix="Name an interface that exists and has an address on every node (`ip -brief address`; here: {available}), "
        "e.g. `export {var}={suggest}`, or `unset {var}` to let the library choose.",
        meaning="GLOO_SOCKET_IFNAME and TP_SOCKET_IFNAME name exact interfaces; NCCL_SOCKET_IFNAME takes name prefixes "
        "(`=name` exact, `^` to exclude). The interface must exist and carry an IPv4/IPv6 address.",
        why="Interface names differ between nodes or images (eth0 vs ens5 vs ib0), a container has only its own veth, or "
        "the value was copied from another cluster.",
        false_positives="Nodes differ: the interface may exist on the nodes that matter and not on this one (a login "
        "node). NCCL exclusion lists (`^...`) are not judged.",
        related=("TD408",),
        check=_check_ifname,
    )
)
