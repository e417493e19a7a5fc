"""TD25x: CPU threads: pools of torch, OpenMP/BLAS and OpenCV against the cores a run may use.

Facts read: ``cpu`` (cores, affinity, cgroup quota, thread variables, torch's estimated pool,
OpenCV's pool) and the training processes on this node from :func:`._processes.local_processes`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from ..facts import Facts
from ..facts.cpu import THREAD_ENV, env_threads
from ..model import Severity
from ..options import CheckOptions
from ..registry import Code, Hit, register
from . import PREFLIGHT_VARIANTS
from ._processes import local_processes
from ._util import Evidence, ev
from .log_workers import TD570 as _TD570_LOG

POOL_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _torch_ev(facts: Facts) -> tuple[Evidence, ...]:
    return (
        ev(
            "torch intra-op threads (estimated)",
            facts.cpu.torch_threads_estimate,
            f"rule: {facts.cpu.torch_threads_rule or '?'}",
        ),
    )


def _check_ranks(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    pool, visible = facts.cpu.torch_threads_estimate, facts.cpu.affinity_cores
    procs = local_processes(facts, opts)
    n = procs.count
    if pool is None or visible is None or n < 2 or n * pool <= visible:
        return
    yield Hit(
        {"n": n, "pool": pool, "total": n * pool, "visible": visible, "per_rank": max(1, visible // n)},
        (
            ev("training processes", n, procs.source),
            *_torch_ev(facts),
            ev("CPUs this process may run on", visible, "/proc/self/status Cpus_allowed_list"),
        ),
    )


register(
    Code(
        code="TD250",
        name="rank-threads-oversubscribed",
        family="thread-oversubscription",
        severity=Severity.WARNING,
        area="cpu",
        title="The training processes' torch thread pools add up to more threads than CPUs",
        message="{n} training processes × {pool} torch intra-op threads = {total} busy threads on {visible} CPUs.",
        fix="Give each process its share: `export OMP_NUM_THREADS={per_rank}` before launching (or "
        "`torch.set_num_threads({per_rank})` first thing in each process).",
        meaning="Each process sizes its OpenMP pool to the cores it sees, not to its share of them; the pools then "
        "fight for the same cores and every parallel operator waits for its slowest thread.",
        why="Launchers other than torchrun (mp.spawn, srun, custom scripts) do not set OMP_NUM_THREADS per process.",
        false_positives="torchrun sets OMP_NUM_THREADS=1 itself when it starts more than one process and the variable "
        "is unset; GPU-bound jobs use few CPU threads.",
        related=("TD251", "TD253"),
        check=_check_ranks,
    )
)


def _check_quota(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    cpu = facts.cpu
    quota, visible = cpu.cgroup_quota_cpus, cpu.affinity_cores
    pool, cv2 = cpu.torch_threads_estimate, cpu.cv2.threads
    if quota is None or visible is None or quota >= visible:
        return
    cap = cpu.usable_threads or max(1, int(quota))
    sized = max(v for v in (pool, cv2, 0) if v is not None)
    if sized <= cap:
        return
    evidence = [
        ev("cgroup CPU quota (CPUs)", f"{quota:g}", cpu.cgroup_quota_source or "cpu.max"),
        ev("CPUs visible to the process", visible, "/proc/self/status Cpus_allowed_list"),
        *_torch_ev(facts),
    ]
    if cv2 is not None:
        evidence.append(ev("OpenCV threads", cv2, "cv2.getNumThreads() in a child"))
    pools = []
    if pool is not None and pool > cap:
        pools.append(f"torch will start {pool} intra-op threads")
    if cv2 is not None and cv2 > cap:
        pools.append(f"OpenCV {cv2} threads")
    yield Hit({"quota": f"{quota:g}", "visible": visible, "pools": " and ".join(pools), "cap": cap}, tuple(evidence))


register(
    Code(
        code="TD251",
        name="cpu-quota-below-visible-cores",
        family="thread-oversubscription",
        severity=Severity.WARNING,
        area="cpu",
        title="The cgroup CPU quota is smaller than the CPUs torch sizes its pools from",
        message="The cgroup allows {quota} CPUs of run time but {visible} CPUs are visible; {pools} per process, "
        "which the kernel throttles to the quota.",
        fix="Size the pools from the quota: `export OMP_NUM_THREADS={cap}` (and `torch.set_num_threads({cap})`, "
        "`cv2.setNumThreads({cap})` if you use OpenCV); or request whole CPUs with a cpuset (Kubernetes static CPU "
        "manager policy, Docker `--cpuset-cpus`).",
        meaning="A CPU quota (cpu.max, cfs_quota_us) limits run time per period, not the CPUs a process sees. torch, "
        "OpenMP, BLAS and OpenCV size their pools from the visible CPUs, so a 2-CPU pod on a 64-core node starts "
        "dozens of threads that spend most of each period throttled.",
        why="Kubernetes `resources.limits.cpu` and Docker `--cpus` set a quota but leave every host CPU visible.",
        false_positives="A quota that is rarely reached (mostly idle threads) costs little; check cpu.stat "
        "nr_throttled while training to confirm.",
        related=("TD250", "TD252"),
        check=_check_quota,
    )
)


def _check_cv2(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    threads, usable = facts.cpu.cv2.threads, facts.cpu.usable_threads
    n = local_processes(facts, opts).count
    if not threads or threads <= 1 or opts.num_workers == 0 or usable is None:
        return
    total = n * opts.num_workers * threads
    if total <= usable:
        return
    yield Hit(
        {"threads": threads, "workers": n * opts.num_workers, "total": total, "usable": usable},
        (
            ev("cv2.getNumThreads()", threads, facts.cpu.cv2.source or "cv2 probe"),
            ev("DataLoader workers on this machine", n * opts.num_workers, "--num-workers × processes"),
            ev("usable CPUs", facts.cpu.usable_cores, f"limited by {facts.cpu.usable_limited_by or '?'}"),
        ),
    )


register(
    Code(
        code="TD252",
        name="cv2-threads-in-workers",
        family="thread-oversubscription",
        severity=Severity.WARNING,
        area="cpu",
        title="OpenCV's thread pool in every DataLoader worker oversubscribes the CPUs",
        message="OpenCV uses {threads} threads per process; {workers} workers × {threads} = {total} threads on {usable} "
        "usable CPUs.",
        fix="Call `cv2.setNumThreads(0)` in the worker: `DataLoader(..., worker_init_fn=lambda _: cv2.setNumThreads(0))` "
        "(a module-level function with spawn), or at import in your dataset module.",
        meaning="Each worker that calls OpenCV starts its own pool sized to all CPUs. Workers already run in parallel, "
        "so the pools only compete, and OpenCV pools created before fork can hang in the child.",
        why="OpenCV defaults to one thread per CPU it sees; torch caps its own pool to 1 in workers, not OpenCV's.",
        false_positives="Datasets that do not call OpenCV in workers are unaffected although cv2 is installed.",
        related=("TD251", "TD253"),
        check=_check_cv2,
    )
)


def _check_env_unset(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    env = facts.cpu.thread_env
    visible, usable = facts.cpu.affinity_cores, facts.cpu.usable_threads
    workers = local_processes(facts, opts).count * opts.num_workers
    if any(v in env for v in POOL_VARS) or not visible or not usable or visible < 2 or workers < 2:
        return
    total = workers * visible
    if total <= usable:
        return
    yield Hit(
        {"workers": workers, "visible": visible, "total": total, "usable": usable},
        (
            ev("OMP_NUM_THREADS / MKL_NUM_THREADS / OPENBLAS_NUM_THREADS", "not set", "environment"),
            ev("DataLoader workers on this machine", workers, "--num-workers × processes"),
            ev("CPUs each pool sizes itself to", visible, "/proc/self/status Cpus_allowed_list"),
        ),
    )


register(
    Code(
        code="TD253",
        name="thread-env-unset-with-workers",
        family="thread-oversubscription",
        severity=Severity.INFO,
        area="cpu",
        title="No thread-count variable is set while many workers run",
        message="OMP_NUM_THREADS is not set: OpenMP/BLAS pools that numpy, scipy or OpenCV start in each of {workers} "
        "workers size themselves to {visible} CPUs, up to {total} threads on {usable} usable CPUs.",
        fix="`export OMP_NUM_THREADS=1` (and MKL_NUM_THREADS/OPENBLAS_NUM_THREADS) for the workers, then "
        "`torch.set_num_threads(N)` in the main process for its own pool.",
        meaning="torch sets one intra-op thread in its workers, but other native libraries read only the environment.",
        why="The variables are inherited by workers; nothing sets them by default outside torchrun.",
        false_positives="Workers that only decode files or call torch operators do not start such pools.",
        related=("TD250", "TD252"),
        check=_check_env_unset,
    )
)


def _check_env_invalid(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    env = facts.cpu.thread_env
    for name in THREAD_ENV:
        if name == "MKL_DYNAMIC" or name not in env or env_threads(env[name]) is not None:
            continue
        yield Hit({"name": name, "value": env[name]}, (ev(name, env[name], "environment"),))


register(
    Code(
        code="TD254",
        name="thread-env-invalid",
        family="thread-oversubscription",
        severity=Severity.WARNING,
        area="cpu",
        title="A thread-count variable is not a positive integer and is ignored",
        message="{name}={value!r} is not a positive integer; libraries ignore it and use one thread per core.",
        fix="`export {name}=<n>` with n ≥ 1, or `unset {name}`.",
        meaning="libgomp prints 'Invalid value for environment variable OMP_NUM_THREADS' and falls back to its "
        "default; torch and BLAS libraries ignore the value the same way.",
        why="A typo, an empty value from a template, or 0 meant as 'automatic'.",
        false_positives="None known.",
        related=("TD253",),
        check=_check_env_invalid,
    )
)


# -- TD570 before the run: more DataLoader workers than usable CPUs -------------------------------------
def _cpus(value: float) -> str:
    return f"{value:g}"


def _check_workers_exceed_cpus(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    cpu = facts.cpu
    usable, usable_threads = cpu.usable_cores, cpu.usable_threads
    if usable is None or not usable_threads or opts.num_workers == 0 or "num_workers" in opts.assumed:
        return
    n = local_processes(facts, opts).count
    workers = n * opts.num_workers
    if workers <= usable_threads:
        return
    per = int(usable_threads) // n
    limited = {
        "logical": "the CPUs online",
        "affinity": "its CPU affinity mask",
        "cgroup-quota": "its cgroup CPU quota",
    }.get(str(cpu.usable_limited_by), "?")
    arithmetic = f"{n} training processes × {opts.num_workers}" if n > 1 else f"--num-workers {opts.num_workers}"
    evidence = [ev("DataLoader workers on this machine", f"{arithmetic} = {workers}", "--num-workers × processes")]
    if cpu.affinity_cores is not None:
        evidence.append(ev("CPUs this process may run on", cpu.affinity_cores, "/proc/self/status Cpus_allowed_list"))
    quota = cpu.cgroup_quota_cpus
    if quota is not None:
        evidence.append(ev("cgroup CPU quota (CPUs)", _cpus(quota), cpu.cgroup_quota_source or "cpu.max"))
    evidence.append(ev("usable CPUs", _cpus(usable), f"limited by {limited}"))
    yield Hit(
        {
            "workers": workers,
            "arithmetic": arithmetic,
            "usable": _cpus(usable),
            "limited": limited,
            "n": n,
            "suggest": per if per > 0 else "0 (load in the main process) or 1",
            "suggested": usable_threads,
        },
        tuple(evidence),
    )


PREFLIGHT_VARIANTS["TD570"] = replace(
    _TD570_LOG,
    message="{workers} DataLoader worker processes ({arithmetic}), more than the {usable} CPUs this process may use "
    "(limited by {limited}): the workers compete for cores with each other and with the training loop, so "
    "loading gets slower and can stall or freeze. torch's DataLoader warns about the same at start-up.",
    fix="Lower `num_workers` to at most {suggest} per training process: the CPUs the process may use "
    "(`len(os.sched_getaffinity(0))`, or the cgroup CPU quota when it is lower) divided by the training "
    "processes on the machine, never `os.cpu_count()` alone (it ignores cpusets, containers and other ranks). "
    "Keep each worker single-threaded (`torch.set_num_threads(1)`, `cv2.setNumThreads(0)` in `worker_init_fn`, "
    "`OMP_NUM_THREADS=1`).",
    check=_check_workers_exceed_cpus,
    signatures=(),
)
