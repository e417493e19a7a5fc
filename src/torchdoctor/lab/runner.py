"""Run a scenario in an isolated child: own session, bounded in time and memory, output as bytes.

Safety rules: limits are applied in the child only; a scenario that wants a small or private
/dev/shm gets a private tmpfs in its own mount namespace (``unshare -m``), never the real one;
on timeout, memory overrun or Ctrl-C the child's whole process group is killed (a killed
DataLoader owner can orphan workers that pin thousands of shm segments), and so is anything left
in it after a normal exit. Only processes this runner started are ever signalled.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import psutil

from ..sessions import kill_session, reap_session, session_members
from . import Scenario

OUTPUT_LIMIT = 8 * 1024 * 1024
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
    skipped: str | None = None
    private_shm: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def signal_name(self) -> str | None:
        if self.exit_code is not None and self.exit_code < 0:
            try:
                return signal.Signals(-self.exit_code).name
            except ValueError:
                return f"signal {-self.exit_code}"
        return None

    @property
    def failed(self) -> bool:
        """The child did not exit cleanly (an exception, a signal, a kill on timeout)."""
        return self.skipped is None and self.exit_code != 0

    def text(self) -> str:
        """Output decoded for reading; undecodable bytes replaced, NULs (crash banners end in one) dropped."""
        return self.output.decode("utf-8", errors="replace").replace("\x00", "")

    def tail(self, lines: int = 25) -> str:
        return "\n".join(self.text().rstrip("\n").splitlines()[-lines:])


@lru_cache(maxsize=None)
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
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(s.env)
    return env


def run(s: Scenario, fixed: bool = False, timeout: float | None = None) -> RunRecord:
    """Run one scenario (or its fixed variant) and capture what really happened."""
    argv, shm = _child_argv(s, fixed)
    record = RunRecord(scenario=s.name, fixed=fixed, argv=argv, private_shm=shm)
    reason = missing_needs(s)
    if reason:
        record.skipped = reason
        return record
    limit = timeout or s.timeout
    chunks: list[bytes] = []
    size = [0]

    start = time.perf_counter()
    proc = subprocess.Popen(  # noqa: S603 - argv list
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True, env=_child_env(s),
    )
    assert proc.stdout is not None

    def reader() -> None:
        assert proc.stdout is not None
        for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr,attr-defined]
            chunks.append(chunk)
            size[0] += len(chunk)
            while size[0] > OUTPUT_LIMIT and len(chunks) > 2:  # keep the head and the newest output
                size[0] -= len(chunks.pop(1))

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    last_mem = 0.0
    try:
        while proc.poll() is None:
            now = time.perf_counter()
            if now - start > limit:
                record.timed_out = True
                kill_session(proc.pid)
                break
            if now - last_mem > 0.5:
                last_mem = now
                rss = sum(_rss(p) for p in session_members(proc.pid)) / 2**20
                record.peak_rss_mb = max(record.peak_rss_mb, round(rss, 1))
                if rss > s.memory_mb:
                    record.memory_killed = True
                    record.notes.append(f"killed: {rss:.0f} MB RSS passed the {s.memory_mb} MB bound")
                    kill_session(proc.pid)
                    break
            time.sleep(0.05)
    except BaseException:
        kill_session(proc.pid)
        raise
    finally:
        proc.wait()
        reap_session(proc.pid)  # orphaned workers of a crashed owner
        t.join(5)
    record.seconds = round(time.perf_counter() - start, 2)
    record.exit_code = proc.returncode
    record.output = b"".join(chunks)
    return record


def _rss(p: psutil.Process) -> int:
    try:
        return int(p.memory_info().rss)
    except psutil.Error:
        return 0
