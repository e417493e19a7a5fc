"""Run the probe child in isolation: own session, hard timeout, optional memory cap, nothing left over.

The child (:mod:`.child`) runs the user's code. This side only watches it: it reads the child's
event lines as they come (for progress), kills the child's whole session when the timeout passes
(after asking it, with SIGUSR1, to print every thread's Python stack) or when the session's
memory (PSS, so pages shared by forked workers count once) passes the cap, and afterwards reaps
anything still in the session (orphaned workers, a forkserver, torch_shm_manager after it has
unlinked its segments). Only processes of that session, all started by this probe, are signalled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ..sessions import kill_session, reap_session, session_members
from .live import proc_memory

OUTPUT_TAIL = 64 * 1024
STACK_GRACE = 0.3
DUMP_GAP = 0.15
MAX_DUMPS = 12


@dataclass
class Outcome:
    """What happened to the child, and every event it wrote."""

    events: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int | None = None
    seconds: float = 0.0
    timed_out: bool = False
    memory_killed: bool = False
    peak_memory: int = 0
    pid: int | None = None
    stdout: str = ""
    stderr: str = ""

    def last(self, kind: str) -> dict[str, Any] | None:
        for e in reversed(self.events):
            if e.get("event") == kind:
                return e
        return None

    @property
    def phase(self) -> str | None:
        p = self.last("phase")
        return p["phase"] if p else None

    @property
    def signal_name(self) -> str | None:
        if self.exit_code is not None and self.exit_code < 0:
            try:
                return signal.Signals(-self.exit_code).name
            except ValueError:
                return f"signal {-self.exit_code}"
        return None


def _env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    cwd = os.getcwd()
    parts = [src, cwd] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("PYTHONFAULTHANDLER", "1")
    return env


def _session_pss(sid: int) -> int:
    total = 0
    for p in session_members(sid):
        mem = proc_memory(p.pid)
        total += mem["pss"] if mem else 0
    return total


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - OUTPUT_TAIL))
            data = f.read()
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace").replace("\x00", "")


class _Reader:
    """Reads complete event lines appended to the events file since the last call."""

    def __init__(self, path: Path, sink: list[dict[str, Any]], on_event: Callable[[dict[str, Any]], None] | None):
        self.path, self.sink, self.on_event, self.pos, self.buf = path, sink, on_event, 0, b""

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except OSError:
            return
        self.pos += len(data)
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            self.sink.append(event)
            if self.on_event is not None:
                self.on_event(event)


class _Forked:
    """The ``subprocess.Popen`` surface ``_watch`` needs, for a child made with ``os.fork``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        code = self.returncode
        if code is None:
            code = self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return code


def _fork(obj: Any, spec_path: Path, events: Path, so: Any, se: Any) -> _Forked:
    """Fork a child that probes ``obj`` (a DataLoader or Dataset of the caller) in its own session."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked child, which never returns
        code = 70
        try:
            os.setsid()
            os.dup2(so.fileno(), 1)
            os.dup2(se.fileno(), 2)
            from .child import run_object

            code = run_object(obj, str(spec_path), str(events))
        finally:
            os._exit(code)
    return _Forked(pid)


def run_child(spec: dict[str, Any], timeout: float, memory_cap: int | None = None,
              on_event: Callable[[dict[str, Any]], None] | None = None, obj: Any = None) -> Outcome:
    """Run one probe child to its end, its timeout or its memory cap; return what happened.

    With ``obj`` (a DataLoader or Dataset object) the child is a fork of this process that probes
    that object; otherwise a fresh interpreter that imports ``spec["target"]``.
    """
    out = Outcome()
    with tempfile.TemporaryDirectory(prefix="torchdoctor-probe-") as tmp:
        d = Path(tmp)
        (d / "spec.json").write_text(json.dumps(spec))
        events = d / "events.jsonl"
        events.touch()
        reader = _Reader(events, out.events, on_event)
        with open(d / "stdout", "wb") as so, open(d / "stderr", "wb") as se:
            started = time.perf_counter()
            proc: Any
            if obj is not None:
                sys.stdout.flush()
                sys.stderr.flush()
                proc = _fork(obj, d / "spec.json", events, so, se)
            else:
                proc = subprocess.Popen(  # noqa: S603 - argv list
                    [sys.executable, "-m", "torchdoctor.probes.child", str(d / "spec.json"), str(events)],
                    stdin=subprocess.DEVNULL, stdout=so, stderr=se, start_new_session=True, env=_env(),
                )
            out.pid = proc.pid
            try:
                _watch(proc, out, reader, started, timeout, memory_cap)
            except BaseException:
                kill_session(proc.pid)
                raise
            finally:
                proc.wait()
                reap_session(proc.pid)
                _wait_gone(proc.pid)
            out.seconds = round(time.perf_counter() - started, 3)
            out.exit_code = proc.returncode
        reader.poll()
        out.stdout, out.stderr = _tail(d / "stdout"), _tail(d / "stderr")
    return out


def _wait_gone(sid: int, limit: float = 5.0) -> None:
    """Wait until the killed members of the session have really exited (SIGKILL is asynchronous)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        members = session_members(sid)
        if not members:
            return
        kill_session(sid)
        psutil.wait_procs(members, timeout=0.5)


def _dump_stacks(sid: int) -> None:
    """SIGUSR1 to the session's processes one after the other (their dumps share one stderr), the
    child first: faulthandler in each prints every thread's Python stack."""
    members = sorted(session_members(sid), key=lambda p: p.pid != sid)[:MAX_DUMPS]
    for member in members:
        try:
            member.send_signal(signal.SIGUSR1)
        except psutil.Error:
            continue
        time.sleep(DUMP_GAP)
    time.sleep(STACK_GRACE)


def _watch(proc: Any, out: Outcome, reader: _Reader, started: float, timeout: float,
           memory_cap: int | None) -> None:
    last_mem = 0.0
    while proc.poll() is None:
        now = time.perf_counter()
        reader.poll()
        if now - started > timeout:
            out.timed_out = True
            _dump_stacks(proc.pid)
            kill_session(proc.pid)
            return
        if now - last_mem > 0.25:
            last_mem = now
            pss = _session_pss(proc.pid)
            out.peak_memory = max(out.peak_memory, pss)
            if memory_cap is not None and pss > memory_cap:
                out.memory_killed = True
                kill_session(proc.pid)
                return
        time.sleep(0.03)
