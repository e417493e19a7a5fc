"""The one supervisor of every child torchdoctor starts: lab scenarios, loader probes, and next the
``dist`` ranks and ``watch``'s job.

A child runs in a session of its own (``start_new_session=True``, or ``os.setsid`` after a fork),
so its session id is its pid and everything it starts shares it. :func:`supervise` watches it to
its end and owns every way that end can come:

* **deadline**: past ``timeout`` seconds the session is killed (after ``on_timeout``, e.g. asking
  the child for its stacks);
* **memory cap**: the session's memory is measured as **PSS** (proportional set size: a page
  shared by forked workers counts once, split among them), every :data:`MEMORY_EVERY` seconds;
  past ``memory_cap`` bytes the session is killed. ``peak_memory`` is the largest sum seen;
* **being stopped**: Ctrl-C, SIGTERM or SIGHUP to torchdoctor while it supervises kills the
  child's session before torchdoctor exits (:func:`stoppable` turns SIGTERM/SIGHUP into
  :class:`Stopped`);
* **leftovers**: after the child exits, whatever is left of its session (orphaned DataLoader
  workers, a forkserver) is killed, and descendants that left the session (a grandchild that
  called ``setsid``) are killed too: they were seen as descendants while the child lived, and are
  recognised by pid *and* start time, so a reused pid is never signalled. ``torch_shm_manager``
  and multiprocessing's ``resource_tracker`` get a grace period first: they unlink the shared
  memory segments and semaphores of their dead clients, which a SIGKILL would leave in /dev/shm.

Only processes this supervisor started, or that descend from them, are ever signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import psutil

from .facts.procs import proc_memory
from .stopping import Stopped, signal_name, stoppable

__all__ = ["Stopped", "signal_name", "stoppable"]  # re-exported: the supervisor's public surface

MEMORY_EVERY = 0.25
"""Seconds between two measurements of the session's memory."""
POLL = 0.03
CLEANERS = ("torch_shm_manager",)
"""Processes that unlink their clients' segments when the clients are gone: they get a grace period."""
CLEANER_MODULES = ("multiprocessing.resource_tracker",)
"""Python helpers (recognised by their command line) that unlink semaphores of dead clients."""
CLEANER_GRACE = 2.0
GONE_WAIT = 5.0


def child_env(extra: Mapping[str, str] | None = None, with_cwd: bool = False) -> dict[str, str]:
    """The environment of a child that imports torchdoctor: this checkout's ``src`` (and the
    caller's working directory, where user code lives) first on ``PYTHONPATH``, unbuffered output,
    faulthandler on (a hung or crashing child prints its stacks), then ``extra``."""
    env = dict(os.environ)
    parts = [str(Path(__file__).resolve().parents[1])] + ([os.getcwd()] if with_cwd else [])
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("PYTHONFAULTHANDLER", "1")
    env.update(extra or {})
    return env


def start(
    argv: Sequence[str], env: Mapping[str, str], stdout: IO[Any] | int | None, stderr: IO[Any] | int | None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session of its own, stdin closed."""
    return subprocess.Popen(  # noqa: S603 - an argv list, never a shell
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
        env=dict(env),
    )


class Child(Protocol):
    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self) -> int: ...


class Forked:
    """The :class:`Child` surface for a child made with ``os.fork`` (that called ``os.setsid``)."""

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


@dataclass
class Limits:
    timeout: float
    memory_cap: int | None = None
    """Bytes of PSS the child's session may use; None: measured, never enforced."""
    on_timeout: Callable[[int], None] | None = None
    """Called with the session id before the kill on timeout (e.g. ask for stacks)."""


@dataclass
class Result:
    """How a supervised child ended."""

    pid: int
    exit_code: int | None = None
    seconds: float = 0.0
    timed_out: bool = False
    memory_killed: bool = False
    peak_memory: int = 0
    """Largest PSS of the child's session seen, in bytes."""
    escaped: list[int] = field(default_factory=list)
    """Descendants that had left the session (``setsid``) and were killed at the end."""

    @property
    def signal_name(self) -> str | None:
        return signal_name(self.exit_code)


# -- the session ------------------------------------------------------------------------------------


def session_members(sid: int) -> list[psutil.Process]:
    members = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                members.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def kill_session(sid: int) -> None:
    """SIGKILL every process in the child's session: all of them were started by this run."""
    try:
        os.killpg(sid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for p in session_members(sid):
        try:
            p.kill()
        except psutil.Error:
            pass


def _is_cleaner(p: psutil.Process) -> bool:
    try:
        if p.name() in CLEANERS:
            return True
        cmd = " ".join(p.cmdline())
    except psutil.Error:
        return False
    return any(m in cmd for m in CLEANER_MODULES)


def reap_session(sid: int) -> None:
    """Kill what the child left behind, but let the cleaners (:data:`CLEANERS`,
    :data:`CLEANER_MODULES`) unlink their dead clients' segments and semaphores first."""
    cleaners = []
    for p in session_members(sid):
        if _is_cleaner(p):
            cleaners.append(p)
            continue
        try:
            p.kill()
        except psutil.Error:
            continue
    if cleaners:
        psutil.wait_procs(cleaners, timeout=CLEANER_GRACE)
    kill_session(sid)


def _wait_gone(sid: int, limit: float = GONE_WAIT) -> None:
    """Wait until the killed members of the session have really exited (SIGKILL is asynchronous)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        members = session_members(sid)
        if not members:
            return
        kill_session(sid)
        psutil.wait_procs(members, timeout=0.5)


def _wait_dead(procs: list[psutil.Process], limit: float) -> None:
    """Wait until each of ``procs`` is gone or a zombie. An orphan's zombie waits for PID 1 to reap it,
    which in some containers never happens; it no longer runs, so it counts as ended."""
    deadline = time.monotonic() + limit
    alive = list(procs)
    while alive and time.monotonic() < deadline:
        still = []
        for p in alive:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    still.append(p)
            except psutil.Error:
                continue
        alive = still
        if alive:
            time.sleep(0.02)


class _Descendants:
    """Every process seen below the child while it lived, by (pid, start time)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seen: dict[int, float] = {}
        try:
            self.root: psutil.Process | None = psutil.Process(pid)
        except psutil.Error:
            self.root = None

    def update(self) -> None:
        if self.root is None:
            return
        try:
            for p in self.root.children(recursive=True):
                try:
                    self.seen.setdefault(p.pid, p.create_time())
                except psutil.Error:
                    continue
        except psutil.Error:
            return

    def escaped(self, sid: int) -> list[psutil.Process]:
        """Those still alive outside the session (the same process: same pid and start time)."""
        out = []
        for pid, created in self.seen.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created and os.getsid(pid) != sid:
                    out.append(p)
            except (psutil.Error, ProcessLookupError, PermissionError):
                continue
        return out


def supervise(
    proc: Child, limits: Limits, poll: Callable[[], None] | None = None, started: float | None = None
) -> Result:
    """Watch ``proc`` (started in its own session) to its end, its deadline or its memory cap;
    then reap its session and escaped descendants. ``poll`` runs on every turn (read the child's
    output or events). Ctrl-C or :class:`Stopped` while watching kill the session and propagate."""
    started = time.perf_counter() if started is None else started
    result = Result(pid=proc.pid)
    tree = _Descendants(proc.pid)
    try:
        last_mem = 0.0
        while proc.poll() is None:
            now = time.perf_counter()
            if poll is not None:
                poll()
            if now - started > limits.timeout:
                result.timed_out = True
                if limits.on_timeout is not None:
                    limits.on_timeout(proc.pid)
                reap_session(proc.pid)
                break
            if now - last_mem > MEMORY_EVERY:
                last_mem = now
                tree.update()
                pss = session_pss(proc.pid)
                result.peak_memory = max(result.peak_memory, pss)
                if limits.memory_cap is not None and pss > limits.memory_cap:
                    result.memory_killed = True
                    reap_session(proc.pid)
                    break
            time.sleep(POLL)
    except BaseException:
        reap_session(proc.pid)
        raise
    finally:
        tree.update()
        proc.wait()
        reap_session(proc.pid)
        _wait_gone(proc.pid)
        escaped = tree.escaped(proc.pid)
        for p in escaped:
            try:
                p.kill()
                result.escaped.append(p.pid)
            except psutil.Error:
                continue
        if escaped:
            _wait_dead(escaped, 2.0)
        if poll is not None:
            poll()
    result.seconds = round(time.perf_counter() - started, 3)
    result.exit_code = proc.returncode
    return result


def session_pss(sid: int) -> int:
    """PSS of every process in the session, in bytes (RSS where PSS cannot be read)."""
    total = 0
    for p in session_members(sid):
        mem = proc_memory(p.pid)
        total += mem["pss"] if mem else 0
    return total
