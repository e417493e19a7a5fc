"""Run the probe child in isolation: own session, hard timeout, optional memory cap, nothing left over.

The child (:mod:`.child`) runs the user's code. :func:`torchdoctor.supervise.supervise` (the one
supervisor) watches it: this module only reads the child's event lines as they come (for
progress) and, when the deadline passes, asks the child with SIGUSR1 to print every thread's
Python stack before the supervisor kills its session. The memory cap is the supervisor's (PSS,
so pages shared by forked workers count once), and so is the reaping of whatever is left.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ..supervise import Forked, Limits, child_env, session_members, signal_name, start, supervise

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
        return signal_name(self.exit_code)


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


def _fork(obj: Any, spec_path: Path, events: Path, so: Any, se: Any) -> Forked:
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
    return Forked(pid)


def run_child(
    spec: dict[str, Any],
    timeout: float,
    memory_cap: int | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    obj: Any = None,
) -> Outcome:
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
                proc = start(
                    [sys.executable, "-m", "torchdoctor.probes.child", str(d / "spec.json"), str(events)],
                    child_env(with_cwd=True),
                    stdout=so,
                    stderr=se,
                )
            out.pid = proc.pid
            result = supervise(proc, Limits(timeout, memory_cap, on_timeout=_dump_stacks), reader.poll, started)
            out.seconds, out.exit_code = result.seconds, result.exit_code
            out.timed_out, out.memory_killed, out.peak_memory = (
                result.timed_out,
                result.memory_killed,
                result.peak_memory,
            )
        reader.poll()
        out.stdout, out.stderr = _tail(d / "stdout"), _tail(d / "stderr")
    return out


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
