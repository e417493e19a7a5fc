"""TD20x: memory and process-count limits: cgroup memory and pids, RLIMIT_AS/DATA/NPROC, overcommit.

Facts read: ``memory`` (/proc/meminfo), ``cgroup`` (memory and pids controllers), ``limits``
(rlimits and ``vm.overcommit_memory``), ``cpu.torch_threads_estimate`` and ``host.uid``; the
training processes on this node come from :func:`._processes.local_processes`.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..facts import Facts
from ..model import Severity
from ..options import CheckOptions
from ..registry import Code, Hit, register
from ._processes import local_processes
from ._util import ev, human_bytes


def tasks_needed(facts: Facts, opts: CheckOptions) -> tuple[int, int, str]:
    """(processes, tasks, arithmetic) a run starts at least: each rank runs torch's intra-op pool
    plus a pin-memory thread; each DataLoader worker runs one thread (torch sets 1 in workers)."""
    n, w = local_processes(facts, opts).count, opts.num_workers
    pool = facts.cpu.torch_threads_estimate or 1
    processes = n * (1 + w)
    tasks = n * (pool + 1 + w)
    text = f"{n} process(es) × (1 + {w} workers) = {processes} processes; {n} × ({pool} torch threads + 1 pin-memory thread + {w} workers) = {tasks} tasks"
    return processes, tasks, text


def _memory_budget(facts: Facts) -> tuple[int | None, str]:
    """Bytes a new run may still use: host MemAvailable, or the cgroup's headroom if smaller."""
    avail = facts.memory.available_bytes
    budget, where = avail, "host MemAvailable"
    cg = facts.cgroup.memory
    if cg.limited and cg.max_bytes is not None:
        used = cg.working_set_bytes or cg.current_bytes or 0
        room = max(0, cg.max_bytes - used)
        if budget is None or room < budget:
            budget, where = room, "cgroup memory limit less its current use"
    return budget, where


def _check_cgroup_limit(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    cg = facts.cgroup.memory
    limit, total = cg.max_bytes, facts.memory.total_bytes
    if not cg.limited or limit is None or (total is not None and limit >= total):
        return
    yield Hit(
        {"limit": human_bytes(limit), "total": human_bytes(total), "version": facts.cgroup.version},
        (
            ev("cgroup memory limit", human_bytes(limit), cg.max_source or ""),
            ev("host RAM (what free, psutil and /proc/meminfo show)", human_bytes(total), "/proc/meminfo MemTotal"),
        ),
    )


register(
    Code(
        code="TD201",
        name="cgroup-memory-limit",
        family="host-oom",
        severity=Severity.INFO,
        area="memory",
        title="A cgroup memory limit is smaller than the host's RAM",
        message="This process runs under a cgroup v{version} memory limit of {limit}; the host has {total}, which is what "
        "free, psutil and /proc/meminfo report inside the container.",
        fix="Size workers, prefetch and caches from the limit, not from host RAM. To raise it: Docker `--memory=<size>`, "
        "Kubernetes `resources.limits.memory`, Slurm `--mem`.",
        meaning="Every process of the cgroup (the training processes, their DataLoader workers, and the tmpfs pages of "
        "/dev/shm they write) is charged to one budget. Past it the kernel's OOM killer sends SIGKILL.",
        why="Container runtimes and batch schedulers enforce the memory request with a cgroup limit.",
        false_positives="None: this is information, so the numbers in later findings can be read against the limit.",
        related=("TD202", "TD203", "TD204"),
        check=_check_cgroup_limit,
    )
)


def _check_near_limit(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    cg = facts.cgroup.memory
    limit = cg.max_bytes
    used = cg.working_set_bytes
    if not cg.limited or not limit or used is None:
        return
    share = used / limit
    if share < 0.8:
        return
    yield Hit(
        {"used": human_bytes(used), "limit": human_bytes(limit), "percent": f"{share:.0%}"},
        (
            ev("cgroup memory in use (less reclaimable page cache)", human_bytes(used), cg.current_source or ""),
            ev("inactive page cache", human_bytes(cg.inactive_file_bytes), "memory.stat"),
            ev("cgroup memory limit", human_bytes(limit), cg.max_source or ""),
        ),
        severity=Severity.ERROR if share >= 0.95 else None,
    )


register(
    Code(
        code="TD202",
        name="cgroup-memory-near-limit",
        family="host-oom",
        severity=Severity.WARNING,
        area="memory",
        title="The cgroup is already close to its memory limit",
        message="The cgroup uses {used} of its {limit} memory limit ({percent}) before training starts.",
        fix="Find what holds the memory (`ps -eo pid,rss,cmd --sort=-rss | head`, stale processes, files in /dev/shm), "
        "or raise the limit (Docker `--memory`, Kubernetes `resources.limits.memory`).",
        meaning="Little of the memory limit is left for the run; the first epoch's growth ends in an OOM kill.",
        why="Other processes of the same container or pod, earlier runs' leftovers in /dev/shm (tmpfs pages are charged "
        "to the cgroup), or a notebook kernel holding tensors.",
        false_positives="Page cache the kernel can reclaim is subtracted (inactive_file), but active file cache is not.",
        related=("TD201", "TD203"),
        check=_check_near_limit,
    )
)


def _check_oom_kills(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    cg = facts.cgroup.memory
    kills = cg.oom_kill_events
    if not kills:
        return
    yield Hit(
        {"kills": kills, "source": cg.events_source or "memory.events"},
        (
            ev("oom_kill", kills, cg.events_source or ""),
            ev("cgroup memory limit", human_bytes(cg.max_bytes), cg.max_source or ""),
        ),
    )


register(
    Code(
        code="TD203",
        name="cgroup-oom-kills",
        family="host-oom",
        severity=Severity.WARNING,
        area="memory",
        title="The OOM killer has already killed processes in this cgroup",
        message="The kernel has OOM-killed {kills} process(es) in this cgroup ({source}).",
        fix="Match the kill times with `dmesg -T | grep -i 'killed process'` (on the host), then lower num_workers or "
        "prefetch_factor, keep datasets as numpy arrays or tensors instead of Python lists of objects, or raise the limit.",
        meaning="A process that died with SIGKILL (exit code -9 or 137, 'DataLoader worker (pid N) is killed by signal: "
        "Killed') was most likely one of these kills.",
        why="The cgroup reached its memory limit and the kernel found nothing more to reclaim.",
        false_positives="The counter covers the whole cgroup since it was created, including earlier runs and other "
        "programs in the same container.",
        related=("TD201", "TD202", "TD273"),
        check=_check_oom_kills,
    )
)


def _check_budget(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    budget, where = _memory_budget(facts)
    procs = local_processes(facts, opts)
    n = procs.count
    need = opts.shm_need_bytes() * n
    if budget is None or need == 0 or need <= budget:
        return
    arithmetic = (
        f"{n} process(es) × {opts.num_workers} workers × prefetch {opts.prefetch_factor} × "
        f"{human_bytes(opts.batch_bytes)} batches = {human_bytes(need)}"
    )
    yield Hit(
        {"budget": human_bytes(budget), "where": where, "arithmetic": arithmetic},
        (
            ev("memory left", human_bytes(budget), where),
            ev("host MemAvailable", human_bytes(facts.memory.available_bytes), "/proc/meminfo"),
            ev("in-flight batches", arithmetic, "--num-workers, --prefetch-factor, --batch-bytes"),
            ev("training processes on this node", n, procs.source),
        ),
    )


register(
    Code(
        code="TD204",
        name="memory-too-low-for-batches",
        family="host-oom",
        severity=Severity.ERROR,
        area="memory",
        title="Less memory is left than the batches DataLoader workers keep in flight",
        message="Only {budget} of memory is left ({where}); {arithmetic} are needed for batches alone.",
        fix="Lower num_workers, prefetch_factor or the batch size, stop what holds memory, or raise the limit "
        "(Docker `--memory`, Kubernetes `resources.limits.memory`).",
        meaning="Batches that workers have produced but the main process has not consumed live in RAM (in /dev/shm, "
        "which is RAM). When they do not fit, the OOM killer ends a worker or the main process.",
        why="A small container limit, other processes on the host, or large prefetch settings.",
        false_positives="The estimate is the worst case (every worker holding prefetch_factor full batches); "
        "--batch-bytes is your estimate.",
        related=("TD201", "TD102"),
        check=_check_budget,
    )
)


def _check_rlimit_as(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    total = facts.memory.total_bytes
    cg = facts.cgroup.memory.max_bytes if facts.cgroup.memory.limited else None
    usable = min(v for v in (total, cg) if v is not None) if (total or cg) else None
    source = facts.limits.rlimits_source or "getrlimit"
    rlimits = facts.limits.rlimits
    for lim, const, flag in ((rlimits.as_, "RLIMIT_AS", "-v"), (rlimits.data, "RLIMIT_DATA", "-d")):
        soft = lim.soft
        if soft is None:
            continue
        yield Hit(
            {"const": const, "soft": human_bytes(soft), "usable": human_bytes(usable), "flag": flag},
            (
                ev(f"{const} soft limit", soft, source),
                ev(f"{const} hard limit", lim.hard or "unlimited", source),
                ev("memory the machine would otherwise give", human_bytes(usable), "/proc/meminfo, cgroup"),
            ),
            severity=Severity.ERROR if usable is None or soft < usable else None,
        )


register(
    Code(
        code="TD205",
        name="rlimit-address-space",
        family="host-oom",
        severity=Severity.WARNING,
        area="memory",
        title="RLIMIT_AS or RLIMIT_DATA caps every process's memory",
        message="{const} is {soft} per process (the machine would give {usable}); allocations past it fail.",
        fix="Remove the limit before starting training: `ulimit -S {flag} unlimited` (up to the hard limit), or drop it "
        "from /etc/security/limits.conf, the Slurm or job script that sets it.",
        meaning="Each process (the main one and every DataLoader worker, which inherit it) may map at most this much. "
        "torch reports 'DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes. Error code 12 "
        "(Cannot allocate memory)'; CUDA reserves large virtual ranges and fails to initialise under RLIMIT_AS.",
        why="Cluster login profiles and some schedulers set `ulimit -v` to protect shared machines; RLIMIT_AS counts "
        "virtual address space (libraries, thread stacks, malloc arenas), far more than memory in use.",
        false_positives="A limit above what the run needs is harmless for CPU-only jobs; RLIMIT_DATA counts private "
        "writable mappings only.",
        related=("TD201", "TD208", "TD270"),
        check=_check_rlimit_as,
    )
)


def _check_pids(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    pids = facts.cgroup.pids
    limit = pids.max
    if not pids.limited or limit is None:
        return
    current = pids.current or 0
    room = limit - current
    processes, tasks, arithmetic = tasks_needed(facts, opts)
    if room >= tasks:
        return
    yield Hit(
        {"limit": limit, "current": current, "room": room, "arithmetic": arithmetic, "suggest": max(tasks * 4, 1024)},
        (
            ev("pids.max", limit, pids.max_source or ""),
            ev("pids.current", current, pids.current_source or ""),
            ev("needed at least", arithmetic, "--nproc-per-node, --num-workers, cpu.torch_threads_estimate"),
        ),
        severity=Severity.ERROR if room < processes else None,
    )


register(
    Code(
        code="TD206",
        name="pids-limit-low",
        family="worker-crash",
        severity=Severity.WARNING,
        area="memory",
        title="The cgroup's pids limit leaves too few tasks for the workers and their threads",
        message="pids.max is {limit} with {current} tasks in use, so {room} more can start; the run needs at least "
        "{arithmetic}.",
        fix="Raise the limit (Docker `--pids-limit={suggest}`, Kubernetes kubelet `podPidsLimit`), or lower num_workers "
        "and cap thread pools (`OMP_NUM_THREADS`).",
        meaning="pids.max counts threads as well as processes. When it is reached, fork() and pthread_create() fail "
        "with EAGAIN ('Resource temporarily unavailable'): DataLoader workers fail to start or native thread "
        "pools abort.",
        why="Container runtimes and Kubernetes set per-container or per-pod pids limits; every worker and every "
        "OpenMP, OpenCV or BLAS pool thread is one task.",
        false_positives="The thread count is a lower bound; libraries that start more threads need more room.",
        related=("TD207", "TD209", "TD250", "TD280"),
        check=_check_pids,
    )
)


def _check_pids_hit(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    pids = facts.cgroup.pids
    refused = pids.max_events
    if not refused:
        return
    yield Hit(
        {"refused": refused, "limit": pids.max if pids.max is not None else "?"},
        (ev("pids.events max", refused, pids.events_source or ""), ev("pids.max", pids.max, pids.max_source or "")),
    )


register(
    Code(
        code="TD207",
        name="pids-limit-reached",
        family="worker-crash",
        severity=Severity.WARNING,
        area="memory",
        title="The pids limit has already refused new processes or threads",
        message="The kernel has refused {refused} fork/clone call(s) in this cgroup at pids.max={limit}.",
        fix="Raise the pids limit (Docker `--pids-limit`, Kubernetes `podPidsLimit`), or lower num_workers and thread "
        "pools (`OMP_NUM_THREADS=1` in workers, `cv2.setNumThreads(0)`).",
        meaning="Some process of this cgroup could not start a process or thread; DataLoader workers that 'exited "
        "unexpectedly' or 'Resource temporarily unavailable' errors came from this.",
        why="More tasks than pids.max were running at some point.",
        false_positives="The counter covers the whole cgroup since it was created, including earlier runs.",
        related=("TD206", "TD280"),
        check=_check_pids_hit,
    )
)


def _check_overcommit(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    if facts.limits.sysctl.vm.overcommit_memory != 2:
        return
    limit, committed = facts.memory.commit_limit_bytes, facts.memory.committed_bytes
    room = limit - committed if limit is not None and committed is not None else None
    need = opts.shm_need_bytes() * local_processes(facts, opts).count
    yield Hit(
        {"limit": human_bytes(limit), "committed": human_bytes(committed), "room": human_bytes(room)},
        (
            ev("vm.overcommit_memory", 2, "/proc/sys/vm/overcommit_memory"),
            ev("CommitLimit", human_bytes(limit), "/proc/meminfo"),
            ev("Committed_AS", human_bytes(committed), "/proc/meminfo"),
        ),
        severity=Severity.ERROR if room is not None and room < need else None,
    )


register(
    Code(
        code="TD208",
        name="overcommit-strict",
        family="host-oom",
        severity=Severity.WARNING,
        area="memory",
        title="vm.overcommit_memory=2: every allocation and fork is charged against a fixed commit limit",
        message="Strict overcommit accounting is on: {committed} of the {limit} commit limit is taken, {room} left.",
        fix="On a host you administer: `sysctl -w vm.overcommit_memory=0` (heuristic, the default); otherwise use fewer "
        "workers and smaller prefetch, or ask for a node without strict accounting.",
        meaning="With policy 2 the kernel refuses any allocation past CommitLimit (swap + overcommit_ratio% of RAM). "
        "fork() of a large training process charges a full copy of its writable memory for each DataLoader "
        "worker and fails with ENOMEM ('Cannot allocate memory') even though pages are shared copy-on-write.",
        why="Some HPC and database hosts enable strict accounting to avoid the OOM killer.",
        false_positives="Jobs that stay far below CommitLimit, with num_workers=0, are unaffected.",
        related=("TD205",),
        check=_check_overcommit,
    )
)


def _check_nproc_rlimit(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    soft = facts.limits.rlimits.nproc.soft
    if soft is None or facts.host.uid == 0 or facts.limits.process.cap_sys_resource:
        return
    processes, tasks, arithmetic = tasks_needed(facts, opts)
    if soft >= tasks:
        return
    yield Hit(
        {"soft": soft, "arithmetic": arithmetic, "suggest": max(tasks * 4, 4096)},
        (
            ev("RLIMIT_NPROC soft limit", soft, facts.limits.rlimits_source or "getrlimit"),
            ev("needed at least", arithmetic, "--nproc-per-node, --num-workers, cpu.torch_threads_estimate"),
        ),
        severity=Severity.ERROR,
    )


register(
    Code(
        code="TD209",
        name="rlimit-nproc-low",
        family="worker-crash",
        severity=Severity.ERROR,
        area="memory",
        title="RLIMIT_NPROC is below the processes and threads the run starts",
        message="RLIMIT_NPROC (`ulimit -u`) is {soft} for this user, below {arithmetic}.",
        fix="`ulimit -S -u {suggest}` before starting (up to the hard limit), or raise nproc in "
        "/etc/security/limits.conf; lower num_workers and set OMP_NUM_THREADS.",
        meaning="RLIMIT_NPROC bounds the tasks (processes and threads) of one user on the whole host. Past it fork() "
        "and pthread_create() fail with EAGAIN ('Resource temporarily unavailable').",
        why="Shared machines cap processes per user in limits.conf; the count includes the user's other jobs.",
        false_positives="root and processes with CAP_SYS_RESOURCE are exempt, so they are not reported.",
        related=("TD206", "TD280"),
        check=_check_nproc_rlimit,
    )
)
