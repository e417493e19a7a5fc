"""TD450-TD479: torch.distributed rendezvous, gloo collectives and launcher summaries in logs (``explain``).

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

_FIRST = ("Find the first rank that failed (torchrun's 'Root Cause (first observed failure)', the earliest "
          "traceback) and fix its own error; ")

TD450 = register(Code(
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
            values={"var": "RANK, WORLD_SIZE, MASTER_ADDR or MASTER_PORT (its name was in the part of the "
                           "traceback that is missing)"},
            confidence=0.9,
        ),
    ),
))

TD451 = register(Code(
    code="TD451",
    name="dist-store-port-in-use",
    family="dist-port",
    severity=Severity.ERROR,
    area="distributed",
    title="the rendezvous store could not listen: the port is already in use",
    message="Rank 0's TCPStore could not listen on port {port}: address already in use (EADDRINUSE). Another process "
            "on this host (often a previous run that has not exited) holds it.",
    fix="Find the holder: `ss -ltnp 'sport = :{port}'`; end a stale run of yours, or use another port for every rank "
        "(`export MASTER_PORT=$(python -c 'import socket; s=socket.socket(); s.bind((\"\", 0)); "
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
    ),
))

TD452 = register(Code(
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
))

TD453 = register(Code(
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
    ),
))

TD454 = register(Code(
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
))

TD455 = register(Code(
    code="TD455",
    name="gloo-collective-timeout",
    family="dist-hang",
    severity=Severity.ERROR,
    area="distributed",
    title="a gloo collective timed out waiting for another rank",
    message="A gloo collective waited {ms} ms for data from another rank and gave up ({op} operation): some rank did "
            "not reach the same collective in time (hung, slower, took another code path, or died).",
    fix=_FIRST + "if no rank failed, find the one that hangs (`py-spy dump --pid PID` on each rank), look for "
        "rank-dependent code paths around the collective, and run with `TORCH_DISTRIBUTED_DEBUG=DETAIL` or "
        "`dist.monitored_barrier()` to name the missing rank.",
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
    ),
))

_FINGERPRINT = r"CollectiveFingerPrint\((?:SequenceNumber=\d+,? ?)?OpType="

TD456 = register(Code(
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
    ),
))

TD457 = register(Code(
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
))

TD458 = register(Code(
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
))

TD459 = register(Code(
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
    ),
))
