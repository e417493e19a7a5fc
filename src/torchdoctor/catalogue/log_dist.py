"""TD448-TD479: torch.distributed rendezvous, gloo collectives and launcher summaries in logs (``explain``).

Root causes are what a rank reports about itself (a missing variable, a port in use, a store nobody
joins, collectives that differ); a survivor's "Connection closed by peer" or a collective timeout is a
cascade of another rank's failure, and the launchers' summaries (torchrun's ChildFailedError,
torch.multiprocessing's ProcessExitedException) confirm which process failed first. Fixtures:
``tests/fixtures/logs/<CODE>/`` (lab: ``lab/scenarios/dist.py``).
"""

from __future__ import annotations

from ..model import Severity
from ..registry import Code, register
from ..signature import Role, Signature
from ..signature import prose_gap as _gap

# trigger words shared by the prose symptoms below (a stall; a rank's or a device's name)
_STALL_WORDS = (
    "hang",
    "Hang",
    "hung",
    "Hung",
    "stuck",
    "Stuck",
    "freez",
    "Freez",
    "frozen",
    "Frozen",
    "deadlock",
    "Deadlock",
    "block",
    "Block",
    "forever",
    "never return",
)
_RANK_WORDS = (
    "rank",
    "Rank",
    "GPU",
    "gpu",
    "process",
    "Process",
    "device",
    "worker",
    "node",
    "DDP",
    "ddp",
    "istributed",
)

_FIRST = (
    "Find the first rank that failed (torchrun's 'Root Cause (first observed failure)', the earliest "
    "traceback) and fix its own error; "
)


TD450 = register(
    Code(
        code="TD450",
        name="dist-env-var-missing",
        family="dist-env",
        severity=Severity.ERROR,
        area="distributed",
        title="init_process_group (env://) found a required variable unset",
        message="init_process_group with env:// stopped at once: the environment variable {var} is not set in this "
        "process.",
        fix="Start every rank with torchrun, which sets MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (and LOCAL_RANK): "
        "`torchrun --nproc-per-node=N train.py`; with another launcher export {var} (and the others) for each rank, "
        "or pass rank=/world_size= and init_method='tcp://HOST:PORT' explicitly. `torchdoctor check --dist` checks "
        "the variables before the run.",
        meaning="The env:// rendezvous (init_process_group's default) reads the four variables and raises ValueError as "
        "soon as one is missing or empty.",
        why="The script was started with plain `python` instead of torchrun, or a Slurm/MPI wrapper that does not map "
        "its own variables (SLURM_PROCID, OMPI_COMM_WORLD_RANK) to torch's.",
        false_positives="None known.",
        related=("TD401", "TD404"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("expected, but not set",),
                pattern=r"environment variable (?P<var>[A-Z_]+) expected, but not set",
                confidence=0.95,
            ),
            # A traceback pasted without its ValueError line: only torch's env:// handler raises _env_error.
            Signature(  # torch 1.x: `raise _env_error("MASTER_ADDR")` in _env_rendezvous_handler
                role=Role.ROOT_CAUSE,
                triggers=("_env_error(",),
                pattern=r"(?m)^raise _env_error\(\"(?P<var>[A-Z_]+)\"\)$",
                frames=True,
                confidence=0.9,
            ),
            Signature(  # later: `raise _env_error(env_var)` in _get_env_or_raise, the name in the caller's line
                role=Role.ROOT_CAUSE,
                triggers=("_env_error(",),
                pattern=r"(?:_get_env_or_raise\(\"(?P<var>[A-Z_]+)\"\)[^\n]*\n[^\n]*, in _get_env_or_raise\n)?"
                r"raise _env_error\(env_var\)$",
                frames=True,
                values={
                    "var": "RANK, WORLD_SIZE, MASTER_ADDR or MASTER_PORT (its name was in the part of the "
                    "traceback that is missing)"
                },
                confidence=0.9,
            ),
        ),
    )
)

_PORT_CONFIRM = (
    "On rank 0's host, `ss -ltnp 'sport = :PORT'` for MASTER_PORT (29500 by default) while the run starts: a "
    "listener there (often another training run) confirms it."
)

TD451 = register(
    Code(
        code="TD451",
        name="dist-store-port-in-use",
        family="dist-port",
        severity=Severity.ERROR,
        area="distributed",
        title="the rendezvous store could not listen: the port is already in use",
        message="Rank 0's TCPStore could not listen on port {port}: address already in use (EADDRINUSE). Another process "
        "on this host (often a previous run that has not exited) holds it.",
        fix="Find the holder: `ss -ltnp 'sport = :{port}'`; end a stale run of yours, or use another port for every rank "
        '(`export MASTER_PORT=$(python -c \'import socket; s=socket.socket(); s.bind(("", 0)); '
        "print(s.getsockname()[1])')`, or `torchrun --standalone` / `--rdzv-endpoint=HOST:0` on one node). "
        "`torchdoctor check --dist` tests the port before the run.",
        meaning="The store binds MASTER_PORT on every address of rank 0's host; one listener on any of them is enough "
        "to make it fail.",
        why="Two jobs on one node with the default 29500, a crashed run whose processes still live, a port used by a "
        "service.",
        false_positives="None known.",
        related=("TD407",),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("EADDRINUSE",),
                pattern=r"failed to listen on any local network address\. port: (?P<port>\d+), useIpv6: \w+, "
                r"code: -98, name: EADDRINUSE",
                confidence=0.95,
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Address already in use",),
                pattern=r"The server socket has failed to bind to \[?[^\]\s]*\]?:(?P<port>\d+) \(errno: 98 - "
                r"Address already in use\)",
                confidence=0.9,
            ),
            Signature(  # torch < 1.9: TCPStore's constructor raised the bare strerror (THD: "... at General.cpp:17")
                role=Role.ROOT_CAUSE,
                triggers=("Address already in use",),
                pattern=r"(?:^|[\s:`])RuntimeError ?: Address already in use(?: at \S+)?[\s`'\"]*$",
                values={"port": "$MASTER_PORT"},
                confidence=0.8,
            ),
            Signature(  # prose: "shows an error saying 'Address already in use'", "master_port is already used"
                role=Role.SYMPTOM,
                triggers=("already in use", "already used", "Already in use", "already taken", "already occupied"),
                pattern=r"(?i)\b(?:address|port|master_port|master port)\b[^.\n]{0,40}?\b(?:is |was )?already "
                r"(?:in use|used|taken|occupied)",
                exclude=(
                    r"\[Errno \d+\]",  # Python's own socket error (98 on Linux, 48 on macOS): another program's server
                    r"\] bind: Address already in use",
                    r"(?i)tensorboard|jupyter|gradio|"
                    r"streamlit|flask|uvicorn|http server",
                ),
                values={"port": "$MASTER_PORT"},
                confidence=0.65,
                confirm=_PORT_CONFIRM,
            ),
            Signature(  # prose: "the master port used repeatedly", "port is blocked by another service", "29500 端口产生了碰撞"
                role=Role.SYMPTOM,
                triggers=(
                    "repeatedly",
                    "blocked",
                    "conflict",
                    "collision",
                    "clash",
                    "碰撞",
                    "冲突",
                    "占用",
                    "无法",
                    "cannot",
                    "can't",
                    "can not",
                    "unable to",
                ),
                pattern=r"(?i)(?:\b(?:master[_ ]?port|port)\b|29500|端口)[^.\n。]{0,40}?(?:used repeatedly|\bblocked\b|"
                r"\bconflict|\bcollision|\bclash|碰撞|冲突|被占用|占用|(?:cannot|can't|can not|unable to|无法)\s*(?:同时)?"
                r"\s*(?:run|start|launch|运行|启动)\s*(?:multiple|two|another|a second|多个|两个|第二个))",
                exclude=(
                    r"(?i)tensorboard|jupyter|gradio|streamlit|flask|uvicorn|http server|webui|firewall|iptables|"
                    r"security group",
                ),
                values={"port": "$MASTER_PORT"},
                confidence=0.6,
                confirm=_PORT_CONFIRM,
            ),
            # prose: "more than one distributed training job on the same node", "two DDP-based experiments on the
            # same server": every launcher defaults to one port (29500), so a second job on the node collides
            Signature(
                role=Role.SYMPTOM,
                triggers=("machine", "node", "host", "server", "Machine", "Node", "Server"),
                pattern=r"(?i)\b(?:more than one|two|multiple|several|second|another|concurrent|parallel|simultaneous)\b"
                r"[^.\n]{0,40}?\b(?:jobs?|trainings?|runs?|experiments?|instances?|tasks?)\b[^.\n]{0,40}?\b"
                r"(?:same|one|single|a single)[ -](?:machine|node|host|server)\b",
                values={"port": "$MASTER_PORT"},
                confidence=0.55,
                confirm=_PORT_CONFIRM,
            ),
        ),
    )
)

TD452 = register(
    Code(
        code="TD452",
        name="dist-store-ranks-missing",
        family="dist-connect",
        severity=Severity.ERROR,
        area="distributed",
        title="the rendezvous store gave up waiting for the other ranks",
        message="Rank 0's store waited {seconds} s and only {joined} of {world} processes joined: the others were never "
        "started, crashed before init_process_group, or cannot reach MASTER_ADDR:MASTER_PORT.",
        fix="Start all WORLD_SIZE ranks (torchrun --nnodes/--nproc-per-node must multiply to WORLD_SIZE; in Slurm, "
        "`srun` with --ntasks=WORLD_SIZE), check the other nodes' logs for an earlier error, and that they use the "
        "same MASTER_ADDR/MASTER_PORT and can reach it (`nc -zv MASTER_ADDR MASTER_PORT` from another node).",
        meaning="The TCPStore server on rank 0 counts the clients that connect within the timeout of "
        "init_process_group; fewer than WORLD_SIZE means some ranks never arrived.",
        why="WORLD_SIZE larger than the processes launched, other nodes not started or failing early, a firewall or "
        "wrong MASTER_ADDR on the other nodes.",
        false_positives="Very slow starts (containers pulling images) with a short timeout look the same.",
        related=("TD453", "TD403"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("waiting for clients",),
                pattern=r"Timed out after (?P<seconds>\d+) seconds waiting for clients\. (?P<joined>\d+)/(?P<world>\d+) "
                r"clients joined",
                confidence=0.9,
            ),
        ),
    )
)

_CONNECT_CONFIRM = (
    "From every node, `nc -zv $MASTER_ADDR $MASTER_PORT` while rank 0 waits (and `ping`); a refused "
    "or hanging connection confirms it (a firewall, a wrong or 127.0.0.1 MASTER_ADDR). Also check that "
    "all WORLD_SIZE processes were started."
)

_NODES_CONFIRM = (
    "From each node, `nc -zv $MASTER_ADDR $MASTER_PORT` (the address must be rank 0's address that the "
    "other nodes reach, not localhost); with NCCL, `NCCL_DEBUG=INFO` shows the interface it picked."
)

TD453 = register(
    Code(
        code="TD453",
        name="dist-store-unreachable",
        family="dist-connect",
        severity=Severity.ERROR,
        area="distributed",
        title="a rank could not connect to the rendezvous store",
        message="This rank could not connect to the store at {host}:{port} ({detail}): rank 0 (or torchrun's agent) is "
        "not listening there, or the address is wrong or unreachable.",
        fix="Start rank 0 (it hosts the store) and check it did not fail first; use the same MASTER_ADDR/MASTER_PORT on "
        "every rank, an address the other nodes can reach (not 127.0.0.1 across nodes), and open the port in the "
        "firewall: `nc -zv {host} {port}` from this node. `torchdoctor check --dist` resolves MASTER_ADDR first.",
        meaning="Non-zero ranks connect to the TCPStore server on MASTER_ADDR:MASTER_PORT and retry until the timeout "
        "of init_process_group.",
        why="Rank 0 not started or crashed, a wrong or unresolvable MASTER_ADDR, a firewall, a port typo.",
        false_positives="None known.",
        related=("TD452", "TD408", "TD409"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("while trying to connect to",),
                pattern=r"The client socket has timed out after (?P<ms>\d+)ms while trying to connect to "
                r"\((?P<host>[^,]+), (?P<port>\d+)\)",
                values={"detail": "connect timed out"},
                confidence=0.85,
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("The client socket has failed to connect to",),
                pattern=r"The client socket has failed to connect to \[?(?P<host>[^\]\s]+?)\]?:(?P<port>\d+) "
                r"\((?:errno|system error): (?P<errno>\d+) - (?P<detail>[^)]+)\)",
                confidence=0.8,
            ),
            Signature(  # torch 1.x TCPStore client (init_process_group, torchrun's c10d/static rendezvous)
                role=Role.ROOT_CAUSE,
                triggers=("connect() timed out",),
                pattern=r"connect\(\) timed out\. Original timeout was (?P<ms>\d+) ms",
                values={"detail": "connect() timed out", "host": "MASTER_ADDR", "port": "MASTER_PORT"},
                confidence=0.85,
            ),
            Signature(  # prose: "hangs at init_process_group", "stuck in init_process_group"
                role=Role.SYMPTOM,
                # prose signatures end with their triggers: a line cut short never matches on its first half
                triggers=("init_process_group",),
                pattern=r"(?i)\b(?:hangs?|hung|hanging|stuck|freez\w*|frozen|blocks|blocked|blocking|waits? forever|"
                r"never returns?|no response)\b.{0,80}\binit_process_group",
                values={
                    "detail": "no connection (the rendezvous never completed)",
                    "host": "MASTER_ADDR",
                    "port": "MASTER_PORT",
                },
                confidence=0.6,
                confirm=_CONNECT_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=_STALL_WORDS,
                pattern=r"(?i)\binit_process_group\b"
                + _gap(80, "(?i:hang|hung|stuck|freez|frozen|deadlock|block|work|connect|time ?out|timed out)")
                + r"\b(?:hangs?|hung|hanging|stuck|freez\w*|frozen|block\w*|"
                r"waits? forever|never returns?)\b",
                values={
                    "detail": "no connection (the rendezvous never completed)",
                    "host": "MASTER_ADDR",
                    "port": "MASTER_PORT",
                },
                confidence=0.6,
                confirm=_CONNECT_CONFIRM,
            ),
            Signature(  # prose: "does not work for two nodes", "multi node training stuck", "hangs on multiple nodes"
                role=Role.SYMPTOM,
                triggers=("node", "Node", "machine", "Machine", "host", "instance"),
                pattern=r"(?i)\b(?:hangs?|hung|hanging|stuck|freez\w*|frozen|does(?:n't| not) work|not working|cannot "
                r"connect|can't connect)\b"
                + _gap(40, "(?i:node|machine|host|instance)")
                + r"\b(?:on|for|with|across|between|in) (?:multi[- ]?(?:node|"
                r"machine)s?|(?:multiple|several|two|2|different) (?:nodes|machines|hosts|instances))\b",
                values={"detail": "no connection between the nodes", "host": "MASTER_ADDR", "port": "MASTER_PORT"},
                confidence=0.55,
                confirm=_NODES_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=(
                    *_STALL_WORDS,
                    "work",
                    "connect",
                    "time out",
                    "timed out",
                    "timeout",
                ),
                pattern=r"(?i)\b(?:multi[- ]?(?:node|machine|host)s?|(?:multiple|several|two|2|different|other) "
                r"(?:nodes|machines|hosts|instances))\b"
                + _gap(60, "(?i:hang|hung|stuck|freez|frozen|deadlock|block|work|connect|time ?out|timed out)")
                + r"\b(?:hangs?|hung|hanging|stuck|freez\w*|"
                r"frozen|does(?:n't| not) work|not working|cannot connect|can't connect|timed? ?out)\b",
                values={"detail": "no connection between the nodes", "host": "MASTER_ADDR", "port": "MASTER_PORT"},
                confidence=0.55,
                confirm=_NODES_CONFIRM,
            ),
            Signature(  # "I run in two docker containers": ranks behind Docker's network isolation
                role=Role.SYMPTOM,
                triggers=("container",),
                pattern=r"(?i)\b(?:two|2|multiple|several|separate|different) (?:docker )?containers?\b",
                values={
                    "detail": "containers that cannot reach each other",
                    "host": "MASTER_ADDR",
                    "port": "MASTER_PORT",
                },
                confidence=0.45,
                confirm="Run the containers with `--network=host` (or publish the rendezvous and backend ports): if the "
                "job then starts, the network isolation was the cause.",
            ),
        ),
    )
)

TD449 = register(
    Code(
        code="TD449",
        name="dist-store-host-not-found",
        family="dist-connect",
        severity=Severity.ERROR,
        area="distributed",
        title="the rendezvous store's host name does not resolve",
        message="The store client could not resolve the host it was told to connect to ({error}): MASTER_ADDR (or the "
        "rendezvous endpoint, or the host name a launcher advertised for its store) is not a name this node can "
        "look up.",
        fix="Use a name every node resolves, or rank 0's IP address: check with `getent hosts $MASTER_ADDR` on each "
        'node. Under Slurm: `export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)`; in '
        "Kubernetes, the headless service of the master pod must exist before the workers start. "
        "`torchdoctor check --dist` resolves MASTER_ADDR before the run (TD408).",
        meaning="torch 1.x's TCPStore client resolved the store's host with getaddrinfo and raised "
        "'host not found: <the resolver's message>' when it failed; torch 2.x keeps retrying until the connect "
        "timeout instead (TD453).",
        why="A typo or a short host name outside the DNS search domain, a name known only to the login node's "
        "/etc/hosts, a job submitted to another cluster than the one the name belongs to, a pod or service whose "
        "name is not created yet, or a launcher that advertises its own host name where the others cannot resolve it.",
        false_positives="A resolver that fails for a moment ('Temporary failure in name resolution') on a name that "
        "does exist: the run may pass when retried.",
        related=("TD408", "TD453", "TD409"),
        signatures=(
            Signature(  # torch 1.x c10d (TCPStore), and torchelastic's etcd rendezvous quoting it
                role=Role.ROOT_CAUSE,
                triggers=("host not found:",),
                pattern=r"host not found: (?P<error>Name or service not known|Temporary failure in name resolution|"
                r"nodename nor servname provided, or not known|No address associated with hostname|"
                r"Name does not resolve)",
                confidence=0.8,
            ),
        ),
    )
)

TD454 = register(
    Code(
        code="TD454",
        name="gloo-peer-connection-lost",
        family="dist-hang",
        severity=Severity.ERROR,
        area="distributed",
        title="a collective lost its connection to another rank (that rank died)",
        message="A gloo collective lost its connection to the peer at {peer} ({how}): that process exited or was killed; "
        "its own error, earlier in its log, is the cause.",
        fix=_FIRST + "if it died without a word (exit code -9/137), look for the OOM killer (`dmesg -T`).",
        meaning="When a rank dies, the TCP connections of its collectives close and every rank waiting on it fails with "
        "this message: it is a symptom on the survivors, not a failure of their own.",
        why="Another rank raised an exception, ran out of memory, was killed by the OOM killer or the scheduler.",
        false_positives="A real network failure between hosts (a link going down) gives the same text on both sides.",
        related=("TD455", "TD457", "TD458", "TD270", "TD274"),
        signatures=(
            Signature(
                role=Role.CASCADE,
                triggers=("Connection closed by peer",),
                pattern=r"Connection closed by peer \[(?P<peer>[^\]]+)\]:(?P<port>\d+)",
                values={"how": "connection closed by peer"},
                confidence=0.8,
            ),
            Signature(
                role=Role.CASCADE,
                triggers=("Connection reset by peer",),
                pattern=r"Read error \[(?P<peer>[^\]]+)\]:(?P<port>\d+): Connection reset by peer",
                values={"how": "connection reset by peer"},
                confidence=0.75,
            ),
        ),
    )
)

_HANG_CONFIRM = (
    "`py-spy dump --pid PID` on every rank while it hangs: ranks waiting in different collectives (or "
    "one rank elsewhere) confirm it; `TORCH_DISTRIBUTED_DEBUG=DETAIL` names the mismatch."
)

TD455 = register(
    Code(
        code="TD455",
        name="gloo-collective-timeout",
        family="dist-hang",
        severity=Severity.ERROR,
        area="distributed",
        title="a gloo collective timed out waiting for another rank",
        message="A gloo collective waited {ms} ms for data from another rank and gave up ({op} operation): some rank did "
        "not reach the same collective in time (hung, slower, took another code path, or died).",
        fix=_FIRST + "if no rank failed, find the one that hangs (`py-spy dump --pid PID` on each rank), look for "
        "rank-dependent code paths around the collective (a barrier or checkpoint save called on rank 0 only must be "
        "called on all ranks; uneven data needs the same number of batches on every rank: "
        "`DistributedSampler(drop_last=True)`, DDP's `Join`), and run with `TORCH_DISTRIBUTED_DEBUG=DETAIL` or "
        "`dist.monitored_barrier()` to name the missing rank. When one rank is only slow (preprocessing or "
        "tokenizing on rank 0, saving a large checkpoint), raise the timeout: "
        "`init_process_group(timeout=timedelta(hours=2))`, Hugging Face `--ddp_timeout`.",
        meaning="Every rank must call the same collectives in the same order; the ones that arrive wait for the others "
        "up to the process group's timeout.",
        why="A rank stuck in I/O or a deadlock, a rank-dependent branch skipping a collective, a much slower rank, or a "
        "rank that died without closing its connections.",
        false_positives="A timeout that is simply too short for a slow step (first batch, checkpointing on rank 0).",
        related=("TD454", "TD456", "TD457"),
        signatures=(
            Signature(
                role=Role.CASCADE,
                triggers=("Timed out waiting",),
                pattern=r"Timed out waiting (?P<ms>\d+)ms for (?P<op>recv|send) operation to complete",
                confidence=0.8,
            ),
            Signature(  # prose: "with DDP the script gets frozen", "the all_reduce hangs"
                role=Role.SYMPTOM,
                triggers=_STALL_WORDS,
                pattern=r"(?i)\b(?:ddp|distributed\w*|nccl|all_?reduce|all_?gather|broadcasts?|barrier|collectives?|"
                r"multi[- ]?gpus?|multiple gpus)\b"
                + _gap(80, "(?i:hang|hung|stuck|freez|frozen|deadlock|block|work|connect|time ?out|timed out)")
                + r"\b(?:hangs?|hung|hanging|stuck|freez\w*|frozen|"
                r"deadlock\w*)\b",
                exclude=(r"init_process_group", r"(?i)\bnum_workers\b|dataloader"),
                values={"ms": "?", "op": "collective"},
                confidence=0.5,
                confirm=_HANG_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=(
                    "DDP",
                    "ddp",
                    "istributed",
                    "NCCL",
                    "nccl",
                    "all_reduce",
                    "allreduce",
                    "all_gather",
                    "broadcast",
                    "barrier",
                    "multi-GPU",
                    "multi GPU",
                    "multi-gpu",
                    "multi gpu",
                    "multiGPU",
                    "multiple GPUs",
                ),
                pattern=r"(?i)\b(?:hangs?|hung|hanging|stuck|freez\w*|frozen|deadlock\w*)\b"
                + _gap(60, "(?i:ddp|distributed|nccl|all_?reduce|all_?gather|broadcast|barrier|multi|gpu)")
                + r"\b(?:ddp|"
                r"distributed\w*|nccl|all_?reduce|all_?gather|broadcasts?|barrier|multi[- ]?gpus?|multiple gpus)\b",
                exclude=(r"init_process_group", r"(?i)\bnum_workers\b|dataloader"),
                values={"ms": "?", "op": "collective"},
                confidence=0.5,
                confirm=_HANG_CONFIRM,
            ),
            Signature(  # prose: "evaluation on the validation set gets stuck" (in a distributed run)
                role=Role.SYMPTOM,
                triggers=("stuck", "Stuck", "hang", "Hang", "hung", "freez", "Freez", "frozen", "Frozen"),
                pattern=r"(?i)\b(?:evaluat\w*|validat\w*)\b"
                + _gap(40, "(?i:hang|hung|stuck|freez|frozen|deadlock|block|work|connect|time ?out|timed out)")
                + r"\b(?:stuck|hangs?|hung|hanging|freez\w*|frozen)\b",
                exclude=(r"(?i)\bnum_workers\b|dataloader",),
                values={"ms": "?", "op": "collective"},
                confidence=0.4,
                confirm="If evaluation runs on some ranks only (`if rank == 0: evaluate(ddp_model)`), the DDP wrapper's "
                "collectives wait for the others: evaluate with `model.module` or on every rank; `py-spy dump` of "
                "each rank confirms where they wait.",
            ),
            Signature(  # prose: "after 30 minutes it reports a timeout" (the default collective timeout)
                role=Role.SYMPTOM,
                triggers=("timeout", "Timeout", "time out", "timed out", "Timed out", "超时"),
                pattern=r"(?i)(?:\b30 ?min\w*|30 ?分钟|\b1800 ?(?:s\b|sec\w*)|\b1800000 ?ms)"
                + _gap(40, "(?i:time ?out|timed out)")
                + r"(?:time ?out|timed out|"
                r"超时)",
                values={"ms": "1800000", "op": "collective"},
                confidence=0.5,
                confirm="The default collective timeout is 30 minutes: if one rank was busy that long (preprocessing, "
                "tokenizing, saving) while the others waited, raising the timeout confirms it.",
            ),
        ),
    )
)

_GATHER_SHAPES = {
    "rank": "?",
    "op": "all_gather",
    "aspects": "tensor shapes",
    "other": "?",
    "other_op": "all_gather with another shape",
}
"""TD456's values for prose about gathering tensors of different shapes."""
_SHAPES_CONFIRM = (
    "Print the tensor's shape on every rank before the call, or run with "
    "`TORCH_DISTRIBUTED_DEBUG=DETAIL`: different shapes confirm it (gather the sizes first, pad to the "
    "largest, then trim)."
)
_FINGERPRINT = r"CollectiveFingerPrint\((?:SequenceNumber=\d+,? ?)?OpType="

TD456 = register(
    Code(
        code="TD456",
        name="collective-mismatch",
        family="rank-divergence",
        severity=Severity.ERROR,
        area="distributed",
        title="ranks called different collectives (TORCH_DISTRIBUTED_DEBUG=DETAIL)",
        message="The ranks called collectives that do not match: rank {rank} ran {op} while rank {other} ran "
        "{other_op} ({aspects}).",
        fix="Make every rank call the same collectives, in the same order, with the same shapes and dtypes: look for "
        "`if rank == 0:` around collectives, data-dependent shapes (pad or gather sizes first), and modules or "
        "parameters used only on some ranks (DDP `find_unused_parameters`).",
        meaning="With TORCH_DISTRIBUTED_DEBUG=DETAIL, torch wraps each collective with a check of its fingerprint "
        "(operation, sequence number, shapes, dtypes) across ranks and raises on the first difference instead "
        "of hanging or reducing garbage.",
        why="Rank-dependent control flow, uneven data (last batch smaller on some ranks), model code that differs "
        "between ranks.",
        false_positives="None known.",
        related=("TD455",),
        signatures=(
            Signature(  # torch >= 1.13 names the other rank's fingerprint; 1.10-1.12 said "running inconsistent collective"
                role=Role.ROOT_CAUSE,
                triggers=("Detected mismatch between collectives",),
                pattern=rf"Detected mismatch between collectives on ranks\. Rank (?P<rank>\d+) is running "
                rf"(?:inconsistent )?collective: {_FINGERPRINT}(?P<op>\w+)"
                rf"(?:.*?but Rank (?P<other>\d+) is running collective: (?:{_FINGERPRINT})?(?P<other_op>\w+)"
                r"(?:.*Collectives differ in the following aspects:\s*(?P<aspects>.*?)\s*$)?)?",
                values={"aspects": "see the fingerprints", "other": "?", "other_op": "another collective"},
                confidence=0.95,
            ),
            Signature(  # NCCL 2.4-2.6's own check (init.cc/init.cu): "Mismatched collective detected, please check ..."
                role=Role.ROOT_CAUSE,
                triggers=("Mismatched collective detected",),
                pattern=r"Mismatched collective detected, please check your collective calls at and around rank "
                r"(?P<rank>\d+)",
                exclude=(r"NET/IB ?: .*collective mismatch error",),
                values={
                    "op": "a collective that did not match its neighbours'",
                    "other": "?",
                    "other_op": "another",
                    "aspects": "NCCL's own check; NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL lists each rank's calls",
                },
                confidence=0.75,
            ),
            Signature(  # prose: "all_gather of variable-length tensors blocks"
                role=Role.SYMPTOM,
                triggers=("all_gather",),
                pattern=r"(?i)\b(?:variable|different|varying|uneven|unequal|dynamic)[- ](?:length|size|shape)s?\b"
                + _gap(80, "all_gather")
                + r"\ball_gather",
                values=_GATHER_SHAPES,
                confidence=0.6,
                confirm=_SHAPES_CONFIRM,
            ),
            Signature(  # "all_gather can only be used when tensors in different gpu have the same shape"
                role=Role.SYMPTOM,
                triggers=("same shape", "same size", "same length", "same dimension", "Same shape", "Same size"),
                pattern=r"(?i)\ball_gather\w*\b"
                + _gap(80, r"(?i:same)")
                + r"\bsame (?:shape|size|length|dimension)s?\b",
                values=_GATHER_SHAPES,
                confidence=0.55,
                confirm=_SHAPES_CONFIRM,
            ),
            Signature(
                role=Role.SYMPTOM,
                triggers=("length", "Length", "size", "Size", "shape", "Shape"),
                pattern=r"(?i)\ball_gather\w*\b"
                + _gap(80, "(?i:length|size|shape)")
                + r"\b(?:variable|different|varying|uneven|unequal|dynamic)[- ]"
                r"(?:length|size|shape)s?\b",
                values=_GATHER_SHAPES,
                confidence=0.6,
                confirm=_SHAPES_CONFIRM,
            ),
        ),
    )
)

TD457 = register(
    Code(
        code="TD457",
        name="torchrun-worker-failed",
        family="dist-hang",
        severity=Severity.WARNING,
        area="distributed",
        title="torchrun reports which worker failed first",
        message="torchrun's agent saw local rank {local_rank} (pid {pid}) fail first with exit code {exitcode}; the "
        "other workers were stopped after it.",
        fix="Read that rank's own output (prefix `[rank{local_rank}]:` or its `--log-dir` files) for its error; a negative "
        "exit code is a signal (-9 SIGKILL: often the OOM killer, -6 SIGABRT, -11 SIGSEGV); `--redirects 3 "
        "--log-dir DIR` keeps each rank's output apart.",
        meaning="torchrun's elastic agent monitors its workers; when one exits non-zero it logs this line, terminates "
        "the others (SIGTERM, exit code -15 in the summary) and raises ChildFailedError with a 'Root Cause (first "
        "observed failure)' section.",
        why="Whatever made that worker exit: its own exception, a signal, the OOM killer.",
        false_positives="It names the first failure torchrun observed on this node; on several nodes compare their "
        "times.",
        related=("TD458", "TD459", "TD454", "TD274"),
        signatures=(
            Signature(
                role=Role.CONFIRMATION,
                triggers=("failed (exitcode:",),
                pattern=r"failed \(exitcode: (?P<exitcode>-?\d+)\) local_rank: (?P<local_rank>\d+) \(pid: (?P<pid>\d+)\)",
                exclude=(r"failed \(exitcode: -9\)",),  # SIGKILL: TD459 (host-oom) reads that line
                confidence=0.6,
            ),
        ),
    )
)

TD458 = register(
    Code(
        code="TD458",
        name="spawned-process-exited",
        family="dist-hang",
        severity=Severity.WARNING,
        area="distributed",
        title="torch.multiprocessing reports a process that ended abnormally",
        message="torch.multiprocessing saw process {process_index} end with {how}; it then terminated the others.",
        fix="Read that process's own output for its error (a negative signal such as SIGKILL prints nothing: look for "
        "the OOM killer with `dmesg -T`).",
        meaning="torch.multiprocessing.spawn / start_processes joins its processes and raises ProcessExitedException "
        "for the first one that exits non-zero or by a signal (ProcessRaisedException when it raised and the "
        "traceback is attached).",
        why="Whatever made that process exit: its own error, a signal, the OOM killer.",
        false_positives="None known.",
        related=("TD457", "TD454", "TD274"),
        signatures=(
            Signature(
                role=Role.CONFIRMATION,
                triggers=("terminated with signal", "terminated with exit code"),
                pattern=r"ProcessExitedException: process (?P<process_index>\d+) terminated with "
                r"(?P<how>signal \w+|exit code -?\d+)",
                confidence=0.6,
            ),
        ),
    )
)

TD459 = register(
    Code(
        code="TD459",
        name="torchrun-worker-sigkilled",
        family="host-oom",
        severity=Severity.WARNING,
        area="distributed",
        title="torchrun reports a worker killed by SIGKILL (exit code -9), most often out of RAM",
        message="torchrun saw a worker (pid {pid}) killed by SIGKILL (exit code -9) without an error of its own: the usual "
        "sender is the kernel's OOM killer or a container/job memory limit.",
        fix="Confirm it on that host: `dmesg -T | grep -iE 'killed process|out of memory'` (or `journalctl -k`), "
        "`kubectl describe pod` (OOMKilled), `sacct -j JOBID -o JobID,State,MaxRSS` (OUT_OF_MEMORY). Then lower the "
        "host RAM each rank needs: every rank loads its own copy of the model and data, so load checkpoints with "
        "`mmap=True` / `low_cpu_mem_usage=True`, use fewer DataLoader workers and a smaller `prefetch_factor`, keep "
        "datasets as numpy/tensor storage instead of Python lists, fewer `--nproc-per-node`, or give the job more memory "
        "(`docker run --memory`, Slurm `--mem`, a larger instance). If a scheduler sent the signal (time limit, "
        "preemption), its own log says so.",
        meaning="A negative exit code is the signal that ended the process; SIGKILL cannot be caught, so the worker "
        "printed nothing and only torchrun's agent and its ChildFailedError summary report it.",
        why="Host (or cgroup) memory ran out while loading a model or dataset in every rank, during evaluation, or through "
        "memory growth in DataLoader workers; less often a scheduler or a person killed the job.",
        false_positives="A time-limit kill or `kill -9` by a person or scheduler looks the same: this confirms a kill, "
        "not its reason.",
        related=("TD274", "TD273", "TD270", "TD457"),
        signatures=(
            Signature(
                role=Role.CONFIRMATION,
                triggers=("failed (exitcode: -9)",),
                pattern=r"failed \(exitcode: -9\) local_rank: (?P<local_rank>\d+) \(pid: (?P<pid>\d+)\)",
                confidence=0.6,
            ),
            Signature(  # the same worker in torchrun's ChildFailedError summary ("exitcode  : -9 (pid: 42)")
                role=Role.CONFIRMATION,
                triggers=(": -9 (pid: ",),
                pattern=r"exitcode\s*: -9 \(pid: (?P<pid>\d+)\)",
                confidence=0.6,
            ),
            Signature(  # DeepSpeed's launcher: "[launch.py:N:sigkill_handler] [...] exits with return code = -9"
                role=Role.CONFIRMATION,
                triggers=("exits with return code = -9",),
                pattern=r"exits with return code = -9\b",
                values={"pid": "see the launcher's line"},
                confidence=0.6,
            ),
        ),
    )
)

TD463 = register(
    Code(
        code="TD463",
        name="default-group-not-initialized",
        family="dist-env",
        severity=Severity.ERROR,
        area="distributed",
        title="a distributed call ran before init_process_group (often a single-GPU run of multi-GPU code)",
        message="A torch.distributed call (get_rank, barrier, all_reduce, SyncBatchNorm...) ran in a process with no "
        "default process group: init_process_group was never called here.",
        fix="Single GPU or no launcher: turn the distributed pieces off: SyncBatchNorm back to BatchNorm "
        "(`norm_cfg=dict(type='BN')`, `nn.SyncBatchNorm` → `nn.BatchNorm2d`), guard calls with "
        "`if dist.is_available() and dist.is_initialized():`, or start a one-process group "
        "(`dist.init_process_group('gloo', init_method='tcp://127.0.0.1:29500', rank=0, world_size=1)`). Several "
        "GPUs: start with the project's launcher (`torchrun --nproc-per-node=N ...`, `--launcher pytorch`) so that "
        "init_process_group runs before the model does.",
        meaning="Every collective and query of torch.distributed uses the default process group that "
        "init_process_group creates; without it they raise at once (older torch: `AssertionError: Default process "
        "group is not initialized`).",
        why="Code written for distributed training run on one GPU without its launcher (SyncBatchNorm layers, "
        "`dist.get_world_size()` in a loss or logger), a `--launcher none` run of a config that still uses SyncBN, "
        "or init_process_group called after the first distributed call.",
        false_positives="None known.",
        related=("TD450", "TD464"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Default process group has not been initialized", "Default process group is not initialized"),
                pattern=r"Default process group (?:has not been|is not) initialized",
                confidence=0.85,
            ),
        ),
    )
)

TD464 = register(
    Code(
        code="TD464",
        name="nccl-not-built",
        family="dist-env",
        severity=Severity.ERROR,
        area="distributed",
        title="the nccl backend was requested from a torch build without NCCL (Windows, macOS, CPU-only)",
        message="init_process_group asked for the nccl backend, but this torch build has no NCCL: Windows and macOS "
        "builds, and CPU-only builds, never include it.",
        fix="On Windows or macOS use the gloo backend (`init_process_group(backend='gloo')`; with Lightning "
        "`strategy=DDPStrategy(process_group_backend='gloo')`), or train on a single GPU without a process group "
        "(the project's single-GPU script, no launcher); for NCCL use Linux with a CUDA build of torch "
        "(`python -c 'import torch; print(torch.cuda.nccl.version())'`).",
        meaning="torch.distributed checks `is_nccl_available()` when the nccl backend is requested and raises this "
        "RuntimeError when the library was not compiled in.",
        why="Multi-GPU (or DDP-by-default) training scripts run on Windows, a CPU-only wheel installed by mistake.",
        false_positives="None known.",
        related=("TD463", "TD450"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("doesn't have NCCL", "does not have NCCL"),
                pattern=r"Distributed package (?:doesn't|does not) have NCCL (?:built|bulit) in",
                confidence=0.9,
            ),
        ),
    )
)

TD465 = register(
    Code(
        code="TD465",
        name="launch-local-rank-argument",
        family="dist-env",
        severity=Severity.ERROR,
        area="distributed",
        title="the script's argument parser rejected the --local_rank / --local-rank that torch.distributed.launch adds",
        message="The training script's argparse rejected `{arg}`, which torch.distributed.launch appends to every "
        "worker's command line.",
        fix="Launch with `torchrun` (it passes LOCAL_RANK in the environment instead) and read "
        "`int(os.environ['LOCAL_RANK'])`; or accept both spellings in the script: "
        "`parser.add_argument('--local-rank', '--local_rank', type=int, default=0)`.",
        meaning="torch.distributed.launch adds `--local_rank=N` (torch >= 2.0: `--local-rank=N`) to the script's "
        "arguments unless `--use-env` is given; a parser that does not declare that spelling exits with "
        "`error: unrecognized arguments` (exit code 2) on every rank.",
        why="A script written for torchrun started with `python -m torch.distributed.launch`, or a script declaring "
        "`--local_rank` run with torch 2.x's launcher, which passes `--local-rank`.",
        false_positives="None known.",
        related=("TD450",),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("unrecognized arguments: --local",),
                pattern=r"error: unrecognized arguments:(?: \S+)*? (?P<arg>--local[-_]rank(?:=\d+)?)",
                confidence=0.9,
            ),
        ),
    )
)

TD448 = register(
    Code(
        code="TD448",
        name="launch-nproc-per-node-invalid",
        family="dist-env",
        severity=Severity.ERROR,
        area="distributed",
        title="torchrun rejected its --nproc-per-node value",
        message="torchrun was given `--nproc-per-node {value}`, which is neither a number of processes nor one of "
        "`gpu`, `cpu`, `auto`, `xpu` (or another device type): it stopped before starting any worker.",
        fix="Pass the number of processes for this node: `torchrun --nproc-per-node=<number of GPUs> train.py` (or "
        "`--nproc-per-node=gpu` to start one per visible GPU). A wrapper script (`dist_train.sh CONFIG GPUS`) "
        "shifted its arguments: give it every positional argument it expects, in its order.",
        meaning="torchrun reads --nproc-per-node as an integer, or as a device type whose device count it uses; "
        "anything else is a ValueError in `determine_local_world_size`.",
        why="A launch script called with its arguments in the wrong order or one missing, so a config path or an empty "
        "variable lands in `--nproc_per_node=$GPUS`.",
        false_positives="None known.",
        related=("TD465", "TD450"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Unsupported nproc_per_node value",),
                pattern=r"Unsupported nproc_per_node value(?:: (?P<value>\S*))?",
                confidence=0.9,
            ),
        ),
    )
)

OMPI_MAPPING = (
    "mpirun -np N -x MASTER_ADDR -x MASTER_PORT bash -c 'RANK=$OMPI_COMM_WORLD_RANK "
    "WORLD_SIZE=$OMPI_COMM_WORLD_SIZE LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK exec python train.py'"
)
"""Open MPI's task numbers as torch's rank variables, expanded inside each task (TD405's fix)."""

TD405 = register(
    Code(
        code="TD405",
        name="dist-launcher-mismatch",
        family="dist-env",
        severity=Severity.ERROR,
        area="distributed",
        title="torch's rank variables disagree with the launcher's",
        message="{diffs}: the {launcher} launcher and torch count a different number of processes (or give them "
        "different ranks), so the world the job was started with is not the world torch initialised.",
        fix="Start exactly WORLD_SIZE processes and let one side number them: under mpirun, derive torch's variables "
        "from the task inside each task (`{mapping}`) or let DeepSpeed discover them (`deepspeed.init_distributed("
        "auto_mpi_discovery=True)`) without also setting WORLD_SIZE by hand; under torchrun or Lightning, do not wrap "
        "the job in mpirun as well.",
        meaning="When a launcher starts one training process per task, torch's RANK, WORLD_SIZE and LOCAL_RANK must be "
        "the launcher's task numbers; different values mean the mapping was computed in the wrong place.",
        why="Variables exported in an sbatch script are evaluated once, on the first node, before srun starts the tasks; "
        "a hard-coded WORLD_SIZE no longer matches after --ntasks or --nodes changed; a framework that starts its own "
        "processes (Lightning, torchrun) run under mpirun, or mpirun started with a different -np than the torch "
        "world size (DeepSpeed's MPI discovery asserts they agree).",
        false_positives="Under torchrun (TORCHELASTIC_RUN_ID set) ranks are torchrun's and the check is skipped; a task "
        "that spawns several ranks itself (WORLD_SIZE a multiple of the task count) is not compared.",
        related=("TD404", "TD403"),
        signatures=(
            Signature(  # DeepSpeed's MPI discovery: assert world_size == ..., "MPI world size {} does not match ..."
                role=Role.ROOT_CAUSE,
                triggers=("does not match torch world size",),
                pattern=r"(?P<diffs>MPI world size \d+ does not match torch world size \d+)",
                values={"launcher": "MPI", "hint": "", "mapping": OMPI_MAPPING},
                confidence=0.85,
            ),
        ),
    )
)

MULTI_NODE = (
    r"(?i:\bmul?t?i[- ]?(?:nodes?|machines?)\b|--nnodes[= ]?[2-9]|\bnode[_-]rank\b|"
    r"\b(?:two|2|three|3|four|4|several|multiple)(?:-| (?:(?!(?:gpu|card|core|cpu|process)(?:e?s)?\b|"
    r"(?:to|of|on|in|at|per|for|and|or|the|with|from|by)\b)[`'\"]?[\w.-]{2,24}[`'\"]? )?)"
    r"(?:nodes?|machines?|servers|hosts|computers?)\b|"
    r"\b(?:second|other) (?:node|machine)s?\b|\bnodes other than\b)|"
    # Chinese: multi-machine (多机, 多台机器), multi-node (多节点), two machines/servers (两台机器/服务器), across nodes
    r"多机|多节点|多台(?:机器|服务器)|两台(?:机器|服务器|主机)|跨节点"
)
"""Words of a run over several machines (where a global rank is not a local GPU index)."""
_MULTI_NODE_WORDS = ("node", "Node", "NODE", "nnodes", "machines", "servers", "hosts", "machine")

TD479 = register(
    Code(
        code="TD479",
        name="global-rank-as-device",
        family="dist-env",
        severity=Severity.ERROR,
        area="distributed",
        title="a multi-node run picked its GPU by the global rank, not the local one",
        message="On a node other than the first, a process asked for a GPU index past the node's GPUs ({evidence}): "
        "the code indexes devices by the global rank (RANK), which counts across all nodes; the GPU of a "
        "process is its LOCAL_RANK.",
        fix="Select the device by the local rank: `torch.cuda.set_device(int(os.environ['LOCAL_RANK']))` (torchrun "
        "sets it; under Slurm `SLURM_LOCALID`), `device = torch.device('cuda', local_rank)`, or in Accelerate/"
        "Transformers `accelerator.local_process_index`; never `rank` or `dist.get_rank()` for a device index.",
        meaning="RANK numbers every process of the job (0 .. WORLD_SIZE-1), LOCAL_RANK only those on one node (0 .. "
        "GPUs per node - 1). On one node they are equal, so the bug shows only once a second node joins. `explain` "
        "also reads TD356 as this code when the log shows several nodes (ranks on several hosts, or the words of a "
        "multi-node run elsewhere in the report).",
        why="`torch.cuda.set_device(rank)` or `cuda:{rank}` written and tested on one machine; a library that returns "
        "the global process index as the device.",
        false_positives="An invalid device ordinal on a single node is TD356 (more processes than GPUs, a hard-coded "
        "index).",
        related=("TD356", "TD450", "TD405"),
        signatures=(
            # Each signature's triggers are the words its pattern ends with: a cut line never matches on its first part
            Signature(  # "Multi-node fine-tuning getting RuntimeError: : CUDA error: invalid device ordinal"
                role=Role.ROOT_CAUSE,
                triggers=("invalid device ordinal",),
                pattern=MULTI_NODE + r"[^\n]{0,160}?invalid device ordinal",
                values={"evidence": "'invalid device ordinal' on a multi-node run"},
                confidence=0.85,
            ),
            Signature(  # "... CUDA error: invalid device ordinal while using multi node"
                role=Role.ROOT_CAUSE,
                triggers=_MULTI_NODE_WORDS,
                pattern=r"invalid device ordinal[^\n]{0,160}?" + MULTI_NODE,
                values={"evidence": "'invalid device ordinal' on a multi-node run"},
                confidence=0.85,
            ),
            Signature(  # "should use `local_rank` instead of `rank`"
                role=Role.SYMPTOM,
                triggers=("rank", "Rank", "RANK"),
                pattern=r"(?i)\blocal[_ ]?rank\b[`'\"]?[^.\n]{0,30}\binstead of\b[^.\n]{0,15}\b(?:global[_ ])?rank\b|"
                r"\b(?:global[_ ]?)?rank\b[`'\"]?[^.\n]{0,30}\binstead of\b[^.\n]{0,15}\blocal[_ ]?rank\b",
                values={"evidence": "the report says the local rank should be used instead of the rank"},
                confidence=0.6,
                confirm="Print `RANK`, `LOCAL_RANK` and `torch.cuda.device_count()` in each process: a device index "
                "equal to RANK and above the count on the second node confirms it.",
            ),
        ),
    )
)

TD466 = register(
    Code(
        code="TD466",
        name="rank-state-diverged",
        family="rank-divergence",
        severity=Severity.WARNING,
        area="distributed",
        title="ranks that should hold the same state do not (parameters, losses, seeds, skipped steps)",
        message="The ranks' state diverged ({what}): a rank-dependent choice (a seed, a skipped step, a condition on "
        "local data) made some ranks differ from the others.",
        fix="Make every rank take the same decisions: seed every rank identically before building the model "
        "(`torch.manual_seed(seed)`; per-rank seeds only for data augmentation), broadcast values chosen on one "
        "rank (`dist.broadcast_object_list`), and decide skips or early stops on all ranks together "
        "(`dist.all_reduce` a flag) instead of returning None or breaking on one rank.",
        meaning="DDP keeps replicas identical only while every rank runs the same steps on the same parameters; a rank "
        "that skips a backward or starts from another seed drifts apart, and a rank that issues fewer "
        "collectives leaves the others waiting.",
        why="Random seeds drawn per process and restored from rank 0's checkpoint, `return None` from a training step "
        "on some ranks (NaN losses), conditions on per-rank data.",
        false_positives="Losses and metrics computed on each rank's own data shard differ by design; parameters must not.",
        related=("TD456", "TD455"),
        signatures=(
            Signature(  # prose: "parameters differ across ranks", "loss is different on every GPU"
                role=Role.SYMPTOM,
                triggers=_RANK_WORDS,
                pattern=r"(?i)\b(?:weights?|parameters?|params|gradients?|models?|seeds?|states?|buffers?|loss(?:es)?)\b"
                + _gap(40, "(?i:rank|gpu|process|device|worker|node|ddp|distributed)")
                + r"\b(?:differ\w*|not the same|not identical|inconsistent|mismatch\w*|"
                r"diverg\w*|out of sync)\b"
                + _gap(40, "(?i:rank|gpu|process|device|worker|node|ddp|distributed)")
                + r"\b(?:across|between|on (?:each|every|different|all)|per|among|for "
                r"(?:each|every))\s+(?:the\s+)?(?:ranks?|gpus?|process(?:es)?|devices?|workers?|nodes?)\b",
                values={"what": "the report says they differ between ranks"},
                confidence=0.6,
                confirm="Compare a checksum on every rank (`print(dist.get_rank(), sum(p.sum().item() for p in "
                "model.parameters()))`) after the same step: different numbers confirm it.",
            ),
            Signature(  # prose: "each DDP process gets a different random seed"
                role=Role.SYMPTOM,
                triggers=("seed",),
                pattern=r"(?i)\b(?:each|every|per)[- ](?:ddp\s+)?(?:process|rank|gpu|worker|node)\b"
                + _gap(60, "(?i:seed)")
                + r"\bdifferent\s+"
                r"(?:random\s+)?seeds?",
                values={"what": "each process drew its own seed"},
                confidence=0.5,
                confirm="Log the seed (or `torch.initial_seed()`) on every rank: different values confirm it.",
            ),
            Signature(  # prose: "returning None from training_step with multi-GPU DDP freezes", "skip the batch on one rank"
                role=Role.SYMPTOM,
                triggers=_RANK_WORDS,
                pattern=r"(?i)\b(?:return(?:s|ing|ed)?\s+None|skip(?:s|ping|ped)?\s+(?:the\s+|a\s+|this\s+|some\s+)?"
                r"(?:training\s+)?(?:steps?|batch(?:es)?|iterations?|backward))\b"
                + _gap(80, "(?i:rank|gpu|process|device|worker|node|ddp|distributed)")
                + r"\b(?:ddp|multi[- ]?gpus?|"
                r"multiple gpus|distributed|ranks?)\b",
                values={"what": "a step skipped on some ranks only"},
                confidence=0.55,
                confirm="Log on every rank whether it skipped the step: a skip on some ranks only (the others then wait in "
                "backward's all-reduce) confirms it.",
            ),
        ),
    )
)
