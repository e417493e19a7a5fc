"""TD11x: how many tensor storages torch can share between processes before a limit stops it.

torch.multiprocessing moves every tensor storage it pickles for another process into shared
memory. Under the ``file_descriptor`` strategy (torch's Linux default) each such storage keeps one
open descriptor and one memory mapping in the process that shares it; under ``file_system`` it
keeps one mapping (checked here: ``share_memory_()`` on 2000 tensors adds 2000 descriptors and
2000 mappings, resp. 2000 mappings). So ``RLIMIT_NOFILE`` and ``vm.max_map_count`` bound how
many storages can be shared at once, and the start method decides how many that is: with fork
only batches in flight, with spawn/forkserver the whole dataset object.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..facts import Facts
from ..model import Severity
from ..options import CheckOptions
from ..registry import Code, Hit, register
from ._util import ev, human_bytes

#: Shared storages to plan for when the dataset is pickled to workers; below it a limit warns.
SUGGESTED_NOFILE = 65536
#: vm.max_map_count to suggest: 1048576 one-page mappings ≈ 4 GiB of small tensors.
SUGGESTED_MAP_COUNT = 1048576
#: With fork only batches (and what the main process keeps of them) are shared; below this, warn.
LOW_NOFILE = 4096
PICKLING_METHODS = ("spawn", "forkserver")
DEFAULT_PAGE = 4096


@dataclass(frozen=True)
class _Run:
    """The sharing strategy and start method in effect, and where each was taken from."""

    strategy: str | None
    strategy_source: str
    method: str | None
    method_source: str

    @property
    def pickles_dataset(self) -> bool:
        return self.method in PICKLING_METHODS


def _run(facts: Facts, opts: CheckOptions) -> _Run:
    default = facts.torch.default_sharing_strategy
    if opts.sharing_strategy:
        strategy, s_src = opts.sharing_strategy, "--sharing-strategy"
    elif default:
        strategy, s_src = default, "torch's default"
    elif facts.host.system not in (None, "Linux"):
        strategy, s_src = "file_system", f"torch's only strategy on {facts.host.system}"
    else:
        strategy, s_src = "file_descriptor", "torch's default on Linux"
    method: str | None
    if opts.start_method:
        method, m_src = opts.start_method, "--start-method"
    else:
        method = facts.host.python.default_start_method
        version = facts.host.python.version or "?"
        m_src = f"Python {version}'s default"
        if method == "forkserver" and (facts.host.system or "Linux") == "Linux":
            m_src += ": Python 3.14 made forkserver the Linux default"
    return _Run(strategy, s_src, method, m_src)


def _fd_budget(facts: Facts) -> dict[str, Any] | None:
    """Descriptors left under the soft RLIMIT_NOFILE, or None when it is unknown or unlimited."""
    nofile = facts.limits.rlimits.nofile
    if nofile.soft is None:
        return None
    soft, used = nofile.soft, facts.limits.process.open_fds or 0
    hard = nofile.hard
    return {
        "soft": soft,
        "hard": "unlimited" if nofile.hard_unlimited else hard,
        "hard_value": hard,
        "hard_unlimited": bool(nofile.hard_unlimited),
        "open": used,
        "budget": max(soft - used, 0),
    }


def _map_budget(facts: Facts) -> dict[str, Any] | None:
    """Mappings left under vm.max_map_count, and what they hold in one-page tensors."""
    limit = facts.limits.sysctl.vm.max_map_count
    if limit is None:
        return None
    used = facts.limits.process.map_count or 0
    page = facts.limits.process.page_size or DEFAULT_PAGE
    budget = max(limit - used, 0)
    return {
        "limit": limit,
        "used": used,
        "budget": budget,
        "page": human_bytes(page),
        "bytes": human_bytes(budget * page),
    }


def _fd_evidence(fd: dict[str, Any]) -> tuple[Any, ...]:
    return (
        ev("RLIMIT_NOFILE soft", fd["soft"], "getrlimit(RLIMIT_NOFILE)"),
        ev("RLIMIT_NOFILE hard", fd["hard"], "getrlimit(RLIMIT_NOFILE)"),
        ev("open descriptors in this process", fd["open"], "/proc/self/fd"),
    )


def _map_evidence(mp: dict[str, Any]) -> tuple[Any, ...]:
    return (
        ev("vm.max_map_count", mp["limit"], "/proc/sys/vm/max_map_count"),
        ev("mappings in this process", mp["used"], "/proc/self/maps"),
    )


def _run_evidence(run: _Run) -> tuple[Any, ...]:
    return (
        ev("sharing strategy", run.strategy, run.strategy_source),
        ev("start method", run.method or "unknown", run.method_source),
    )


# -- TD110 ------------------------------------------------------------------------------------


def _check_map_count(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    mp, run = _map_budget(facts), _run(facts, opts)
    if mp is None or mp["limit"] >= SUGGESTED_MAP_COUNT:
        return
    fd = _fd_budget(facts)
    if run.strategy == "file_system":
        via = "the file_system strategy"
        severity = Severity.WARNING if run.pickles_dataset else Severity.INFO
    elif run.strategy == "file_descriptor" and run.pickles_dataset:
        nofile_unlimited = facts.limits.rlimits.nofile.soft_unlimited is True
        if not nofile_unlimited and (fd is None or fd["budget"] < mp["budget"]):
            return  # descriptors run out first: TD111
        via = "the file_descriptor strategy (besides its descriptor)"
        severity = Severity.WARNING
    else:
        return
    if run.pickles_dataset:
        context = (
            f"With the {run.method} start method ({run.method_source}) the dataset is pickled to every "
            "worker, so every tensor storage in it is shared at once; past the limit the loader fails with "
            "`unable to mmap N bytes from file </torch_…>: Cannot allocate memory (12)`."
        )
        if run.strategy == "file_descriptor" and fd is not None:
            context += f" RLIMIT_NOFILE ({fd['soft']}) allows more descriptors than that, so mappings run out first."
    else:
        context = (
            f"With the {run.method or 'fork'} start method only batches in flight are shared, far fewer; the "
            "limit is reached by keeping received tensors (e.g. appending every batch to a list) or sending "
            "many tensors through torch.multiprocessing queues."
        )
    yield Hit(
        {
            "limit": mp["limit"],
            "used": mp["used"],
            "budget": mp["budget"],
            "page": mp["page"],
            "bytes": mp["bytes"],
            "via": via,
            "context": context,
            "suggested": SUGGESTED_MAP_COUNT,
        },
        _map_evidence(mp)
        + _run_evidence(run)
        + (
            ev(
                "storages that fit",
                f"{mp['limit']} − {mp['used']} = {mp['budget']} ≈ {mp['bytes']} of {mp['page']} tensors",
                "vm.max_map_count − mappings",
            ),
        ),
        severity=severity,
    )


TD110 = register(
    Code(
        code="TD110",
        name="map-count-bounds-shared-storages",
        family="shm-map-count",
        severity=Severity.WARNING,
        area="shm",
        title="vm.max_map_count bounds how many tensor storages can be shared",
        message="vm.max_map_count is {limit} and this process already has {used} mappings: each tensor storage shared "
        "through {via} costs one mapping, so about {budget} storages fit ({budget} × {page} ≈ {bytes} of "
        "small tensors). {context}",
        fix="Let the loader fork so only batches are shared: `DataLoader(dataset, num_workers=4, "
        'multiprocessing_context="fork")`, or `torch.multiprocessing.set_start_method("fork", force=True)` in the '
        "process that iterates it. Or hold the data in a few large storages (one stacked tensor; numpy arrays are "
        "pickled by value) or load samples lazily in `__getitem__`. Or, as root on the host (the sysctl is not "
        "namespaced, a container cannot set it): `sysctl -w vm.max_map_count={suggested}` and persist it in "
        "/etc/sysctl.d/99-max-map-count.conf.",
        meaning="Every tensor storage moved to shared memory is a separate mmap in the process that shares it (and in the "
        "one that receives it). Linux refuses a process more mappings than vm.max_map_count (65530 by default), so "
        "at one page each about 65k storages ≈ 256 MiB of small tensors can be shared: the 'fails at exactly 250 "
        "MB' that users report.",
        why="With spawn or forkserver the Dataset object is pickled to each worker and torch's reducers share every "
        "tensor storage inside it; a dataset held as a list of many small tensors needs one mapping each. This "
        "happens to a DataLoader created in a process that was itself started with spawn/forkserver (the loader "
        "inherits that start method) and, from Python 3.14, by default on Linux.",
        false_positives="A dataset that keeps its tensors in a few large storages, reads samples lazily from disk, or "
        "holds numpy arrays or Python objects is not affected. The budget is measured in the torchdoctor "
        "process; a training process that imported torch already has a few hundred mappings more.",
        related=("TD111", "TD112"),
        check=_check_map_count,
    )
)


# -- TD111 ------------------------------------------------------------------------------------


def _raise_fix(fd: dict[str, Any], facts: Facts) -> str:
    nr_open = facts.limits.sysctl.fs.nr_open
    if fd["hard_unlimited"] or (fd["hard_value"] is not None and fd["hard_value"] > fd["soft"]):
        target = fd["hard_value"] if not fd["hard_unlimited"] else (nr_open or SUGGESTED_NOFILE)
        hard_expr = "resource.RLIM_INFINITY" if fd["hard_unlimited"] else str(target)
        return (
            f"Raise the soft limit up to the hard limit, which needs no root: `ulimit -n {target}` in the shell "
            "or job script that starts training, or before the loader starts: `import resource; "
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({target}, {hard_expr}))`."
        )
    want = min(SUGGESTED_NOFILE, nr_open) if nr_open else SUGGESTED_NOFILE
    cap = facts.limits.process.cap_sys_resource
    who = (
        "it needs root (CAP_SYS_RESOURCE)"
        if cap is None
        else f"this process has CAP_SYS_RESOURCE, so `ulimit -n {want}` works here"
        if cap
        else "this process lacks CAP_SYS_RESOURCE, so even root cannot raise it from inside"
    )
    return (
        f"The hard limit is {fd['hard']} as well and raising it needs privilege ({who}): Docker `--ulimit "
        f"nofile={want}:{want}`, systemd `LimitNOFILE={want}`, PAM `/etc/security/limits.conf` "
        f"(`* soft nofile {want}` and `* hard nofile {want}`), then start training from the new session."
    )


def _check_nofile(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    fd, run = _fd_budget(facts), _run(facts, opts)
    if fd is None or run.strategy != "file_descriptor":
        return
    mp = _map_budget(facts)
    if run.pickles_dataset:
        if fd["soft"] >= SUGGESTED_NOFILE or (mp is not None and mp["budget"] <= fd["budget"]):
            return  # plenty, or mappings run out first: TD110
        context = (
            f"With the {run.method} start method ({run.method_source}) the dataset is pickled to every "
            "worker and each tensor storage in it is shared, so a dataset with more fails with `Too many open "
            "files (24)`."
        )
    else:
        if fd["soft"] >= LOW_NOFILE:
            return
        context = (
            f"With the {run.method or 'fork'} start method batches in flight and every batch the main process "
            "keeps (e.g. appended to a list) hold one each; past the limit descriptors sent by workers are "
            "dropped and the loader fails with `received 0 items of ancdata` or `Too many open files`."
        )
    yield Hit(
        {
            "soft": fd["soft"],
            "hard": fd["hard"],
            "open": fd["open"],
            "budget": fd["budget"],
            "source": run.strategy_source,
            "context": context,
            "raise_fix": _raise_fix(fd, facts),
        },
        _fd_evidence(fd)
        + _run_evidence(run)
        + (
            ev(
                "storages that can be shared at once",
                f"{fd['soft']} − {fd['open']} = {fd['budget']}",
                "soft limit − open descriptors",
            ),
        ),
    )


TD111 = register(
    Code(
        code="TD111",
        name="nofile-bounds-shared-storages",
        family="fd-exhausted",
        severity=Severity.WARNING,
        area="shm",
        title="The open-file limit bounds how many tensor storages can be shared",
        message="RLIMIT_NOFILE is {soft} (soft) / {hard} (hard) and this process has {open} open: with the "
        "file_descriptor strategy ({source}) every shared tensor storage alive keeps one descriptor, so about "
        "{budget} can exist at once. {context}",
        fix="{raise_fix} Or share through file names instead, right after `import torch`: "
        '`torch.multiprocessing.set_sharing_strategy("file_system")` (then vm.max_map_count bounds the count, '
        'see TD110). With spawn/forkserver, `DataLoader(..., multiprocessing_context="fork")` shares batches only.',
        meaning="torch's default sharing strategy on Linux passes each shared storage as a file descriptor over a Unix "
        "socket and keeps it open for as long as the storage lives, so the number of storages alive in one "
        "process is bounded by its soft RLIMIT_NOFILE.",
        why="Many distributions and batch schedulers start processes with a soft limit of 1024. Workers then fail to "
        "send descriptors (the socket silently drops them past the limit, surfacing as `received 0 items of "
        "ancdata`), and sharing a dataset of many small tensors with spawn/forkserver fails with `Too many open "
        "files`.",
        false_positives="A loader whose consumer frees each batch before the next keeps only workers × prefetch_factor "
        "× tensors-per-batch descriptors, which fits in 1024; the thresholds (4096 with fork, "
        f"{SUGGESTED_NOFILE} with spawn/forkserver) are rules of thumb.",
        related=("TD110", "TD112"),
        check=_check_nofile,
    )
)


# -- TD112 ------------------------------------------------------------------------------------


def _check_start_method(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    run = _run(facts, opts)
    if not run.pickles_dataset:
        return
    fd, mp = _fd_budget(facts), _map_budget(facts)
    if fd is not None:
        fd_text = f"about {fd['budget']} under file_descriptor (RLIMIT_NOFILE soft {fd['soft']} − {fd['open']} open)"
    elif facts.limits.rlimits.nofile.soft_unlimited:
        fd_text = "no descriptor limit under file_descriptor (RLIMIT_NOFILE unlimited)"
    else:
        fd_text = "an unknown number under file_descriptor (RLIMIT_NOFILE not read)"
    if mp is not None:
        mp_text = (
            f"about {mp['budget']} under file_system (vm.max_map_count {mp['limit']} − {mp['used']} mappings "
            f"≈ {mp['bytes']} of {mp['page']} tensors)"
        )
    else:
        mp_text = "an unknown number under file_system (vm.max_map_count not read)"
    evidence = _run_evidence(run)
    evidence += _fd_evidence(fd) if fd is not None else ()
    evidence += _map_evidence(mp) if mp is not None else ()
    yield Hit(
        {
            "method": run.method,
            "method_source": run.method_source,
            "fd_text": fd_text,
            "map_text": mp_text,
            "strategy": run.strategy,
            "strategy_source": run.strategy_source,
        },
        evidence,
    )


TD112 = register(
    Code(
        code="TD112",
        name="start-method-shares-dataset",
        family="fd-exhausted",
        severity=Severity.INFO,
        area="shm",
        title="spawn/forkserver workers get the whole dataset through shared memory",
        message="DataLoader workers will be started with {method} ({method_source}): a DataLoader without "
        "`multiprocessing_context` uses the start method of the process iterating it, so the dataset is pickled "
        "to every worker and every tensor storage in it is shared. This host allows {fd_text} and {map_text}; "
        "the run uses {strategy} ({strategy_source}).",
        fix="If the dataset holds many tensors, give the loader a fork context: `DataLoader(dataset, num_workers=4, "
        'multiprocessing_context="fork")` (or `torch.multiprocessing.set_start_method("fork", force=True)` at the '
        "top of the process that trains); otherwise keep the data in a few large storages or load samples lazily "
        "in `__getitem__`. Pass `--start-method` to torchdoctor to check the method your run really uses.",
        meaning="fork copies the parent's memory into each worker, so only the batches workers return are shared. spawn "
        "and forkserver start fresh interpreters and pickle the Dataset to each of them; torch's reducers move "
        "every tensor storage inside it to shared memory, each costing a descriptor (file_descriptor) and a "
        "mapping (both strategies).",
        why="The start method is inherited: a training function run in a `multiprocessing.Process` created with spawn "
        "or forkserver (a supervisor, a job scheduler, torch.multiprocessing.spawn) makes its DataLoader spawn/"
        "forkserver too. Python 3.14 changed the Linux default start method from fork to forkserver.",
        false_positives="Harmless for datasets that keep paths or numpy arrays and load tensors in `__getitem__`. fork is "
        "not a free fix: threads or a CUDA context in the parent are not carried over to forked workers.",
        related=("TD110", "TD111"),
        check=_check_start_method,
    )
)
