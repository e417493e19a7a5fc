"""``torchdoctor.guard()``: a per-rank error report when training code fails.

    with torchdoctor.guard(report_dir="torchdoctor-reports"):
        train()

    @torchdoctor.guard()
    def main() -> None: ...

    torchdoctor.guard.install()      # sys.excepthook and threading.excepthook

On an uncaught exception (an :class:`Exception`; see below) the guard writes
``<report_dir>/rank-<RANK or 0>-<host>-<pid>.json`` (the exception, its traceback, the diagnosis of
:func:`torchdoctor.explain_exception`, a redacted snapshot of a few cheap host facts, the memory of
this process and of CUDA when CUDA is initialised, the rank variables), prints the diagnosis once
per process to stderr, and, under torchrun, writes torchelastic's error file exactly as
``torch.distributed.elastic.multiprocessing.errors.record`` does, so torchrun's "Root Cause" summary
shows the failure. Then the exception goes on: it is never swallowed, exit codes do not change.

What is a failure: an :class:`Exception`, as for torch's ``@record``. ``KeyboardInterrupt``,
``SystemExit`` (any code: a deliberate exit, which torch's ``@record`` does not record either) and
``GeneratorExit`` pass through untouched: no report, no message, no error file.

Nothing here imports torch; nothing here may raise into the failing program: a report that cannot
be written becomes one line on stderr, and the original exception propagates.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

REPORT_SCHEMA = "torchdoctor.guard-report/1"
FACT_SECTIONS = ["host", "limits", "shm", "memory", "cgroup"]
FACTS_TIMEOUT = 1.0
"""Seconds a report waits for the facts snapshot (each section is bounded by this)."""

RANK_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_ERROR_FILE",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "SLURM_JOB_ID",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "CUDA_VISIBLE_DEVICES",
)

_lock = threading.RLock()
_printed = False
_reports: list[Path] = []
_MARK = "__torchdoctor_report__"
_unmarkable: set[int] = set()


def is_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is reported: an :class:`Exception` (not ``KeyboardInterrupt``/``SystemExit``)."""
    return isinstance(exc, Exception)


def _rank() -> str:
    value = os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0"
    return value if value.isdigit() else "0"


def _host() -> str:
    name = socket.gethostname().split(".")[0] or "host"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64]


def report_path(report_dir: str | os.PathLike[str], attempt: int = 1) -> Path:
    """``<report_dir>/rank-<RANK or 0>-<host>-<pid>.json`` (``-<n>`` before ``.json`` for the n-th failure)."""
    suffix = "" if attempt <= 1 else f"-{attempt}"
    return Path(report_dir) / f"rank-{_rank()}-{_host()}-{os.getpid()}{suffix}.json"


def _traceback_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _diagnosis(exc: BaseException) -> dict[str, Any] | None:
    from ..explain import explain_exception

    report = explain_exception(exc)
    top = report.root_cause
    if top is None and report.explained:
        top = next(d for d in report.diagnoses if d.role in ("root-cause", "cascade", "hypothesis"))
    if top is None:
        return None
    return {
        "code": top.code,
        "name": top.name,
        "family": top.family,
        "role": top.role,
        "confidence": top.confidence,
        "title": top.title,
        "message": top.message,
        "fix": top.fix,
    }


def _facts() -> dict[str, Any] | None:
    from ..facts import GatherContext, gather

    ctx = GatherContext(torch=False, section_timeout=FACTS_TIMEOUT, command_timeout=FACTS_TIMEOUT)
    return gather(ctx, sections=FACT_SECTIONS).data


def _cuda_memory() -> dict[str, Any] | None:
    """torch.cuda memory per device when torch is already imported and CUDA initialised; else None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        devices = []
        for i in range(torch.cuda.device_count()):
            entry: dict[str, Any] = {
                "device": i,
                "allocated": torch.cuda.memory_allocated(i),
                "reserved": torch.cuda.memory_reserved(i),
                "max_allocated": torch.cuda.max_memory_allocated(i),
                "max_reserved": torch.cuda.max_memory_reserved(i),
            }
            with contextlib.suppress(Exception):
                free, total = torch.cuda.mem_get_info(i)
                entry.update(free=int(free), total=int(total))
            devices.append(entry)
        return {"devices": devices}
    except Exception as exc:  # a broken CUDA context must not hide the report
        return {"error": f"{type(exc).__name__}: {exc}"}


def _memory() -> dict[str, Any]:
    from ..facts.procs import proc_memory

    return {"process": proc_memory(os.getpid()), "cuda": _cuda_memory()}


def _safe(what: str, fn: Callable[[], Any], problems: dict[str, str]) -> Any:
    try:
        return fn()
    except Exception as exc:
        problems[what] = f"{type(exc).__name__}: {exc}"
        return None


def build_report(exc: BaseException, thread: str | None = None, facts: bool = True) -> dict[str, Any]:
    """The report of one failure, as plain JSON, every text value redacted."""
    from ..facts.redact import redact_argv, redact_env, redact_text

    problems: dict[str, str] = {}
    now = time.time()
    diagnosis = _safe("diagnosis", lambda: _diagnosis(exc), problems)
    if diagnosis:
        diagnosis = {k: redact_text(v) if isinstance(v, str) else v for k, v in diagnosis.items()}
    return {
        "schema": REPORT_SCHEMA,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "timestamp": round(now, 3),
        "exception": {
            "type": f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins."),
            "message": redact_text(str(exc)),
            "traceback": redact_text(_traceback_text(exc)),
            "thread": thread or threading.current_thread().name,
        },
        "diagnosis": diagnosis,
        "rank": redact_env({k: os.environ[k] for k in RANK_VARIABLES if k in os.environ}),
        "process": {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "argv": redact_argv(sys.argv),
            "python": sys.version.split()[0],
            "torch_imported": "torch" in sys.modules,
        },
        "memory": _safe("memory", _memory, problems),
        "facts": _safe("facts", _facts, problems) if facts else None,
        "problems": problems,
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, default=str)
        fh.write("\n")
    os.replace(tmp, path)


def write_error_file(exc: BaseException) -> Path | None:
    """torchelastic's error file, as ``ErrorHandler.record_exception`` writes it, when
    ``TORCHELASTIC_ERROR_FILE`` is set and the file does not exist yet; returns its path if written."""
    from ..facts.redact import redact_text

    name = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not name:
        return None
    data = {
        "message": {
            "message": redact_text(f"{type(exc).__name__}: {exc}"),
            "extraInfo": {
                "py_callstack": redact_text(_traceback_text(exc)),
                "timestamp": str(int(time.time())),
            },
        }
    }
    try:
        with open(name, "x") as fp:  # never over another error file (torch's own @record was first)
            json.dump(data, fp)
    except FileExistsError:
        return None
    return Path(name)


def _summary(data: dict[str, Any], path: Path | None) -> str:
    rank = data["rank"].get("RANK", "0")
    exc = data["exception"]
    diag = data["diagnosis"]
    first = exc["message"].strip().splitlines()[0] if exc["message"].strip() else ""
    lines = [f"torchdoctor: rank {rank} failed: {exc['type']}: {first}"[:500]]
    if diag:
        lines.append(f"  {diag['code']} {diag['name']} (family {diag['family']}, confidence {diag['confidence']:.2f})")
        lines.append(f"  {diag['message']}")
        lines.append(f"  fix: {diag['fix']}")
    else:
        lines.append("  no known cause matched this exception (`torchdoctor explain` reads whole logs)")
    lines.append(f"  report: {path}" if path else "  report: not written")
    return "\n".join(lines) + "\n"


def report_failure(
    exc: BaseException,
    report_dir: str | os.PathLike[str] = "torchdoctor-reports",
    *,
    thread: str | None = None,
    facts: bool = True,
    error_file: bool = True,
    echo: bool = True,
) -> Path | None:
    """Report ``exc`` once (the same exception seen by nested guards and the excepthook is reported
    by the first); returns the report's path. Never raises."""
    global _printed
    if not is_failure(exc):
        return None
    try:
        done = getattr(exc, _MARK, None)
        if done is not None or id(exc) in _unmarkable:
            return Path(done) if done else None
        with _lock:
            try:
                setattr(exc, _MARK, "")
            except (AttributeError, TypeError):  # an exception type without __dict__: remember its id
                _unmarkable.add(id(exc))
            path: Path | None = None
            data: dict[str, Any] | None = None
            _flush_rank_files()  # the lines logged just before the failure, before a launcher can kill us
            try:
                data = build_report(exc, thread, facts)
            except Exception as err:
                _note(f"torchdoctor: could not build the error report ({type(err).__name__}: {err})")
            if data is not None:
                try:
                    target = report_path(os.path.abspath(report_dir), len(_reports) + 1)
                    data["report_path"] = str(target)
                    _write_json(target, data)
                    path = target
                    _reports.append(path)
                    with contextlib.suppress(AttributeError, TypeError):
                        setattr(exc, _MARK, str(path))
                except Exception as err:
                    _note(f"torchdoctor: could not write the error report ({type(err).__name__}: {err})")
            if error_file:
                try:
                    write_error_file(exc)
                except Exception as err:
                    _note(f"torchdoctor: could not write TORCHELASTIC_ERROR_FILE ({type(err).__name__}: {err})")
            if echo and data is not None:
                if not _printed:
                    _printed = True
                    _note(_summary(data, path), end="")
                else:
                    _note(f"torchdoctor: another failure ({data['exception']['type']}); report: {path}")
            return path
    except Exception:  # the last line of defence: never replace the user's exception
        return None


def _flush_rank_files() -> None:
    rankfile = sys.modules.get("torchdoctor.guards.rankfile")
    if rankfile is not None:
        rankfile._flusher.flush_all()


def _note(text: str, end: str = "\n") -> None:
    with contextlib.suppress(Exception):
        sys.stderr.write(text + end)
        sys.stderr.flush()


class _Hooks:
    installed: dict[str, Any] | None = None
    previous_sys: Callable[..., Any] | None = None
    previous_threading: Callable[..., Any] | None = None


def install(
    report_dir: str | os.PathLike[str] = "torchdoctor-reports", *, facts: bool = True, error_file: bool = True
) -> None:
    """Report uncaught exceptions of the main thread (``sys.excepthook``) and of other threads
    (``threading.excepthook``); the hooks installed before run afterwards (tracebacks still print).
    Installing again changes the options, never chains twice."""
    options = {"report_dir": os.fspath(report_dir), "facts": facts, "error_file": error_file}
    if _Hooks.installed is None:
        _Hooks.previous_sys = sys.excepthook
        _Hooks.previous_threading = threading.excepthook
        sys.excepthook = _sys_hook
        threading.excepthook = _thread_hook
    _Hooks.installed = options


def uninstall() -> None:
    """Put back the hooks :func:`install` replaced."""
    if _Hooks.installed is None:
        return
    if sys.excepthook is _sys_hook and _Hooks.previous_sys is not None:
        sys.excepthook = _Hooks.previous_sys
    if threading.excepthook is _thread_hook and _Hooks.previous_threading is not None:
        threading.excepthook = _Hooks.previous_threading
    _Hooks.installed = None


def _sys_hook(kind: type[BaseException], exc: BaseException, tb: types.TracebackType | None) -> None:
    if _Hooks.installed is not None:
        report_failure(exc, **_Hooks.installed)
    (_Hooks.previous_sys or sys.__excepthook__)(kind, exc, tb)


def _thread_hook(args: Any) -> None:
    if _Hooks.installed is not None and args.exc_value is not None:
        name = args.thread.name if args.thread is not None else None
        report_failure(args.exc_value, thread=name, **_Hooks.installed)
    (_Hooks.previous_threading or threading.__excepthook__)(args)


class guard(contextlib.ContextDecorator):  # noqa: N801 - used as a function: `with torchdoctor.guard():`
    """Report a failure of the code it wraps, then let the exception go on (module doc).

    A context manager (``with guard():``) and a decorator (``@guard()``). ``guard.install()``
    reports uncaught exceptions of the whole process instead. ``facts=False`` leaves the host facts
    out; ``error_file=False`` never writes ``TORCHELASTIC_ERROR_FILE``.
    """

    install = staticmethod(install)
    uninstall = staticmethod(uninstall)

    def __init__(
        self,
        report_dir: str | os.PathLike[str] = "torchdoctor-reports",
        *,
        facts: bool = True,
        error_file: bool = True,
        echo: bool = True,
    ) -> None:
        if callable(report_dir) and not isinstance(report_dir, (str, os.PathLike)):
            raise TypeError("guard is used with parentheses: `@torchdoctor.guard()`, `with torchdoctor.guard():`")
        self.report_dir = report_dir
        self.facts = facts
        self.error_file = error_file
        self.echo = echo
        self.report: Path | None = None
        """The report written by the last failure inside this guard."""

    def __enter__(self) -> guard:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> Literal[False]:
        if exc is not None and is_failure(exc):
            self.report = report_failure(
                exc, self.report_dir, facts=self.facts, error_file=self.error_file, echo=self.echo
            )
        return False  # never swallow


def reports() -> list[Path]:
    """The reports this process wrote, oldest first."""
    return list(_reports)
