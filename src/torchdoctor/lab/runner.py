"""Run a scenario in an isolated child: own session, bounded in time and memory, output as bytes.

Safety rules: limits are applied in the child only; a scenario that wants a small or private
/dev/shm gets a private tmpfs in its own mount namespace (``unshare -m``), never the real one.
The child is watched by :func:`torchdoctor.supervise.supervise` (the one supervisor): on timeout,
memory overrun (PSS of its session), Ctrl-C, SIGTERM or SIGHUP its whole session is killed (a
killed DataLoader owner can orphan workers that pin thousands of shm segments), and so is
anything left of it after a normal exit. Only processes this runner started are ever signalled.
The child's ``TMPDIR`` is a directory of this run (``torchdoctor-lab-<scenario>-p<pid>-*``, ``pid`` the
runner's own), removed after its session is gone, so what a killed scenario could not clean up (its temporary
directories) goes too. A runner that is itself killed with SIGKILL cannot remove it: the next run removes
such directories of runners that are gone (:func:`sweep_stale_scratch`).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from ..stopping import pid_alive
from ..supervise import Limits, child_env, signal_name, start, supervise
from . import Scenario

OUTPUT_LIMIT = 8 * 1024 * 1024
SCRATCH = re.compile(r"torchdoctor-lab-[a-z0-9-]+-p(?P<pid>[0-9]+)-[A-Za-z0-9_]{8}")
"""A run's scratch directory (``tempfile.mkdtemp``'s 8-character suffix), named after the runner's PID."""
PRIVATE_SHM_SIZE = "4g"


@dataclass
class RunRecord:
    scenario: str
    fixed: bool
    argv: list[str]
    exit_code: int | None = None
    seconds: float = 0.0
    output: bytes = b""
    timed_out: bool = False
    memory_killed: bool = False
    peak_rss_mb: float = 0.0
    """Peak memory of the scenario's session in MB: PSS (pages shared by workers count once)."""
    skipped: str | None = None
    private_shm: str | None = None
    notes: list[str] = field(default_factory=list)
    timeline: dict[str, Any] | None = None
    """With ``watch=True``: what ``torchdoctor watch`` sampled and warned (its timeline JSON)."""

    @property
    def signal_name(self) -> str | None:
        return signal_name(self.exit_code)

    @property
    def failed(self) -> bool:
        """The child did not exit cleanly (an exception, a signal, a kill on timeout)."""
        return self.skipped is None and self.exit_code != 0

    def text(self) -> str:
        """Output decoded for reading; undecodable bytes replaced, NULs (crash banners end in one) dropped."""
        return self.output.decode("utf-8", errors="replace").replace("\x00", "")

    def tail(self, lines: int = 25) -> str:
        return "\n".join(self.text().rstrip("\n").splitlines()[-lines:])


@cache
def _unshare_works() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare is not installed"
    try:
        proc = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    if proc.returncode != 0:
        return "unshare -m is not permitted here: " + proc.stderr.decode(errors="replace").strip()
    return None


def missing_needs(s: Scenario) -> str | None:
    """Why ``s`` cannot run on this machine, or None when it can."""
    for need in s.needs:
        if need == "torch" and importlib.util.find_spec("torch") is None:
            return "torch is not installed (pip install torch)"
        if need == "lightning" and not any(importlib.util.find_spec(m) for m in ("lightning", "pytorch_lightning")):
            return "PyTorch Lightning is not installed (pip install 'torchdoctor[lightning]')"
        if need == "root" and os.geteuid() != 0:
            return "needs root (private mounts, dropped privileges)"
        if need == "unshare":
            reason = _unshare_works() if os.geteuid() == 0 else "unshare -m needs root"
            if reason:
                return reason
        if need in ("chattr", "setpriv") and shutil.which(need) is None:
            return f"{need} is not installed"
    if s.shm_size and (os.geteuid() != 0 or _unshare_works()):
        return f"needs root and unshare -m for a private {s.shm_size} /dev/shm"
    return None


def _child_argv(s: Scenario, fixed: bool) -> tuple[list[str], str | None]:
    argv = [sys.executable, "-m", "torchdoctor.lab.child", s.name] + (["--fixed"] if fixed else [])
    size = s.shm_size
    if size is None and s.private_shm and os.geteuid() == 0 and _unshare_works() is None:
        size = PRIVATE_SHM_SIZE
    if size is None:
        return argv, None
    script = 'mount -t tmpfs -o size="$0",mode=1777 tmpfs /dev/shm && exec "$@"'
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, size, *argv], size


def _child_env(s: Scenario) -> dict[str, str]:
    env = child_env(s.env)
    if "PYTHONFAULTHANDLER" not in s.env and "PYTHONFAULTHANDLER" not in os.environ:
        env.pop("PYTHONFAULTHANDLER", None)  # a scenario's crash text is torch's own, not faulthandler's
    return env


class _LabWatch:
    """``torchdoctor watch``'s sampling loop, driven by the supervisor's poll."""

    def __init__(self, pid: int, interval: float) -> None:
        from ..watch.run import Loop, Timeline, WatchOptions
        from ..watch.sampler import Sampler, host_limits

        limits = host_limits()
        self.timeline = Timeline(command=None, pid=pid, interval=interval, limits=limits.to_json())
        self.loop = Loop(pid, WatchOptions(interval=interval), self.timeline, Sampler(pid, limits=limits), _quiet)

        self.arrivals: list[tuple[float, bytes]] = []
        """Each chunk of the scenario's output and when it arrived."""

    def poll(self) -> None:
        if self.loop.due():
            self.loop.tick()

    def failed_at(self, code: str) -> float | None:
        """When the output first showed ``code``'s failure (the engine's own matcher), Unix seconds."""
        from ..explain import shows

        text = b""
        for t, chunk in self.arrivals:
            text += chunk
            if shows(text.decode("utf-8", errors="replace"), code):
                return t
        return None


def _quiet(_: Any) -> None:
    return None


def run(s: Scenario, fixed: bool = False, timeout: float | None = None, watch: float | None = None) -> RunRecord:
    """Run one scenario (or its fixed variant) and capture what really happened. ``watch``: sample the
    scenario's process tree every ``watch`` seconds, as ``torchdoctor watch`` does (its timeline)."""
    argv, shm = _child_argv(s, fixed)
    record = RunRecord(scenario=s.name, fixed=fixed, argv=argv, private_shm=shm)
    reason = missing_needs(s)
    if reason:
        record.skipped = reason
        return record
    limit = timeout or s.timeout
    # the scenario's temporary files go into a directory of this run, removed once its session is gone: a child
    # killed at its deadline, past its memory bound or with torchdoctor (SIGTERM) cannot clean up after itself
    sweep_stale_scratch()
    scratch = tempfile.mkdtemp(prefix=f"torchdoctor-lab-{s.name}-p{os.getpid()}-")
    os.chmod(scratch, 0o755)  # a scenario rerun as an unprivileged user must still reach the directories made in it
    try:
        return _run_in(s, record, argv, limit, watch, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def sweep_stale_scratch(where: str | None = None) -> list[str]:
    """Remove the scratch directories (:data:`SCRATCH`) that runners killed with SIGKILL left in ``where`` (the
    temporary directory): only this user's, and only those whose runner's PID no longer exists. A live PID, even
    one reused by another program, keeps its directory. Returns what was removed."""
    where = where or tempfile.gettempdir()
    removed: list[str] = []
    try:
        entries = list(os.scandir(where))
    except OSError:
        return removed
    for entry in entries:
        m = SCRATCH.fullmatch(entry.name)
        if not m:
            continue
        try:
            ours = entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_uid == os.getuid()
        except OSError:
            continue
        if not ours or pid_alive(int(m["pid"])):  # a live PID (its runner, or a reuse) keeps its directory
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


def _run_in(
    s: Scenario, record: RunRecord, argv: list[str], limit: float, watch: float | None, scratch: str
) -> RunRecord:
    chunks: list[bytes] = []
    size = [0]
    env = _child_env(s)
    env["TMPDIR"] = scratch
    started = time.perf_counter()
    proc = start(argv, env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None

    def reader() -> None:
        assert proc.stdout is not None
        for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr,attr-defined]
            if watcher is not None:
                watcher.arrivals.append((time.time(), chunk))
            chunks.append(chunk)
            size[0] += len(chunk)
            while size[0] > OUTPUT_LIMIT and len(chunks) > 2:  # keep the head and the newest output
                size[0] -= len(chunks.pop(1))

    watcher = _LabWatch(proc.pid, watch) if watch else None
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        result = supervise(
            proc,
            Limits(timeout=limit, memory_cap=s.memory_mb * 2**20),
            poll=watcher.poll if watcher else None,
            started=started,
        )
    finally:
        t.join(5)
    if watcher is not None:
        watcher.timeline.ended = time.time()
        code = proc.returncode
        watcher.timeline.exit_code = code
        record.timeline = watcher.timeline.to_json()
        record.timeline["failed_at"] = watcher.failed_at(s.code)
    record.timed_out = result.timed_out
    record.peak_rss_mb = round(result.peak_memory / 2**20, 1)
    if result.memory_killed:
        record.memory_killed = True
        record.notes.append(f"killed: {record.peak_rss_mb:.0f} MB (PSS) passed the {s.memory_mb} MB bound")
    if result.escaped:
        record.notes.append(f"killed {len(result.escaped)} process(es) that had left the scenario's session")
    record.seconds = round(time.perf_counter() - started, 2)
    record.exit_code = proc.returncode
    record.output = b"".join(chunks)
    return record
