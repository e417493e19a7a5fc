"""TD460-TD462, TD478, TD489: ranks that cannot find or reach each other after the rendezvous (``explain``).

The store rendezvous (TD451-TD453 in ``log_dist.py``) only exchanges addresses; gloo then binds to the
address its host name resolves to (or to ``GLOO_SOCKET_IFNAME``) and every pair of ranks connects
directly. A host name that resolves to loopback or to nothing usable breaks that step on otherwise
healthy machines. ``init_process_group``'s store-based barrier (torch < 2.2 waited in it by default) is
the other place a missing rank shows up before the first collective. Fixtures:
``tests/fixtures/logs/<CODE>/``.
"""

from __future__ import annotations

from ..model import Severity
from ..registry import Code, register
from ..signature import Role, Signature

_IFNAME_FIX = (
    "Tell gloo which interface to use on every node: `export GLOO_SOCKET_IFNAME=<iface>`, a single "
    "interface name (not an IP address, not NCCL's `^lo` exclusion syntax) that exists on that node and "
    "carries the address the other nodes reach (`ip -br addr`); or make the host name resolve to that "
    "address (`getent hosts $(hostname)`; Debian/Ubuntu map it to 127.0.1.1 in /etc/hosts). Set "
    "`NCCL_SOCKET_IFNAME` to the same interface for NCCL."
)

TD460 = register(
    Code(
        code="TD460",
        name="gloo-interface-address-not-found",
        family="dist-connect",
        severity=Severity.ERROR,
        area="distributed",
        title="gloo could not find a local address to bind for its connections",
        message="gloo could not find a usable local {kind} for '{name}', so this rank cannot open connections to the "
        "others.",
        fix=_IFNAME_FIX,
        meaning="When gloo creates its device it resolves GLOO_SOCKET_IFNAME (an interface name) or, without it, this "
        "host's name, and binds to the address it finds; 'Unable to find address for: X' means X has no usable "
        "address, 'Unable to find interface for: [IP]' that no local interface carries the address the host name "
        "resolves to.",
        why="GLOO_SOCKET_IFNAME naming an interface that does not exist on this node (copied from another machine, "
        "`ib0`/`bond1`), set to an IP address or an exclusion list, or a host name that does not resolve to any "
        "local address (containers with --net=host, Kubernetes host networking, stale /etc/hosts).",
        false_positives="None known.",
        related=("TD461", "TD453", "TD411"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Unable to find address for", "Unable to find interface for"),
                pattern=r"Unable to find (?P<kind>address|interface) for: (?P<name>\S+)",
                confidence=0.85,
            ),
        ),
    )
)

TD478 = register(
    Code(
        code="TD478",
        name="nccl-bootstrap-no-interface",
        family="dist-connect",
        severity=Severity.ERROR,
        area="distributed",
        title="NCCL found no usable network interface, or could not reach a peer over the one it picked "
        "(NCCL_SOCKET_IFNAME)",
        message="NCCL could not open its sockets between the ranks ({what}): NCCL_SOCKET_IFNAME names an interface "
        "this node does not have, no interface is up, or the address NCCL advertised over the interface it picked "
        "(a docker bridge, a veth, loopback, an IPoIB port) is one the peer cannot reach.",
        fix="On every node list the interfaces (`ip -br addr`) and set `NCCL_SOCKET_IFNAME` to the one the nodes reach "
        "each other over; when the nodes name it differently, give a prefix or a list (`NCCL_SOCKET_IFNAME=enp`, "
        "`NCCL_SOCKET_IFNAME=enp6s0,enp4s0`); or unset it to let NCCL choose. Containers see their own interfaces "
        "(`eth0` in a pod, the host's with `--network=host`). Run once with `NCCL_DEBUG=INFO` to read which "
        "interface and address NCCL uses ('Bootstrap : Using ...', 'NET/Socket : Using ...').",
        meaning="NCCL's bootstrap (the out-of-band socket ranks use to exchange connection details before any "
        "collective) and its socket transport bind to the interfaces NCCL_SOCKET_IFNAME selects, or to the first "
        "usable non-loopback, non-docker one. When none matches, or the chosen one carries an address the other "
        "ranks cannot route to, the first connection fails ('socketStartConnect: Connect to ... failed').",
        why="A launch script that hard-codes `NCCL_SOCKET_IFNAME=eth0` / `ib0` / `bond0` on machines whose interfaces "
        "have other names, nodes whose NICs are named differently, a container or pod without the expected network "
        "attachment, a machine with only loopback, or a host with several interfaces where NCCL picked one the "
        "peers cannot reach.",
        false_positives="'Connection reset by peer' on an established connection is a peer that went away (TD482), "
        "not an unreachable address.",
        related=("TD460", "TD480", "TD481", "TD482", "TD411"),
        signatures=(
            Signature(  # NCCL bootstrap.cc: WARN("Bootstrap : no socket interface found"), also the 'Last error:' line
                role=Role.ROOT_CAUSE,
                triggers=("no socket interface found",),
                pattern=r"Bootstrap ?: no (?:NCCL_SOCKET_IFNAME )?socket interface found",
                values={"what": "no socket interface found"},
                confidence=0.9,
            ),
            # NCCL misc/socket.cc: a connect to the address a peer advertised failed before any data flowed: the
            # address is not reachable from here (settled by NCCL_SOCKET_IFNAME in the reports we have; NCCL's
            # maintainers note 'Software caused connection abort' can also follow another failure: not sure)
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Connect to",),
                pattern=r"(?:socketStartConnect|Net) ?: Connect to (?P<peer>\S+) failed ?: (?P<reason>Software caused "
                r"connection abort|Network is unreachable|No route to host|Connection refused|Connection timed out|"
                r"Cannot assign requested address)",
                values={"what": "a connect to a peer's address failed"},
                confidence=0.7,
            ),
        ),
    )
)

TD461 = register(
    Code(
        code="TD461",
        name="gloo-peer-connection-refused",
        family="dist-connect",
        severity=Severity.ERROR,
        area="distributed",
        title="a gloo connection to another rank was refused",
        message="gloo's connection to the peer at {addr}:{port} was refused; a loopback address there (127.x) means that "
        "rank advertised its host name's loopback entry, which other nodes cannot reach.",
        fix=_IFNAME_FIX + " If the address is right, check that the peer is still running (its own log) and that no "
        "firewall blocks the ports gloo picks between the nodes.",
        meaning="After the store rendezvous every pair of gloo ranks connects directly, to the address each rank "
        "published; 'Connection refused' means nothing listened at that address and port.",
        why="The peer's host name resolves to 127.0.1.1 / 127.0.0.1 (so it published a loopback address) or to an "
        "interface other nodes cannot reach; less often the peer exited or a firewall rejects the connection.",
        false_positives="A peer that died during setup also refuses connections; then its own error comes first.",
        related=("TD460", "TD453", "TD454"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Connection refused",),
                pattern=r"pair\.cc:\d+\] connect \[(?P<addr>[^\]]+)\]:(?P<port>\d+): Connection refused",
                confidence=0.75,
            ),
            Signature(  # torch >= 2.3: "Gloo connectFullMesh failed with [...pair.cc:N] ... SO_ERROR: Connection refused, remote=[A]:P"
                role=Role.ROOT_CAUSE,
                triggers=("Connection refused, remote=",),
                pattern=r"SO_ERROR: Connection refused, remote=\[(?P<addr>[^\]]+)\]:(?P<port>[^\s,)]+)",
                confidence=0.75,
            ),
        ),
    )
)

TD462 = register(
    Code(
        code="TD462",
        name="store-based-barrier-timeout",
        family="dist-hang",
        severity=Severity.ERROR,
        area="distributed",
        title="init_process_group's store-based barrier timed out (ranks missing or extra)",
        message="init_process_group waited in its store-based barrier ({detail}): the barrier counts one arrival per "
        "rank; fewer than world_size means some ranks never got there, more means extra processes joined the "
        "same store.",
        fix="Fewer arrivals: find the ranks that did not arrive (their own logs: a crash, a slow model or dataset load "
        "before init_process_group, a node that never started) and fix that; raise `init_process_group(timeout=...)` "
        "only when they are merely slow. More arrivals than world_size: two jobs share one MASTER_ADDR:MASTER_PORT, "
        "a `file://` init file from an earlier run was reused (delete it or use a new path per run), or more processes "
        "were launched than WORLD_SIZE (`--nproc-per-node` × nodes, `mp.spawn` nprocs).",
        meaning="Before torch 2.2, init_process_group ended with a barrier on the store: each rank adds 1 to a key and "
        "waits until the count equals world_size, logging 'Waiting in store based barrier' every 10 s and raising "
        "after the process-group timeout.",
        why="A rank that crashed or is still loading, nodes started far apart, WORLD_SIZE larger than the processes "
        "launched, or a store shared with another run.",
        false_positives="Very slow starts (large model loads on some ranks) with a short timeout.",
        related=("TD452", "TD453", "TD455", "TD490"),
        signatures=(
            Signature(
                role=Role.CASCADE,
                triggers=("process group in store based barrier",),
                # torch 1.8-2.0: "on rank: 3, ... worker_count=N, timeout=T)"; torch >= 2.1 (pytorch/pytorch#98000):
                # "on rank 3, ... num_workers_joined=N, timeout=T)", from 2.2 with " error=..." before the ")"
                pattern=r"(?i:timed out initializing process group in store based barrier)(?: on rank:? (?P<barrier_rank>\d+)"
                r", for key: (?P<key>[^\s(]+) \((?P<detail>world_size=(?P<world>\d+), (?:worker_count|num_workers_joined)="
                r"(?P<count>\d+), timeout=(?P<timeout>[^)]+?))(?: error=[^)]*)?\))?",
                values={"detail": "timed out; the counts were not printed"},
                confidence=0.8,
            ),
            Signature(  # the INFO line torch logs every 10 s while it waits: a hang in init_process_group
                role=Role.CASCADE,
                triggers=("Waiting in store based barrier",),
                pattern=r"Waiting in store based barrier to initialize process group for rank: (?P<barrier_rank>\d+), key: "
                r"(?P<key>[^\s(]+) \((?P<detail>world_size=(?P<world>\d+), (?:worker_count|num_workers_joined)="
                r"(?P<count>\d+), timeout=(?P<timeout>[^)]+?))(?: error=[^)]*)?\)",
                confidence=0.5,
            ),
        ),
    )
)

TD489 = register(
    Code(
        code="TD489",
        name="nccl-error-across-nodes",
        family="dist-connect",
        severity=Severity.ERROR,
        area="distributed",
        title="NCCL failed with a generic error on a run over several machines: most often the network between them",
        message="NCCL stopped with an error that names no cause ('unhandled system error', 'internal error' or "
        "'remote process exited or there was a network error') on a job that spans several nodes: the ranks most "
        "likely cannot reach each other over the interface NCCL picked.",
        fix="Run once with `NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET` on every node and read which interface each "
        "rank bootstraps over ('NET/Socket : Using ...'). Set `NCCL_SOCKET_IFNAME` (and `GLOO_SOCKET_IFNAME`) to the "
        "interface the nodes reach each other over (`ip -br addr`; not `lo`, `docker0` or a `veth`); open the ports "
        "between the nodes in the firewall or security group; try `NCCL_IB_DISABLE=1` once to tell an InfiniBand/"
        "RoCE path from the socket path. Same NCCL version on every node.",
        meaning="Inside one machine NCCL uses shared memory and P2P; between machines it opens sockets or InfiniBand "
        "queue pairs to peers whose addresses it learned at bootstrap. When one node advertises an address the "
        "others cannot reach, setup or the first collective fails with NCCL's generic errors. `explain` reads TD480-TD482 "
        "as this code when the log shows several nodes (ranks on several hosts, or the words of a multi-node run).",
        why="NCCL chose a docker, virtual-bridge or loopback interface, a firewall between the nodes, nodes on "
        "different subnets, an InfiniBand or RoCE fabric that is present but not usable, or a peer that died.",
        false_positives="The same errors on one machine are NCCL's own (TD480-TD482); on several nodes, a peer that "
        "crashed first (its own log names why) makes the others print them too.",
        related=("TD480", "TD481", "TD482", "TD478", "TD460"),
        # no signature of its own: explain reads TD480-TD482 as this code when the log shows several nodes
        # (Code.across_nodes; on the tuning half, settled as dist-connect 3 times of 4)
    )
)
