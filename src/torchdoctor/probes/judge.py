"""Turn the probe child's events into the ``loader`` facts section, and that into findings.

The section is plain JSON (schema in ``docs/loader.md``), added to the host's facts; the
catalogue's loader codes (``catalogue/loader.py``, ``catalogue/loader_live.py``) are pure checks of
it, so a recorded probe can be judged again (``torchdoctor check --facts`` ignores nothing).
"""

from __future__ import annotations

import re
from typing import Any

from ..facts import Facts
from ..model import Finding
from ..stopping import signal_name
from .isolate import Outcome

#: A faulthandler frame line: `  File "path", line N in func`.
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:,)? in (?P<func>\S+)', re.M)


def _user_frame(text: str | None) -> str | None:
    """The innermost frame of the user's code: not the standard library, torch or torchdoctor."""
    if not text:
        return None
    frames = [m for m in _FRAME.finditer(text)]
    skip = ("/torch/", "/torchdoctor/", "/multiprocessing/", "/threading.py", "/python3.", "<frozen")
    mine = [m for m in frames if not any(s in m.group("file") for s in skip)]
    if not mine:
        return None
    # faulthandler prints the innermost frame first; tracebacks print it last
    m = mine[0] if "most recent call first" in text else mine[-1]
    return f"{m.group('func')} ({m.group('file')}:{m.group('line')})"


def _stacks(stderr: str) -> str | None:
    """The part of stderr faulthandler wrote (fatal error or SIGUSR1 dump)."""
    for marker in ("Fatal Python error", "Current thread", "Thread 0x"):
        i = stderr.find(marker)
        if i >= 0:
            return stderr[i:][-6000:]
    return None


def _explain(text: str) -> dict[str, Any] | None:
    try:
        from ..explain import explain
    except ImportError:  # pragma: no cover
        return None
    root = explain(text).root_cause
    if root is None:
        return None
    return {"code": root.code, "name": root.name, "family": root.family}


def outcome_section(out: Outcome, timeout: float, memory_cap: int | None) -> dict[str, Any]:
    o: dict[str, Any] = {
        "pid": out.pid,
        "seconds": out.seconds,
        "exit_code": out.exit_code,
        "signal": out.signal_name,
        "phase": out.phase,
        "timeout": timeout,
        "memory_cap": memory_cap,
        "peak_memory": out.peak_memory,
    }
    err = out.last("error")
    if out.timed_out:
        o["status"] = "timeout"
        o["stacks"] = _stacks(out.stderr)
        o["where"] = _user_frame(o["stacks"])
    elif out.memory_killed:
        o["status"] = "memory"
    elif err is not None:
        o["status"] = "error"
        o["error"] = {k: err.get(k) for k in ("phase", "type", "message", "traceback")}
        o["where"] = _user_frame(err.get("traceback"))
        o["explained"] = _explain(f"{err.get('traceback', '')}\n{err.get('message', '')}")
    elif out.last("crash") is not None or out.last("done") is None or out.exit_code not in (0, None):
        crash = out.last("crash")
        if crash is not None:  # the forked copy that made a batch died; the child reported it
            o["exit_code"] = crash.get("exit_code")
            o["signal"] = signal_name(crash.get("exit_code"))
        o["status"] = "crashed"
        o["stacks"] = _stacks(out.stderr) or out.stderr[-3000:] or None
        o["where"] = _user_frame(o["stacks"])
        o["explained"] = _explain(out.stderr) if out.stderr else None
    else:
        o["status"] = "ok"
    o["stderr_tail"] = out.stderr[-2000:] or None
    return o


def loader_section(out: Outcome, target: str, timeout: float, memory_cap: int | None) -> dict[str, Any]:
    section: dict[str, Any] = {"target": target, "outcome": outcome_section(out, timeout, memory_cap)}
    loaded = out.last("loaded")
    if loaded:
        section["loader"] = loaded["loader"]
        section["import_seconds"] = loaded.get("import_seconds")
    static = out.last("static")
    if static:
        section["static"] = {k: v for k, v in static.items() if k not in ("event", "t")}
    for kind in ("batch", "live", "tune"):
        e = out.last(kind)
        if e:
            section[kind] = {k: v for k, v in e.items() if k not in ("event", "t")}
    return section


def loader_codes() -> list[Any]:
    from ..registry import all_codes

    return [c for c in all_codes() if c.area == "loader" and c.check is not None and c.status != "retired"]


def judge(facts: Facts) -> list[Finding]:
    from ..checks import run_checks

    return run_checks(facts, codes=loader_codes())
