"""Entry point of the probe's child: ``python -m torchdoctor.probes.child SPEC.json EVENTS.jsonl``.

Runs the user's code (import, factory, loader) and the measurements, and appends one JSON object
per line to EVENTS as it goes (``phase``, ``loaded``, ``static``, ``batch``, ``live``, ``tune-*``,
``error``, ``done``), so the parent knows how far it got even when this process is killed. The
user's own output goes to this process's stdout/stderr (files kept by the parent). A failure in the
user's code becomes an ``error`` event with the user's traceback (frames of this package removed);
a fatal signal prints the Python stacks through :mod:`faulthandler`; SIGUSR1 dumps the stacks of
all threads (the parent sends it before killing a hung child).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

_OWN = str(Path(__file__).resolve().parent)


class Events:
    def __init__(self, path: str) -> None:
        self.f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the process lifetime

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        self.f.write(json.dumps({"event": kind, "t": round(time.monotonic(), 4), **data}, default=str) + "\n")
        self.f.flush()


def user_traceback(exc: BaseException) -> str:
    """The traceback as Python prints it, without the frames of the probe itself."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_OWN)]
    lines = ["Traceback (most recent call last):\n"] if frames else []
    lines += traceback.format_list(frames)
    lines += traceback.format_exception_only(type(exc), exc)
    text = "".join(lines)
    cause = exc.__cause__ or (exc.__context__ if not exc.__suppress_context__ else None)
    if cause is not None:
        text = (
            user_traceback(cause) + "\nThe above exception was the direct cause of the following exception:\n\n" + text
        )
    return text


def _fail(emit: Events, phase: str, exc: BaseException) -> int:
    emit(
        "error",
        {
            "phase": phase,
            "type": type(exc).__name__,
            "message": str(exc)[:2000],
            "traceback": user_traceback(exc)[-8000:],
        },
    )
    return 3


def run(spec: dict[str, Any], emit: Events) -> int:
    from . import target as tgt

    emit("phase", {"phase": "import"})
    t0 = time.perf_counter()
    import torch  # noqa: F401
    import torch.multiprocessing as tmp

    if spec.get("parent_start_method"):
        import multiprocessing

        multiprocessing.set_start_method(spec["parent_start_method"], force=True)
    if spec.get("sharing_strategy"):
        tmp.set_sharing_strategy(spec["sharing_strategy"])
    torch_s = time.perf_counter() - t0
    try:
        factory = tgt.load(spec["target"])
    except tgt.TargetNotFound as exc:
        emit("usage", {"message": str(exc)})
        return 2
    except BaseException as exc:  # noqa: BLE001 - the user's import failed: a finding
        return _fail(emit, "import", exc)
    emit("phase", {"phase": "build"})
    over = tgt.Overrides(**spec.get("overrides", {}))
    try:
        loader = tgt.to_loader(factory(), over)
    except tgt.NotALoader as exc:
        emit("usage", {"message": str(exc)})
        return 2
    except BaseException as exc:  # noqa: BLE001
        return _fail(emit, "build", exc)
    emit(
        "loaded",
        {
            "loader": tgt.describe(loader),
            "import_seconds": round(time.perf_counter() - t0, 3),
            "torch_import_seconds": round(torch_s, 3),
        },
    )
    return _measure(spec, loader, emit)


def run_object(obj: Any, spec_path: str, events_path: str) -> int:
    """The forked child's entry point: probe a DataLoader/Dataset object of the caller."""
    from . import target as tgt

    _stack_dumps()
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    emit = Events(events_path)
    emit("phase", {"phase": "start", "pid": os.getpid()})
    import torch.multiprocessing as tmp

    if spec.get("parent_start_method"):
        import multiprocessing

        multiprocessing.set_start_method(spec["parent_start_method"], force=True)
    if spec.get("sharing_strategy"):
        tmp.set_sharing_strategy(spec["sharing_strategy"])
    emit("phase", {"phase": "build"})
    try:
        loader = tgt.to_loader(obj, tgt.Overrides(**spec.get("overrides", {})))
    except tgt.NotALoader as exc:
        emit("usage", {"message": str(exc)})
        return 2
    except BaseException as exc:  # noqa: BLE001
        return _fail(emit, "build", exc)
    emit("loaded", {"loader": tgt.describe(loader), "import_seconds": 0.0, "torch_import_seconds": 0.0})
    code = _measure(spec, loader, emit)
    emit("done", {"exit": code})
    sys.stdout.flush()
    return code


def _measure(spec: dict[str, Any], loader: Any, emit: Events) -> int:
    from . import live, static

    emit("phase", {"phase": "static"})
    owner = static.owner_facts()
    try:
        result = static.analyse(loader, spec.get("parent_start_method"), spec.get("sharing_strategy"))
    except BaseException as exc:  # noqa: BLE001 - e.g. a __getstate__ of the user's that raises
        return _fail(emit, "static", exc)
    blocking = static.blockers(result, owner, spec.get("limits", {}))
    emit("static", {**result, "owner": owner, "blockers": blocking})
    if spec.get("static_only"):
        return 0
    emit("phase", {"phase": "batch"})
    try:
        batch = live.sample_isolated(loader)
    except live.SampleFailed as exc:
        emit("error", {"phase": "batch", **exc.info})
        return 3
    except live.SampleCrashed as exc:
        emit("crash", {"phase": "batch", "exit_code": exc.exitcode})
        return 4
    emit("batch", batch)
    blocking += static.batch_blockers(batch, loader, spec.get("limits", {}))
    if blocking and not spec.get("force_live"):
        emit("live", {"ran": False, "skipped": "; ".join(blocking)})
        return 0
    if loader.num_workers > 0:
        emit("phase", {"phase": "live"})
        try:
            seconds = float(spec.get("tune_seconds", 1.0))
            result = live.run_workers(loader, int(spec.get("batches", 8)), seconds, emit)
            result["bare_worker_threads"] = live.bare_worker_threads(loader)
            emit("live", result)
        except BaseException as exc:  # noqa: BLE001 - a worker's failure, reported by the DataLoader
            return _fail(emit, "live", exc)
    else:
        emit("live", {"ran": False, "skipped": "num_workers=0: no workers to start"})
    if spec.get("tune"):
        from . import tune

        emit("phase", {"phase": "tune"})
        try:
            budget = spec.get("tune_budget")
            emit(
                "tune",
                tune.tune(
                    loader,
                    int(spec["max_workers"]),
                    float(spec.get("tune_seconds", 1.0)),
                    emit,
                    budget=None if budget is None else float(budget),
                ),
            )
        except BaseException as exc:  # noqa: BLE001
            return _fail(emit, "tune", exc)
    return 0


def _stack_dumps() -> None:
    """Fatal signals and SIGUSR1 print every thread's Python stack to stderr. Installed at import,
    so spawn/forkserver workers (which import this module as ``__mp_main__``) and forked ones
    (which inherit it) dump theirs too when the parent signals the session at a timeout."""
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)


if __name__ in ("__main__", "__mp_main__"):
    _stack_dumps()


def main(argv: list[str]) -> int:
    with open(argv[0], encoding="utf-8") as f:
        spec = json.load(f)
    emit = Events(argv[1])
    emit("phase", {"phase": "start", "pid": os.getpid()})
    code = run(spec, emit)
    emit("done", {"exit": code})
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
