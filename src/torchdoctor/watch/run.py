"""Launch (or attach to) a job, pass its output through, forward signals, sample, warn, report.

The command runs in a session of its own, so a terminal's Ctrl-C reaches it once: through us
(SIGINT, SIGTERM and SIGHUP are forwarded to its process group). Its stdout and stderr are copied to
ours byte for byte and to a capture file of this run, which ``explain`` reads if the job fails. The
exit status is the job's own (128 + N when a signal N ended it).

Timeline JSON (``--timeline``), ``schema_version`` 1, times in Unix seconds::

    {"schema_version": 1, "command": [...] | null, "pid": int, "exit_code": int | null,
     "signal": str | null, "started": float, "ended": float, "interval": float,
     "limits": {"max_map_count", "shm_bytes", "cgroup_memory_bytes", "mem_total_bytes"},
     "samples": [{"t", "processes": [{"pid", "ppid", "name", "rss", "pss", "vsize", "as_limit", "fds", "nofile", "maps",
                  "threads", "uid", "nproc", "cpu_percent", "gpu_bytes"}], "shm_used", "torch_segments",
                  "shm_size", "cgroup_memory", "mem_available"}],
     "warnings": [{"t", "pid", "process", "code", "family", "resource", "value", "limit", "rate",
                   "projected_seconds", "message"}],
     "diagnosis": {"code", "family", "role", "confidence", "message", "fix", "warned": <the first warning
                   of that family> | null, "warned_before_seconds"} | null}

``role`` is explain's (``root-cause``, ``cascade``, ...) or ``timeline`` when the job died of a signal
without a word and the timeline is the evidence (SIGBUS after a /dev/shm warning, SIGKILL after a
memory warning).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .sampler import Sampler, host_limits
from .trend import Warner, Warning

SCHEMA_VERSION = 1
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class WatchOptions:
    interval: float = 1.0
    horizon: float | None = None
    logs: tuple[str, ...] = ()
    """Files ``explain`` also reads at the end (an attached job's log)."""
    quiet: bool = False
    """No warning lines on stderr (the timeline still has them)."""


@dataclass
class Timeline:
    command: list[str] | None
    pid: int
    interval: float
    limits: dict[str, Any]
    started: float = field(default_factory=time.time)
    ended: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[Warning] = field(default_factory=list)
    diagnosis: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "command": self.command,
            "pid": self.pid,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "started": round(self.started, 3),
            "ended": round(self.ended or time.time(), 3),
            "interval": self.interval,
            "limits": self.limits,
            "samples": self.samples,
            "warnings": [w.to_json() for w in self.warnings],
            "diagnosis": self.diagnosis,
        }

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1, default=str) + "\n")


class Loop:
    """Sampling at ``interval`` and warning, on the calling thread or a thread of its own."""

    def __init__(
        self, root: int, opts: WatchOptions, timeline: Timeline, sampler: Sampler, warn: Callable[[Warning], None]
    ) -> None:
        self.opts, self.timeline, self.sampler, self.warn = opts, timeline, sampler, warn
        self.warner = Warner(horizon=opts.horizon) if opts.horizon else Warner()
        self.next_at = time.monotonic()

    def tick(self) -> None:
        sample = self.sampler.sample()
        self.timeline.samples.append(sample)
        for w in self.warner.feed(sample, self.timeline.limits):
            self.timeline.warnings.append(w)
            self.warn(w)

    def due(self) -> bool:
        if time.monotonic() >= self.next_at:
            self.next_at += self.opts.interval
            if self.next_at < time.monotonic():  # a slow sample: do not try to catch up
                self.next_at = time.monotonic() + self.opts.interval
            return True
        return False


def _pump(src: IO[bytes], dst: IO[bytes], capture: IO[bytes], lock: threading.Lock) -> None:
    """Copy the job's stream to ours and to the capture file, as it comes (no line buffering)."""
    broken = False
    while True:
        chunk = src.read1(65536) if hasattr(src, "read1") else src.read(65536)
        if not chunk:
            break
        if not broken:
            try:
                dst.write(chunk)
                dst.flush()
            except (BrokenPipeError, OSError, ValueError):
                broken = True  # our reader went away; keep draining so the job never blocks
        with lock:
            capture.write(chunk)


def warn_line(w: Warning, out: IO[str]) -> None:
    try:
        out.write(f"torchdoctor watch: ▲ {w.message}\n")
        out.flush()
    except (OSError, ValueError):
        pass


def run_command(argv: list[str], opts: WatchOptions, err: IO[str] = sys.stderr) -> Timeline:
    """Run ``argv`` under watch; returns its timeline (exit code included)."""
    work = Path(tempfile.mkdtemp(prefix="torchdoctor-watch-"))
    try:
        return _run(argv, opts, err, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(argv: list[str], opts: WatchOptions, err: IO[str], work: Path) -> Timeline:
    pending: list[int] = []
    child: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, frame: Any) -> None:
        if not child:
            pending.append(signum)
            return
        try:
            os.killpg(child[0].pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    # forwarding is in place before the job exists: a signal in between reaches it as soon as it does
    old = {s: signal.signal(s, forward) for s in FORWARDED}
    started = time.time()
    try:
        proc = subprocess.Popen(  # noqa: S603 - the user's own command, an argv list
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=None, start_new_session=True
        )
    except OSError as exc:
        for s, h in old.items():
            signal.signal(s, h)
        from ..errors import UsageError

        raise UsageError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from None
    child.append(proc)
    for signum in pending:
        forward(signum, None)
    limits = host_limits()
    timeline = Timeline(
        command=list(argv), pid=proc.pid, interval=opts.interval, limits=limits.to_json(), started=started
    )
    capture = open(work / "output.log", "wb")  # noqa: SIM115 - closed below, after the pumps
    lock = threading.Lock()
    assert proc.stdout is not None and proc.stderr is not None
    pumps = [
        threading.Thread(target=_pump, args=(proc.stdout, sys.stdout.buffer, capture, lock), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, sys.stderr.buffer, capture, lock), daemon=True),
    ]
    for t in pumps:
        t.start()
    loop = Loop(proc.pid, opts, timeline, Sampler(proc.pid, limits=limits), lambda w: _warn(w, opts, err))
    try:
        while proc.poll() is None:
            if loop.due():
                loop.tick()
            try:  # sleep until the next sample, or until the job ends
                proc.wait(timeout=max(0.0, loop.next_at - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if proc.poll() is None:  # we are leaving early (an error of ours): end the job we started
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        proc.wait()
        for t in pumps:
            t.join(timeout=5)
        capture.close()
    timeline.ended = time.time()
    code = proc.returncode
    if code is not None and code < 0:
        timeline.signal = signal.Signals(-code).name
        code = 128 - code
    timeline.exit_code = code
    if code:
        timeline.diagnosis = diagnose([work / "output.log", *map(Path, opts.logs)], timeline) or silent_death(timeline)
    return timeline


#: A job killed by this signal after watch warned about this resource: what it died of, code and all.
_SILENT = {("SIGBUS", "shm"): "TD157", ("SIGKILL", "cgroup_memory"): "TD273", ("SIGKILL", "host_memory"): "TD273"}


def silent_death(timeline: Timeline) -> dict[str, Any] | None:
    """A job that died of a signal without a word (SIGBUS, the OOM killer's SIGKILL): the timeline
    is the evidence when watch warned about the resource that signal means."""
    from ..registry import lookup

    for w in timeline.warnings:
        code = _SILENT.get((timeline.signal or "", w.resource))
        if code is None:
            continue
        info = lookup(code)
        end = timeline.ended or time.time()
        return {
            "code": info.code,
            "family": info.family,
            "role": "timeline",
            "confidence": 0.7,
            "message": f"the job was killed by {timeline.signal} {end - w.t:.1f} s after watch warned: {w.message}",
            "fix": info.plain_fix,
            "warned": w.to_json(),
            "warned_before_seconds": round(end - w.t, 1),
        }
    return None


def _warn(w: Warning, opts: WatchOptions, err: IO[str]) -> None:
    if not opts.quiet:
        warn_line(w, err)


def attach(pid: int, opts: WatchOptions, err: IO[str] = sys.stderr) -> Timeline:
    """Watch a running process tree (not ours) until its root exits."""
    from ..facts.procs import proc_dir, read_stat

    if read_stat(proc_dir(pid)) is None:
        from ..errors import UsageError

        raise UsageError(f"--pid {pid}: no such process (or not visible to this user)")
    limits = host_limits()
    timeline = Timeline(command=None, pid=pid, interval=opts.interval, limits=limits.to_json())
    loop = Loop(pid, opts, timeline, Sampler(pid, limits=limits), lambda w: _warn(w, opts, err))
    while True:
        st = read_stat(proc_dir(pid))
        if st is None or st.state == "Z":
            break
        if loop.due():
            loop.tick()
        time.sleep(min(0.05, opts.interval / 4))
    timeline.ended = time.time()
    if opts.logs:
        timeline.diagnosis = diagnose([Path(p) for p in opts.logs], timeline, require_failure=True)
    return timeline


def diagnose(paths: list[Path], timeline: Timeline, require_failure: bool = False) -> dict[str, Any] | None:
    """``explain`` on the job's output, with how long before the end a warning of its family came."""
    from ..explain import explain

    existing = [p for p in paths if p.exists() and p.stat().st_size > 0]
    if not existing:
        return None
    from ..errors import UsageError

    try:
        report = explain(existing if len(existing) > 1 else existing[0])  # type: ignore[arg-type]
    except UsageError:  # the job's output is binary, not a log: nothing to explain, the exit code stands
        return None
    top = report.top
    if top is None:
        return None
    first = next((w for w in timeline.warnings if w.family == top.family), None)
    end = timeline.ended or time.time()
    return {
        "code": top.code,
        "family": top.family,
        "role": top.role,
        "confidence": top.confidence,
        "message": top.message,
        "fix": top.fix,
        "warned": first.to_json() if first else None,
        "warned_before_seconds": round(end - first.t, 1) if first else None,
    }
