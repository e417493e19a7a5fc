"""TD51x-52x: what starting a real DataLoader's workers will cost, predicted by ``torchdoctor loader``.

These checks judge the ``loader`` facts section that the loader probe (:mod:`torchdoctor.probes`)
measures on the user's own DataLoader, against the host limits (``limits``, ``shm``, ``cpu``
sections). Without a ``loader`` section (``torchdoctor check``) they yield nothing. The
section's schema is in ``docs/loader.md``; the arithmetic follows TD110-TD112: under spawn or
forkserver every distinct tensor storage pickled to the workers costs one memory mapping in the
process that starts them (and in each worker), plus one descriptor under ``file_descriptor``,
and its bytes in /dev/shm.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..facts import Facts
from ..model import Severity
from ..options import CheckOptions
from ..registry import Code, Hit, register
from ._util import ev, human_bytes

PICKLING = ("spawn", "forkserver")
#: Past this share of a limit a prediction warns: the dataset need only double to fail.
WARN_SHARE = 0.5
MAP_COUNT_FLOOR = 262144


def _static(facts: Facts) -> dict[str, Any] | None:
    return facts.loader.static


def _method(st: dict[str, Any]) -> tuple[str | None, str]:
    m = st.get("start_method") or {}
    return m.get("method"), m.get("source", "")


def _strategy(st: dict[str, Any]) -> tuple[str | None, str]:
    s = st.get("sharing_strategy") or {}
    return s.get("strategy"), s.get("source", "")


def _severity(need: int, limit: int) -> Severity | None:
    if need > limit:
        return Severity.ERROR
    if need > WARN_SHARE * limit:
        return Severity.WARNING
    return None


def _pow2_at_least(n: int) -> int:
    p = MAP_COUNT_FLOOR
    while p < n:
        p *= 2
    return p


def _fork_fix(owner: dict[str, Any]) -> tuple[bool, str]:
    threads, cuda = owner.get("python_threads", 1), owner.get("cuda_initialized", False)
    safe = threads <= 1 and not cuda
    why = (
        "safe here: no CUDA context and one Python thread in the process that starts the workers"
        if safe
        else f"only if that is safe: this process has {threads} Python thread(s)"
        + (" and an initialised CUDA context" if cuda else "")
        + "; fork copies locks held by other threads "
        "and cannot carry a CUDA context"
    )
    return safe, (
        f'`DataLoader(..., multiprocessing_context="fork")` (one argument; {why}): workers inherit the '
        "dataset and only batches are shared"
    )


def ranked_fixes(facts: Facts, st: dict[str, Any], binding: str) -> str:
    """The fixes for a sharing-cost failure, cheapest first, with this loader's numbers."""
    owner, stor = st.get("owner") or {}, st.get("storages") or {}
    n = int(stor.get("count", 0))
    strategy, _ = _strategy(st)
    safe, fork = _fork_fix(owner)
    steps = [fork] if safe else []
    maps_limit = facts.limits.sysctl.vm.max_map_count
    soft = owner.get("nofile_soft")
    if binding == "maps" and strategy == "file_system" and (soft is None or n + owner.get("open_fds", 0) < soft):
        steps.append(
            'share by descriptor instead: `torch.multiprocessing.set_sharing_strategy("file_descriptor")` '
            f"(RLIMIT_NOFILE {soft if soft is not None else 'unlimited'} allows {n} descriptors); it still "
            "costs one mapping per storage, so this only helps together with a smaller count"
        )
    if binding == "fds" and maps_limit and n + owner.get("map_count", 0) < maps_limit:
        steps.append(
            'share by file name instead: `torch.multiprocessing.set_sharing_strategy("file_system")` '
            f"right after `import torch` (vm.max_map_count {maps_limit} allows {n} mappings)"
        )
    steps.append(
        f"hold the data in a few large storages: `torch.stack(samples)` (one storage instead of {n:,}) or "
        "numpy arrays (pickled by value, not shared), indexed in `__getitem__`"
    )
    if not safe:
        steps.append(fork)
    steps.append("load samples lazily in `__getitem__` (keep paths or offsets in the dataset, not tensors)")
    if binding == "maps":
        want = _pow2_at_least(2 * (n + int(owner.get("map_count", 0))))
        steps.append(
            f"raise the limit (root on the host; not settable inside a container): `sysctl -w "
            f"vm.max_map_count={want}` and persist it in /etc/sysctl.d/99-max-map-count.conf"
        )
    elif binding == "fds":
        want = n + int(owner.get("open_fds", 0)) + 1024
        hard = owner.get("nofile_hard")
        how = (
            f"`ulimit -n {want}` in the job script (the hard limit {hard} allows it)"
            if hard is None or want <= hard
            else f"the hard limit {hard} is lower: Docker `--ulimit nofile={want}:{want}`, systemd "
            f"`LimitNOFILE={want}`, or /etc/security/limits.conf"
        )
        steps.append(f"raise the open-file limit: {how}")
    else:
        steps.append("give /dev/shm more room: Docker `--shm-size`, Kubernetes an emptyDir with `medium: Memory`")
    return "\n".join(f"{i}. {s[0].upper()}{s[1:]}." for i, s in enumerate(steps, 1))


def _common_ev(st: dict[str, Any]) -> tuple[Any, ...]:
    method, msrc = _method(st)
    strategy, ssrc = _strategy(st)
    stor = st.get("storages") or {}
    return (
        ev("start method", method, msrc),
        ev("sharing strategy", strategy, ssrc),
        ev(
            "tensor storages pickled to each worker",
            f"{stor.get('count', 0):,} ({human_bytes(stor.get('bytes'))})"
            + (" at least: pickling stopped early" if stor.get("partial") else ""),
            "pickled with torch's ForkingPickler, nothing shared",
        ),
    )


# -- TD510 ------------------------------------------------------------------------------------


def _check_start_method(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    st = _static(facts)
    if st is None or _method(st)[0] is None:
        return
    method, source = _method(st)
    stor = st.get("storages") or {}
    if method in PICKLING:
        what = (
            f"the dataset, collate_fn and worker_init_fn are pickled to every worker, "
            f"{stor.get('pickle_bytes', 0):,} bytes each, and the {stor.get('count', 0):,} tensor storage(s) "
            "in them are moved into shared memory"
        )
    else:
        what = "workers inherit the dataset; only the batches they return are shared"
    yield Hit({"method": method, "source": source, "what": what}, _common_ev(st))


register(
    Code(
        code="TD510",
        name="loader-start-method",
        family="worker-pickling",
        severity=Severity.INFO,
        area="loader",
        title="how this DataLoader's workers will start, and what they are sent",
        message="Workers start with {method} ({source}): {what}.",
        fix="Nothing to do unless another finding says so. To choose explicitly: `DataLoader(..., "
        'multiprocessing_context="fork")` (or "spawn"/"forkserver").',
        meaning="A DataLoader without `multiprocessing_context` starts workers with the start method of the process that "
        "iterates it; spawn and forkserver pickle the worker payload, fork copies the process.",
        why="The start method is inherited from the process the loader runs in (a spawn child, torch.multiprocessing."
        "spawn, a supervisor) and Python 3.14 made forkserver the Linux default.",
        false_positives="None: this is a measurement of the loader as built by the target.",
        related=("TD112", "TD511", "TD512"),
        check=_check_start_method,
    )
)


# -- TD511 / TD512 / TD513: the sharing cost against the host's limits -------------------------


def _check_maps(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    st, limit = _static(facts), facts.limits.sysctl.vm.max_map_count
    if st is None or limit is None or _method(st)[0] not in PICKLING:
        return
    n, used = int((st.get("storages") or {}).get("count", 0)), int((st.get("owner") or {}).get("map_count", 0))
    severity = _severity(n + used, int(limit))
    if severity is None:
        return
    yield Hit(
        {
            "n": f"{n:,}",
            "used": used,
            "need": f"{n + used:,}",
            "limit": limit,
            "method": _method(st)[0],
            "verdict": "will fail" if severity is Severity.ERROR else "fits, with less than half the room spare",
            "fixes": ranked_fixes(facts, st, "maps"),
        },
        _common_ev(st)
        + (
            ev("mappings of the process that starts the workers", used, "/proc/self/maps"),
            ev("vm.max_map_count", limit, "/proc/sys/vm/max_map_count"),
        ),
        severity=severity,
    )


register(
    Code(
        code="TD511",
        name="loader-storages-exceed-map-count",
        family="shm-map-count",
        severity=Severity.ERROR,
        area="loader",
        title="the tensor storages pickled to spawn/forkserver workers need more memory mappings than allowed",
        message="Starting the workers ({method}) shares {n} tensor storages, one memory mapping each, in a process that "
        "already has {used}: {need} mappings against vm.max_map_count {limit}, so it {verdict}. Past the limit "
        "it fails with `unable to mmap N bytes from file </torch_…>: Cannot allocate memory (12)` (TD155).",
        fix="Cheapest first, with this loader's numbers:\n{fixes}",
        meaning="Every storage shared by torch.multiprocessing is one mmap in the sending process and in each worker; "
        "Linux refuses a process more than vm.max_map_count mappings.",
        why="The dataset holds many small tensors (a list of per-sample tensors) and the workers start with spawn or "
        "forkserver, so all of them are shared at once.",
        false_positives="Counts distinct storages reachable from the dataset, collate_fn and worker_init_fn; views of "
        "one storage count once, as in torch. Storages created later (in `__getitem__`) are not included.",
        related=("TD110", "TD155", "TD510", "TD512"),
        check=_check_maps,
    )
)


def _check_fds(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    st = _static(facts)
    if st is None or _method(st)[0] not in PICKLING or _strategy(st)[0] != "file_descriptor":
        return
    owner = st.get("owner") or {}
    soft = owner.get("nofile_soft")
    if soft is None:
        return
    n, used = int((st.get("storages") or {}).get("nonempty", 0)), int(owner.get("open_fds", 0))
    severity = _severity(n + used, int(soft))
    if severity is None:
        return
    yield Hit(
        {
            "n": f"{n:,}",
            "used": used,
            "need": f"{n + used:,}",
            "soft": soft,
            "method": _method(st)[0],
            "verdict": "will fail" if severity is Severity.ERROR else "fits, with less than half the room spare",
            "fixes": ranked_fixes(facts, st, "fds"),
        },
        _common_ev(st)
        + (
            ev("open descriptors of the process that starts the workers", used, "/proc/self/fd"),
            ev("RLIMIT_NOFILE soft", soft, "getrlimit(RLIMIT_NOFILE) in that process"),
            ev("RLIMIT_NOFILE hard", owner.get("nofile_hard") or "unlimited", "getrlimit"),
        ),
        severity=severity,
    )


register(
    Code(
        code="TD512",
        name="loader-storages-exceed-nofile",
        family="fd-exhausted",
        severity=Severity.ERROR,
        area="loader",
        title="the tensor storages pickled to spawn/forkserver workers need more file descriptors than allowed",
        message="Starting the workers ({method}) with the file_descriptor strategy keeps one descriptor open per shared "
        "storage: {n} storages + {used} open = {need} against RLIMIT_NOFILE {soft}, so it {verdict}. Past the "
        "limit it fails with `Too many open files (24)` (TD151, TD153).",
        fix="Cheapest first, with this loader's numbers:\n{fixes}",
        meaning="torch's default strategy on Linux keeps each shared storage's descriptor open for as long as the storage "
        "lives, in the sender and in every worker that received it.",
        why="Many small tensors in the dataset, spawn/forkserver workers, and a soft open-file limit of 1024 or a few "
        "thousand.",
        false_positives="Empty storages are pickled by value and not counted.",
        related=("TD111", "TD151", "TD153", "TD511"),
        check=_check_fds,
    )
)


def _check_dataset_shm(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    st, free = _static(facts), facts.shm.free_bytes
    if st is None or free is None or _method(st)[0] not in PICKLING:
        return
    need = int((st.get("storages") or {}).get("bytes", 0))
    severity = _severity(need, int(free))
    if severity is None:
        return
    yield Hit(
        {
            "need": human_bytes(need),
            "free": human_bytes(free),
            "method": _method(st)[0],
            "fixes": ranked_fixes(facts, st, "shm"),
        },
        _common_ev(st) + (ev("/dev/shm free", human_bytes(free), "statvfs(/dev/shm)"),),
        severity=severity,
    )


register(
    Code(
        code="TD513",
        name="loader-storages-exceed-shm",
        family="shm-exhausted",
        severity=Severity.ERROR,
        area="loader",
        title="the dataset's tensors do not fit in /dev/shm when shared with spawn/forkserver workers",
        message="Starting the workers ({method}) moves {need} of tensor storages into /dev/shm, which has {free} free.",
        fix="Cheapest first, with this loader's numbers:\n{fixes}",
        meaning="Both sharing strategies put each shared storage in a POSIX shared-memory segment under /dev/shm.",
        why="A dataset that holds its data as tensors in memory, workers started with spawn or forkserver, and a small "
        "/dev/shm (containers default to 64 MiB).",
        false_positives="The bytes are counted once; workers map the same segments and add nothing to /dev/shm.",
        related=("TD102", "TD156", "TD511"),
        check=_check_dataset_shm,
    )
)


# -- TD520: pickling -------------------------------------------------------------------------

_KIND_FIX = {
    "lambda": "replace the lambda with a function defined at module level (`def f(x): ...`; parameters through "
    "`functools.partial(f, arg)`)",
    "local function": "define the function at module level and pass it (or `functools.partial` of it)",
    "local class": "define the class at module level",
    "instance of a local class": "define its class at module level",
    "generator": "materialise it (`list(...)`) or create it inside the worker, in `__iter__`/`__getitem__`",
    "open file": "keep the path and open the file lazily in the worker (first `__getitem__` or `worker_init_fn`)",
    "lock": "leave it out of the pickled state (`__getstate__` drops it, `__setstate__` creates a new one)",
    "socket": "connect lazily in the worker (first `__getitem__` or `worker_init_fn`)",
}


def _check_pickling(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    st = _static(facts)
    p = (st or {}).get("pickling") or {}
    if st is None or p.get("ok", True):
        return
    method = _method(st)[0]
    culprit = p.get("culprit") or {}
    kind = culprit.get("kind", "object")
    if method in PICKLING:
        when, severity = f"Workers start with {method}, so starting them fails", Severity.ERROR
    else:
        when, severity = (
            (
                f"Workers start with {method or 'no workers'} now, so nothing is pickled; with spawn or "
                "forkserver (macOS, Windows, Python 3.14's Linux default, a loader run inside a spawn "
                "child) starting them would fail"
            ),
            Severity.INFO,
        )
    article = "an" if kind[0] in "aeiou" else "a"
    what = f"{article} {kind}" + (
        f" `{culprit.get('qualname')}`" if culprit.get("qualname") else f" of type `{culprit.get('type')}`"
    )
    evidence = (
        ev("culprit", p.get("path"), "attribute path from the worker payload"),
        ev("what it is", f"{kind}: {culprit.get('repr')}", culprit.get("defined_at") or culprit.get("type", "")),
        ev("pickle error", p.get("error"), "ForkingPickler.dumps with torch's reducers"),
    )
    yield Hit(
        {
            "path": p.get("path"),
            "what": what,
            "when": when,
            "kind_fix": _KIND_FIX.get(kind, "make it picklable or create it inside the worker"),
            "error": p.get("error"),
        },
        evidence + _common_ev(st)[:1],
        severity=severity,
    )


register(
    Code(
        code="TD520",
        name="loader-unpicklable",
        family="worker-pickling",
        severity=Severity.ERROR,
        area="loader",
        title="something the workers are sent cannot be pickled",
        message="`{path}` is {what} and cannot be pickled ({error}). {when}.",
        fix="At `{path}`: {kind_fix}. Or, on Linux, let the workers fork: `DataLoader(..., "
        'multiprocessing_context="fork")` (nothing is pickled).',
        meaning="spawn and forkserver workers receive the dataset, collate_fn and worker_init_fn pickled; pickle cannot "
        "store lambdas and local functions (no importable name), locks, generators, open files or sockets.",
        why="Code written and tested with fork (Linux before Python 3.14) runs with spawn or forkserver.",
        false_positives="A `__reduce__`/`__getstate__` that behaves differently in a worker is not seen; the path is "
        "the first failing attribute found.",
        related=("TD550", "TD551", "TD552", "TD510"),
        check=_check_pickling,
    )
)
