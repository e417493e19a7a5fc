"""TD501-505 and TD53x: what the loader probe saw when it ran the user's code and the real workers.

TD501-505 turn the probe child's outcome (``loader.outcome``: an exception, a hang killed at the
timeout, a fatal signal, the memory cap, a failure reported by the DataLoader) into a finding with
the child's own traceback or stack dump. TD530-532 judge the live run (``loader.batch``,
``loader.live``): /dev/shm needed by batches in flight, threads per worker against the usable
cores, worker memory growing batch after batch (copy-on-write of Python objects).
"""

from __future__ import annotations

from collections.abc import Iterator
from statistics import median
from typing import Any

from ..facts import Facts
from ..model import Severity
from ..options import CheckOptions
from ..registry import Code, Hit, register
from ._util import ev, human_bytes

MiB = 1024 * 1024
#: Worker private memory growth (median over workers, first to last batch) that is flagged.
GROWTH_FLAG = 16 * MiB
#: ... or, when smaller, growth that projected over an epoch passes this.
GROWTH_EPOCH_FLAG = 256 * MiB
GROWTH_MIN = 4 * MiB
_PHASE = {
    "import": "importing the target's module",
    "build": "building the DataLoader",
    "static": "inspecting what the workers are sent",
    "batch": "making a batch in the main process",
    "live": "running the workers",
    "tune": "tuning",
    "start": "starting",
    None: "starting",
}


def _outcome(facts: Facts) -> dict[str, Any]:
    return facts.loader.outcome or {}


def _explained(o: dict[str, Any]) -> str:
    x = o.get("explained") or {}
    if not x.get("code"):
        return ""
    return (
        f" `torchdoctor explain` reads this as {x['code']} {x.get('name', '')} ({x.get('family')}): see "
        f"`torchdoctor codes {x['code']}`."
    )


def _out_ev(o: dict[str, Any], text_label: str, text: str | None) -> tuple[Any, ...]:
    out = [
        ev("phase", _PHASE.get(o.get("phase"), o.get("phase")), "probe child events"),
        ev("probe child", f"pid {o.get('pid')}, {o.get('seconds')} s", "torchdoctor.probes.child"),
    ]
    if (o.get("explained") or {}).get("code"):
        x = o["explained"]
        out.append(ev("explain", f"{x['code']} ({x.get('family')})", "torchdoctor explain on the error text"))
    if text:
        out.append(ev(text_label, text.rstrip(), "the child's stderr" if "stack" in text_label else "the child"))
    return tuple(out)


def _check_raised(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    o = _outcome(facts)
    err = o.get("error") or {}
    if o.get("status") != "error" or err.get("phase") in ("live", "tune"):
        return
    lines = [ln for ln in err.get("message", "").strip().splitlines() if ln.strip()]
    yield Hit(
        {
            "type": err.get("type"),
            "message": lines[-1] if lines else "",
            "doing": _PHASE.get(err.get("phase"), err.get("phase")),
            "where": o.get("where") or "the last frame",
            "explained": _explained(o),
        },
        _out_ev(o, "traceback", err.get("traceback")),
    )


register(
    Code(
        code="TD501",
        name="loader-code-raised",
        family="worker-crash",
        severity=Severity.ERROR,
        area="loader",
        title="the target's own code raised an exception",
        message="The target raised {type} while {doing}: {message}. Every worker would run the same code.{explained}",
        fix="Fix the error at {where} (the traceback below is the child's own, with torchdoctor's frames removed), then "
        "run `torchdoctor loader` again.",
        meaning="The probe imports the target, calls it and makes a batch in an isolated child; an exception there is "
        "an error in the dataset or loader code itself, before any limit is involved.",
        why="A bug, a missing file or dependency, or data the code does not expect.",
        false_positives="None; the traceback is the child's.",
        related=("TD505", "TD502", "TD503"),
        check=_check_raised,
    )
)


def _check_hung(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    o = _outcome(facts)
    if o.get("status") != "timeout":
        return
    yield Hit(
        {
            "timeout": o.get("timeout"),
            "doing": _PHASE.get(o.get("phase"), o.get("phase")),
            "where": o.get("where") or "unknown (no stack was printed)",
        },
        _out_ev(o, "stacks at the timeout", o.get("stacks")),
    )


register(
    Code(
        code="TD502",
        name="loader-code-hung",
        family="worker-crash",
        severity=Severity.ERROR,
        area="loader",
        title="the target's code did not finish within the probe's timeout",
        message="The probe stopped after {timeout} s while {doing}; the child and all its workers were killed. It was "
        "waiting in {where}.",
        fix="Look at the stack below: a lock or queue that never gets released, a network read without a timeout, or "
        "workers that never deliver (give the DataLoader `timeout=` to turn a hang into an error). If the code is "
        "only slow (a large dataset being built), pass a longer `--timeout`.",
        meaning="A hard timeout protects the probe: the child's Python stacks are printed (faulthandler, on SIGUSR1) and "
        "its whole session is killed.",
        why="Deadlocks after fork (locks held by another thread), blocking I/O, infinite loops, slow dataset "
        "construction.",
        false_positives="A slow but correct build: raise --timeout.",
        related=("TD565", "TD501"),
        check=_check_hung,
    )
)


def _check_crashed(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    o = _outcome(facts)
    if o.get("status") != "crashed":
        return
    how = f"died of {o['signal']}" if o.get("signal") else f"exited with status {o.get('exit_code')}"
    yield Hit(
        {
            "how": how,
            "doing": _PHASE.get(o.get("phase"), o.get("phase")),
            "where": o.get("where") or "native code (no Python frame was printed)",
        },
        _out_ev(o, "fatal error and stack", o.get("stacks")),
    )


register(
    Code(
        code="TD503",
        name="loader-code-crashed",
        family="worker-crash",
        severity=Severity.ERROR,
        area="loader",
        title="the target's code crashed the process (a fatal signal or a hard exit)",
        message="The probe child {how} while {doing}, in {where}. A worker running this code would die the same way.",
        fix="The stack shows the last Python frame before the crash; native crashes come from extensions (a decoder, "
        "ctypes/cffi with a bad pointer or a handle from another process). Reproduce with `python -X faulthandler` "
        "and `num_workers=0`; open native resources inside the worker, never pass addresses to it.",
        meaning="A segmentation fault, abort or `os._exit` in the dataset code kills the process running it; faulthandler "
        "prints the Python stack first.",
        why="Native library bugs, handles or pointers valid only in another process, fork-unsafe libraries.",
        false_positives="None; the signal and stack are the child's.",
        related=("TD560", "TD563", "TD501"),
        check=_check_crashed,
    )
)


def _check_memory(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    o = _outcome(facts)
    if o.get("status") != "memory":
        return
    yield Hit(
        {
            "cap": human_bytes(o.get("memory_cap")),
            "peak": human_bytes(o.get("peak_memory")),
            "doing": _PHASE.get(o.get("phase"), o.get("phase")),
        },
        _out_ev(o, "output", None) + (ev("memory cap", human_bytes(o.get("memory_cap")), "--memory-cap"),),
    )


register(
    Code(
        code="TD504",
        name="loader-memory-cap",
        family="host-oom",
        severity=Severity.ERROR,
        area="loader",
        title="the loader used more memory than the probe's cap",
        message="The probe child and its workers passed the memory cap of {cap} (PSS {peak}) while {doing}, and were "
        "killed.",
        fix="If the cap is the memory your job will have, lower it: fewer workers, a smaller prefetch_factor, data in "
        "numpy arrays or one tensor instead of Python objects, lazy loading. Otherwise raise --memory-cap.",
        meaning="The cap is summed over the child's session as PSS, so pages shared between forked workers count once.",
        why="A dataset built in memory, many workers each copying it (spawn), or memory growing batch after batch.",
        false_positives="A cap below what the job really has.",
        related=("TD532", "TD562"),
        check=_check_memory,
    )
)


def _check_workers_failed(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    o = _outcome(facts)
    err = o.get("error") or {}
    if o.get("status") != "error" or err.get("phase") not in ("live", "tune"):
        return
    lines = [ln for ln in err.get("message", "").strip().splitlines() if ln.strip()]
    yield Hit(
        {"type": err.get("type"), "message": (lines[0] if lines else "").rstrip(". "), "explained": _explained(o)},
        _out_ev(o, "traceback", err.get("traceback")),
    )


register(
    Code(
        code="TD505",
        name="loader-workers-failed",
        family="worker-crash",
        severity=Severity.ERROR,
        area="loader",
        title="running the DataLoader's workers failed",
        message="Iterating the loader with its workers raised {type}: {message}.{explained}",
        fix="The cause is in the error text and the code explain names; a worker's own traceback is inside the message "
        "('Original Traceback'). `num_workers=0` reproduces dataset errors in the main process.",
        meaning="The DataLoader re-raises what its workers report (their exceptions, deaths by signal, timeouts), and "
        "errors of its own (sharing tensors, starting workers).",
        why="See the explained code: a worker crash, a sharing limit reached, an unpicklable dataset.",
        false_positives="None; this is the loader's own error, caught by the probe.",
        related=("TD501", "TD560", "TD564", "TD151", "TD155"),
        check=_check_workers_failed,
    )
)


# -- live measurements ------------------------------------------------------------------------


def _check_batch_shm(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    batch, desc, free = facts.loader.batch, facts.loader.loader, facts.shm.free_bytes
    if not isinstance(batch, dict) or not isinstance(desc, dict) or free is None or not desc.get("num_workers"):
        return
    workers, prefetch = int(desc["num_workers"]), int(desc.get("prefetch_factor") or 2)
    need = int(batch.get("bytes") or 0) * workers * prefetch
    if need <= 0 or need <= free // 2:
        return
    arithmetic = (
        f"{human_bytes(batch['bytes'])} per batch × {workers} workers × prefetch {prefetch} = {human_bytes(need)}"
    )
    fit = int(free // max(1, int(batch["bytes"])))
    if fit >= 1:
        w = min(workers, fit)
        fewer = (
            f"1. Fewer batches in flight: {fit} batch(es) fit, so keep num_workers × prefetch_factor ≤ {fit} "
            f"(e.g. num_workers={w}, prefetch_factor={max(1, fit // w)}).\n2. Smaller batches.\n3."
        )
    else:
        fewer = "1. Smaller batches: not even one batch fits.\n2."
    yield Hit(
        {
            "arithmetic": arithmetic,
            "free": human_bytes(free),
            "fewer": fewer,
            "verdict": "does not fit" if need > free else "takes more than half of it",
            "need_gib": max(1, -(-need * 2 // 1024**3)),
        },
        (
            ev("bytes of tensors in one batch", human_bytes(batch["bytes"]), "one batch made in the main process"),
            ev("workers × prefetch_factor", f"{workers} × {prefetch}", "the DataLoader's arguments"),
            ev("/dev/shm free", human_bytes(free), "statvfs(/dev/shm)"),
        ),
        severity=Severity.ERROR if need > free else Severity.WARNING,
    )


register(
    Code(
        code="TD530",
        name="loader-batches-exceed-shm",
        family="shm-exhausted",
        severity=Severity.ERROR,
        area="loader",
        title="the batches this loader keeps in flight do not fit in /dev/shm",
        message="{arithmetic} of shared memory, and /dev/shm has {free} free: it {verdict}. Workers then die with `No "
        "space left on device (28)` (TD156) or a bus error (TD157).",
        fix="{fewer} More shared memory: Docker `--shm-size={need_gib}g` (or `--ipc=host`), Kubernetes an emptyDir with "
        "`medium: Memory, sizeLimit: {need_gib}Gi` at /dev/shm.",
        meaning="Each batch a worker has made and the main process has not yet taken sits in /dev/shm; a loader keeps up "
        "to num_workers × prefetch_factor of them.",
        why="Large batches (images, video, audio) against the 64 MiB container default or a busy /dev/shm.",
        false_positives="The batch was measured once; variable-size batches may be larger. Several training processes on "
        "one node share /dev/shm (multiply by their number).",
        related=("TD102", "TD156", "TD157"),
        check=_check_batch_shm,
    )
)


def _check_threads(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    live, cores = facts.loader.live, facts.cpu.usable_cores
    if not isinstance(live, dict) or not live.get("ran") or cores is None:
        return
    threads = [w["threads"] for w in live.get("workers", []) if w.get("threads")]
    base = live.get("bare_worker_threads")
    if not threads or base is None:
        return
    extra = max(threads) - int(base)
    busy = len(threads) * (1 + extra)
    if extra < 1 or busy <= cores:
        return
    yield Hit(
        {"workers": len(threads), "per": max(threads), "base": base, "extra": extra, "busy": busy, "cores": cores},
        (
            ev("threads per worker", ", ".join(map(str, threads)), "/proc/PID/task of each worker"),
            ev("threads of a bare worker", base, "a 1-worker DataLoader of the same start method, no dataset code"),
            ev("usable cores", cores, "cpu.usable_cores (affinity, cgroup quota)"),
        ),
    )


register(
    Code(
        code="TD531",
        name="loader-worker-threads",
        family="thread-oversubscription",
        severity=Severity.WARNING,
        area="loader",
        title="each DataLoader worker runs a thread pool: more threads than usable cores",
        message="Each of the {workers} workers runs up to {per} threads, {extra} more than a bare worker ({base}): the "
        "dataset code starts a thread pool in every worker, so up to {workers} × (1 + {extra}) = {busy} threads "
        "compete for {cores} usable cores (OpenMP/BLAS, OpenCV, torch interop or the dataset's own pools).",
        fix="Cap the pools in each worker: `def worker_init_fn(_): torch.set_num_threads(1); cv2.setNumThreads(0)`; for "
        "numpy/BLAS use `threadpoolctl.threadpool_limits(1)` there, or set `OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1` "
        "in the environment before workers start (spawn/forkserver workers read it at import).",
        meaning="A worker needs one thread; libraries it imports start pools sized to every core, so W workers × pools "
        "oversubscribe the machine.",
        why="spawn/forkserver workers import numpy/OpenCV afresh (their pools start at import); fork workers start pools "
        "on first use.",
        false_positives="Idle pool threads cost little; the count is a maximum over the sampled batches.",
        related=("TD250", "TD251", "TD253"),
        check=_check_threads,
    )
)


def _check_growth(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    live, desc = facts.loader.live, facts.loader.loader or {}
    if not isinstance(live, dict) or not live.get("ran") or (live.get("batches") or 0) < 2:
        return
    growth = [
        w["uss_last"] - w["uss_first"]
        for w in live.get("workers", [])
        if w.get("uss_last") is not None and w.get("uss_first") is not None
    ]
    if not growth:
        return
    g, n = median(growth), int(live["batches"])
    epoch = desc.get("batches_per_epoch")
    projected = g * epoch / n if epoch else None
    if g < GROWTH_FLAG and (projected is None or projected < GROWTH_EPOCH_FLAG or g < GROWTH_MIN):
        return
    workers = len(growth)
    proj = (
        f"; at that rate an epoch of {epoch} batches adds about {human_bytes(projected)} per worker, "
        f"{human_bytes(projected * workers)} for {workers} workers"
        if projected
        else ""
    )
    yield Hit(
        {"growth": human_bytes(g), "n": n, "per_batch": human_bytes(g / max(1, n - 1)), "projection": proj},
        (
            ev(
                "worker private memory (USS) growth",
                ", ".join(human_bytes(x) for x in growth),
                "/proc/PID/smaps_rollup at the first and last batch",
            ),
            ev(
                "worker PSS at the last batch",
                ", ".join(human_bytes(w.get("pss_last")) for w in live["workers"]),
                "/proc/PID/smaps_rollup",
            ),
        ),
    )


register(
    Code(
        code="TD532",
        name="loader-worker-memory-growth",
        family="host-oom",
        severity=Severity.WARNING,
        area="loader",
        title="worker memory grows batch after batch (copy-on-write of Python objects)",
        message="Each worker's private memory grew by {growth} (median) over {n} batches, about {per_batch} per "
        "batch{projection}. Forked workers copy every page of Python objects they read (reading writes the "
        "reference count), so memory grows until the whole dataset is copied into each worker.",
        fix="Hold the data in numpy arrays or one tensor (no per-object reference counts; pages stay shared): e.g. "
        "`np.array(values)` instead of a list of floats, columns of arrays instead of a list of dicts, strings "
        "packed into one bytes buffer with offsets. Or fewer workers, or load samples lazily from disk.",
        meaning="USS is memory only this worker uses; under fork it starts near zero and grows as pages the parent "
        "wrote are copied on the worker's first write.",
        why="Datasets kept as Python lists/dicts of objects (annotations, file lists, features) read by every worker.",
        false_positives="A worker's own caches grow too; growth that stops after the first epoch is harmless.",
        related=("TD562", "TD504"),
        check=_check_growth,
    )
)
