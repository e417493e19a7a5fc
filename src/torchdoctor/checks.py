"""Run the catalogue's preflight checks, pure functions of facts, against one snapshot.

:func:`run_checks` returns the findings; :func:`audit` also says what was checked and found fine
(:class:`Passed`, one line per subject: /dev/shm, the limits, each ``--path`` ...) and sums up the
machine the way ``python -m torch.utils.collect_env`` users expect to see it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .facts import Facts
from .model import Finding, sort_findings
from .options import CheckOptions
from .registry import Code, all_codes
from .units import human_bytes


def preflight_codes() -> list[Code]:
    """Every code with a check: the registered ones, and the preflight variants of codes declared in log modules."""
    from .catalogue import PREFLIGHT_VARIANTS

    codes = [c for c in all_codes() if c.check is not None and c.status != "retired"]
    have = {c.code for c in codes}
    codes += [v for v in PREFLIGHT_VARIANTS.values() if v.code not in have and v.status != "retired"]
    return sorted(codes, key=lambda c: c.code)


@dataclass
class _Run:
    findings: list[Finding] = field(default_factory=list)
    fired: dict[str, list[Mapping[str, Any]]] = field(default_factory=dict)
    """Code -> the values of each of its hits (a crashed check counts as a hit with no values)."""


def _run(facts: Facts, options: CheckOptions, codes: list[Code] | None) -> _Run:
    run = _Run()
    for code in codes if codes is not None else preflight_codes():
        assert code.check is not None
        try:
            for hit in code.check(facts, options):
                run.findings.append(code.finding(hit))
                run.fired.setdefault(code.code, []).append(hit.values)
        except Exception as exc:  # noqa: BLE001 - a crash is reported, never raised
            run.findings.append(code.crashed(exc))
            run.fired.setdefault(code.code, []).append({})
    run.findings = sort_findings(run.findings)
    return run


def run_checks(facts: Facts, options: CheckOptions | None = None, codes: list[Code] | None = None) -> list[Finding]:
    """Every applicable finding, worst first. A check that raises becomes a finding about itself."""
    return _run(facts, options or CheckOptions(), codes).findings


# -- what was checked and found fine -----------------------------------------------------------------


@dataclass(frozen=True)
class Passed:
    """One thing ``check`` looked at and found fine: no finding of ``codes`` concerns it."""

    area: str
    subject: str
    """What was checked: ``/dev/shm``, ``vm.max_map_count``, a ``--path``."""
    value: str
    """What was found, short: ``62 GiB free of 64 GiB``."""
    detail: str
    """How it was judged, for ``--verbose``, JSON and Markdown."""
    codes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "area": self.area,
            "subject": self.subject,
            "value": self.value,
            "detail": self.detail,
            "codes": list(self.codes),
        }


@dataclass
class Audit:
    """What ``torchdoctor check`` reports: findings, what passed, and the machine in one line."""

    findings: list[Finding]
    passed: list[Passed]
    machine: dict[str, Any]


Describe = Callable[[Facts, CheckOptions], "tuple[str, str] | None"]


@dataclass(frozen=True)
class _Subject:
    area: str
    subject: str
    codes: tuple[str, ...]
    describe: Describe
    """(value, detail) from the facts, or None when the facts to judge it are missing (then it was not checked)."""


def _n(facts: Facts, opts: CheckOptions) -> int:
    from .catalogue._processes import local_processes

    return local_processes(facts, opts).count


def _run_desc(facts: Facts, opts: CheckOptions) -> str:
    from .catalogue.ipc import _run as ipc_run

    run = ipc_run(facts, opts)
    return (
        f"judged for the {run.method or '?'} start method ({run.method_source}) and the {run.strategy or '?'} "
        f"sharing strategy ({run.strategy_source})"
    )


def _shm(facts: Facts, opts: CheckOptions) -> tuple[str, str] | None:
    shm = facts.shm
    size, free = shm.size_bytes, shm.free_bytes
    if not shm.exists or size is None or free is None:
        return None
    n = _n(facts, opts)
    if opts.num_workers:
        need = opts.shm_need_bytes() * n
        judged = (
            f"{n} process(es) × {opts.num_workers} workers × prefetch {opts.prefetch_factor} × "
            f"{human_bytes(opts.batch_bytes)} batches = {human_bytes(need)} in flight fit"
        )
    else:
        judged = "no DataLoader workers hand batches over through it"
    return (
        f"{human_bytes(free)} free of {human_bytes(size)}",
        f"{shm.fstype or 'file system type unknown'} at /dev/shm; {judged}",
    )


def _segments(facts: Facts, opts: CheckOptions) -> tuple[str, str] | None:
    seg = facts.shm.torch_segments
    if not seg:
        return None
    count = seg.count or 0
    detail = (
        f"{count} torch_* segment(s) ({human_bytes(seg.bytes)}), all of running processes"
        if count
        else "no torch_* segments in /dev/shm"
    )
    return "none", detail


def _map_count(facts: Facts, opts: CheckOptions) -> tuple[str, str] | None:
    limit = facts.limits.sysctl.vm.max_map_count
    if limit is None:
        return None
    return (f"{limit:,}", f"memory mappings per process; {_run_desc(facts, opts)}")


def _nofile(facts: Facts, opts: CheckOptions) -> tuple[str, str] | None:
    nofile = facts.limits.rlimits.nofile
    if not nofile:
        return None
    soft = "unlimited" if nofile.soft_unlimited else nofile.soft
    hard = "unlimited" if nofile.hard_unlimited else nofile.hard
    if soft is None:
        return None
    return f"{soft} (hard {hard})", f"RLIMIT_NOFILE soft and hard limit; {_run_desc(facts, opts)}"


def _start_method(facts: Facts, opts: CheckOptions) -> tuple[str, str] | None:
    from .catalogue.ipc import _run as ipc_run

    run = ipc_run(facts, opts)
    if not run.method:
        return None
    how = (
        "the dataset is pickled to every worker"
        if run.pickles_dataset
        else "workers inherit the dataset; only batches are shared"
    )
    return run.method, f"{run.method_source}: {how}"


def _memory(facts: Facts, opts: CheckOptions) -> tuple[str, str] | None:
    avail, total = facts.memory.available_bytes, facts.memory.total_bytes
    if avail is None:
        return None
    value = f"{human_bytes(avail)} available of {human_bytes(total)}"
    cg = facts.cgroup.memory
    if cg.limited and cg.max_bytes is not None:
        value += f", cgroup limit {human_bytes(cg.max_bytes)}"
    from .catalogue.memory import _memory_budget

    budget, where = _memory_budget(facts)
    need = opts.shm_need_bytes() * _n(facts, opts)
    kills = cg.oom_kill_events
    detail = f"in-flight batches ({human_bytes(need)}) fit in {human_bytes(budget)} left ({where}); " + (
        "no OOM kill recorded in this cgroup" if kills == 0 else "this cgroup's OOM kill count is not readable"
    )
    return value, detail


def _rlimit_as(facts: Facts, opts: CheckOptions) -> tuple[str, str] | None:
    parts, limited = [], False
    for lim, name in ((facts.limits.rlimits.as_, "RLIMIT_AS"), (facts.limits.rlimits.data, "RLIMIT_DATA")):
        if not lim:
            return None
        limited = limited or not lim.soft_unlimited
        parts.append(f"{name} " + ("unlimited" if lim.soft_unlimited else human_bytes(lim.soft)))
    return (
        ", ".join(parts) if limited else "unlimited",
        ", ".join(parts) + ": torch's CPU libraries and every DataLoader worker map their memory within it",
    )


def _tasks(facts: Facts, opts: CheckOptions) -> tuple[str, str] | None:
    from .catalogue.memory import tasks_needed

    nproc_lim, cg_pids = facts.limits.rlimits.nproc, facts.cgroup.pids
    if not nproc_lim and not cg_pids:
        return None
    pids = cg_pids.max if cg_pids.limited else None
    rl: int | str | None = None
    if nproc_lim:
        rl = "unlimited" if nproc_lim.soft_unlimited else nproc_lim.soft
    _, _, arithmetic = tasks_needed(facts, opts)
    return (
        f"{'no pids limit' if pids is None else f'pids limit {pids}'}, RLIMIT_NPROC {rl if rl is not None else '?'}",
        f"the run starts at least {arithmetic}",
    )


def _overcommit(facts: Facts, opts: CheckOptions) -> tuple[str, str] | None:
    mode = facts.limits.sysctl.vm.overcommit_memory
    if mode is None:
        return None
    meaning = {0: "heuristic (the default)", 1: "always", 2: "strict"}.get(mode, str(mode))
    return f"{meaning.split(' (')[0]} ({mode})", (
        f"vm.overcommit_memory={mode}, {meaning}: forking workers from a large process is not refused"
    )


def _cpus(facts: Facts, opts: CheckOptions) -> tuple[str, str] | None:
    cpu = facts.cpu
    usable = cpu.usable_cores
    if usable is None:
        return None
    parts = [f"{cpu.logical_cores if cpu.logical_cores is not None else '?'} online"]
    if cpu.affinity_list is not None:
        parts.append(f"affinity {cpu.affinity_list}")
    quota = cpu.cgroup_quota_cpus
    parts.append(f"cgroup quota {quota:g}" if quota is not None else "no cgroup CPU quota")
    pool = cpu.torch_threads_estimate
    n = _n(facts, opts)
    detail = ", ".join(parts) + (f"; {n} process(es) × {pool} torch threads (estimated)" if pool else "")
    return f"{usable:g} usable", detail


def _thread_env(facts: Facts, opts: CheckOptions) -> tuple[str, str] | None:
    if not facts.cpu:
        return None
    env = facts.cpu.thread_env
    value = " ".join(f"{k}={v}" for k, v in sorted(env.items())) if env else "none set"
    cv2 = facts.cpu.cv2.threads
    detail = "OMP_NUM_THREADS, MKL_NUM_THREADS, OPENBLAS_NUM_THREADS and friends" + (
        f"; OpenCV {cv2} thread(s) per process" if cv2 is not None else ""
    )
    return value, detail


def _workers(facts: Facts, opts: CheckOptions) -> tuple[str, str] | None:
    usable = facts.cpu.usable_cores
    if usable is None or "num_workers" in opts.assumed:
        return None  # not judged: --num-workers was not given (see CheckOptions.assumed)
    n = _n(facts, opts)
    workers = n * opts.num_workers
    return (
        f"{workers} on {usable:g} usable CPUs",
        f"{n} process(es) × {opts.num_workers} workers (--num-workers, --nproc-per-node)",
    )


def _torch(facts: Facts, opts: CheckOptions) -> tuple[str, str] | None:
    torch = facts.torch
    if not torch.installed or not torch.version:
        return None
    build = f"CUDA {torch.cuda} build" if torch.cuda else (f"ROCm {torch.hip} build" if torch.hip else "CPU build")
    backends = torch.backends
    have = [b for b, ok in (("gloo", backends.gloo), ("mpi", backends.mpi), ("nccl", backends.nccl)) if ok]
    return (
        f"{torch.version} ({build})",
        f"{torch.location or 'location unknown'}; distributed backends: {', '.join(have) or 'none'}",
    )


def _gpus(facts: Facts, opts: CheckOptions) -> tuple[str, str] | None:
    gpu = facts.gpu
    if not gpu.available:
        return None
    devices = gpu.devices
    names: dict[str, int] = {}
    for d in devices:
        names[str(d.name or "GPU")] = names.get(str(d.name or "GPU"), 0) + 1
    models = ", ".join(f"{k} × {v}" if v > 1 else k for k, v in names.items()) or "?"
    visible = gpu.visible.count
    detail = (
        f"driver {gpu.driver_version or '?'} (CUDA {gpu.cuda_driver_version or '?'}), "
        f"{visible if visible is not None else '?'} visible to the run; free, idle, compute mode and ECC judged"
    )
    return f"{len(devices)}: {models}", detail


def _dist(facts: Facts, opts: CheckOptions) -> tuple[str, str] | None:
    if not (facts.dist.active or opts.dist):
        return None
    env = facts.dist.env
    shown = [f"{k}={env[k]}" for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k in env]
    return (
        " ".join(shown) or "variables from the launcher",
        "ranks, launcher mapping, MASTER_ADDR and MASTER_PORT judged",
    )


#: Subjects in report order; together they cover every preflight code but the ``torchdoctor loader`` ones.
SUBJECTS: tuple[_Subject, ...] = (
    _Subject("shm", "/dev/shm", ("TD101", "TD102", "TD103"), _shm),
    _Subject("shm", "stale torch segments", ("TD104",), _segments),
    _Subject("shm", "vm.max_map_count", ("TD110",), _map_count),
    _Subject("shm", "open files", ("TD111",), _nofile),
    _Subject("shm", "start method", ("TD112",), _start_method),
    _Subject("memory", "memory", ("TD201", "TD202", "TD203", "TD204"), _memory),
    _Subject("memory", "address space", ("TD205",), _rlimit_as),
    _Subject("memory", "processes", ("TD206", "TD207", "TD209"), _tasks),
    _Subject("memory", "overcommit", ("TD208",), _overcommit),
    _Subject("cpu", "CPUs", ("TD250", "TD251"), _cpus),
    _Subject("cpu", "thread variables", ("TD252", "TD253", "TD254"), _thread_env),
    _Subject("loader", "DataLoader workers", ("TD570",), _workers),
    _Subject("gpu", "torch", ("TD302", "TD311"), _torch),
    _Subject(
        "gpu",
        "GPUs",
        ("TD301", "TD303", "TD304", "TD305", "TD306", "TD307", "TD308", "TD309", "TD310", "TD312", "TD313"),
        _gpus,
    ),
    _Subject(
        "distributed",
        "distributed environment",
        (
            "TD401",
            "TD402",
            "TD403",
            "TD404",
            "TD405",
            "TD406",
            "TD407",
            "TD408",
            "TD409",
            "TD410",
            "TD411",
            "TD412",
            "TD413",
        ),
        _dist,
    ),
)
#: Codes judged per ``--path`` entry (their hits name the path in ``path`` or ``paths``).
PATH_CODES = (
    "TD601",
    "TD602",
    "TD603",
    "TD604",
    "TD605",
    "TD606",
    "TD607",
    "TD608",
    "TD609",
    "TD610",
    "TD611",
    "TD612",
    "TD613",
)


def _names(values: Mapping[str, Any]) -> set[str]:
    out = set()
    if values.get("path") is not None:
        out.add(str(values["path"]))
    if values.get("paths") is not None:
        out.update(p.strip() for p in str(values["paths"]).split(", "))
    return out


def _path_passed(facts: Facts, fired: Mapping[str, list[Mapping[str, Any]]]) -> Iterable[Passed]:
    from .catalogue.storage import _entries, _name

    for e in _entries(facts):
        name = _name(e)
        concerned = False
        for code in PATH_CODES:
            for values in fired.get(code, []):
                if not values or name in _names(values):
                    concerned = True
        if concerned or not (e.exists and e.is_dir and e.write_test.ok):
            continue
        fs, m = e.fs, e.mount
        free = fs.free_bytes
        value = "writable" + (f", {human_bytes(free)} free" if free is not None else "")
        space = (
            f"{human_bytes(free)} free of {human_bytes(fs.total_bytes)}" if free is not None else "free space unknown"
        )
        inodes = f"{fs.inodes_free:,} inodes free" if fs.inodes_free is not None else "inodes not counted"
        detail = (
            f"a directory; created, wrote, synced and removed a file in it; {space}, {inodes}; "
            f"{m.fstype or e.fstype or '?'} ({e.fs_kind or '?'}) at {m.mount_point or '?'}"
        )
        yield Passed("storage", name, value, detail, PATH_CODES)


def _passed(facts: Facts, options: CheckOptions, run: _Run, available: set[str]) -> list[Passed]:
    out: list[Passed] = []
    for s in SUBJECTS:
        codes = tuple(c for c in s.codes if c in available)
        if not codes or any(c in run.fired for c in codes):
            continue
        try:
            described = s.describe(facts, options)
        except Exception:  # noqa: BLE001 - odd facts leave the subject out; the checks themselves already ran
            described = None
        if described is not None:
            out.append(Passed(s.area, s.subject, described[0], described[1], codes))
    out += _path_passed(facts, run.fired)
    return out


def machine(facts: Facts) -> dict[str, Any]:
    """The machine at a glance, as ``collect_env`` users expect it: OS, Python, torch, CPUs, memory, GPUs."""
    host, gpu = facts.host, facts.gpu
    names = sorted({str(d.name) for d in gpu.devices if d.name})
    return {
        "os": " ".join(str(x) for x in (host.system, host.kernel, host.machine) if x) or None,
        "python": host.python.version,
        "torch": facts.torch.version,
        "torch_cuda": facts.torch.cuda,
        "cpus": facts.cpu.usable_cores,
        "memory_bytes": facts.memory.total_bytes,
        "gpus": len(gpu.devices) if gpu.available else 0,
        "gpu_models": names if gpu.available else [],
        "gpu_driver": gpu.driver_version,
        "gpu_driver_cuda": gpu.cuda_driver_version,
        "container": host.container.kind if host.container.in_container else None,
    }


def audit(facts: Facts, options: CheckOptions | None = None, codes: list[Code] | None = None) -> Audit:
    """The findings, what was checked and found fine, and the machine: what ``torchdoctor check`` shows."""
    options = options or CheckOptions()
    chosen = codes if codes is not None else preflight_codes()
    run = _run(facts, options, chosen)
    return Audit(run.findings, _passed(facts, options, run, {c.code for c in chosen}), machine(facts))
