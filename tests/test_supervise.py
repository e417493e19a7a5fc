"""The one supervisor (torchdoctor.supervise): deadlines, memory cap, leftovers, and however
torchdoctor itself is stopped, nothing it started stays running. Real processes throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from torchdoctor.supervise import Limits, child_env, session_members, start, supervise

from .conftest import REPO

PY = sys.executable


def _alive(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "child.py"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return [PY, str(path)]


def test_a_deadline_kills_the_whole_session(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    argv = _script(
        tmp_path,
        f"""
        import subprocess, sys, time
        kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
        open({str(pids)!r}, "w").write(" ".join(str(k.pid) for k in kids))
        time.sleep(60)
    """,
    )
    proc = start(argv, child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = supervise(proc, Limits(timeout=2.0))
    assert result.timed_out and result.signal_name == "SIGKILL"
    assert 1.5 < result.seconds < 15
    kids = [int(p) for p in pids.read_text().split()]
    assert len(kids) == 2 and not any(_alive(k) for k in kids)
    assert session_members(proc.pid) == []


def test_a_descendant_that_left_the_session_is_ended_too(tmp_path: Path) -> None:
    pidfile = tmp_path / "escaped"
    argv = _script(
        tmp_path,
        f"""
        import subprocess, sys, time
        # a grandchild in a session of its own (setsid): killing the child's session misses it
        code = "import os, time; os.setsid(); open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
        subprocess.Popen([sys.executable, "-c", code])
        time.sleep(2)
    """,
    )
    proc = start(argv, child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = supervise(proc, Limits(timeout=30.0))
    escaped = int(pidfile.read_text())
    assert result.exit_code == 0 and not result.timed_out
    assert escaped in result.escaped
    assert not _alive(escaped)


def test_the_memory_cap_is_on_the_sessions_pss(tmp_path: Path) -> None:
    argv = _script(
        tmp_path,
        """
        import time
        block = bytearray(400 * 2**20)  # touched: resident
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(60)
    """,
    )
    proc = start(argv, child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = supervise(proc, Limits(timeout=60.0, memory_cap=200 * 2**20))
    assert result.memory_killed and not result.timed_out
    assert result.peak_memory > 200 * 2**20
    assert result.seconds < 30


def test_a_normal_exit_keeps_its_code_and_reaps_orphans(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    argv = _script(
        tmp_path,
        f"""
        import subprocess, sys
        kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pids)!r}, "w").write(str(kid.pid))
        sys.exit(3)
    """,
    )
    proc = start(argv, child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = supervise(proc, Limits(timeout=30.0))
    assert result.exit_code == 3 and result.signal_name is None
    assert not _alive(int(pids.read_text()))


def _shm_names(prefix: str) -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}
    except OSError:
        return set()


def test_killed_spawn_workers_leave_no_semaphores_in_dev_shm(tmp_path: Path) -> None:
    """The multiprocessing resource tracker unlinks the semaphores of dead clients, if it is let live
    until they are dead: the supervisor spares it, then ends it."""
    argv = _script(
        tmp_path,
        """
        import multiprocessing as mp, time
        def work(_):
            time.sleep(60)
        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            locks = [ctx.Lock() for _ in range(4)]
            pool = ctx.Pool(2)
            pool.map_async(work, range(4))
            time.sleep(60)
    """,
    )
    before = _shm_names("sem.mp-")
    proc = start(argv, child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = supervise(proc, Limits(timeout=6.0))
    assert result.timed_out
    assert session_members(proc.pid) == []
    left = _shm_names("sem.mp-") - before
    assert left == set(), f"semaphores left behind: {sorted(left)}"


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)])
def test_stopping_loader_leaves_nothing_running(tmp_path: Path, sig: int, code: int) -> None:
    pytest.importorskip("torch")
    target = tmp_path / "slow_loader.py"
    target.write_text(
        textwrap.dedent("""
        import time
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Slow(Dataset):
            def __len__(self):
                return 10_000
            def __getitem__(self, i):
                time.sleep(0.5)
                return torch.zeros(4)

        def make_loader():
            return DataLoader(Slow(), batch_size=4, num_workers=2)
    """),
        encoding="utf-8",
    )
    proc = subprocess.Popen(
        [PY, "-m", "torchdoctor", "loader", f"{target}:make_loader", "--timeout", "120"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=child_env(),
    )
    seen: dict[int, float] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until the probe child and its workers run
        for p in _descendants(proc.pid):
            try:
                seen.setdefault(p.pid, p.create_time())
            except psutil.Error:
                pass
        if len(seen) >= 3:
            break
        time.sleep(0.2)
    assert len(seen) >= 3, "the probe child and its two workers never started"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err.decode()
    time.sleep(0.5)
    left = [pid for pid, created in seen.items() if _alive(pid) and psutil.Process(pid).create_time() == created]
    assert left == [], f"still running after {signal.Signals(sig).name}: {left}"


def test_stopping_lab_run_leaves_nothing_running(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    proc = subprocess.Popen(
        [PY, "-m", "torchdoctor", "lab", "run", "dist-peer-hangs"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=child_env(),
    )
    seen: dict[int, float] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for p in _descendants(proc.pid):
            try:
                seen.setdefault(p.pid, p.create_time())
            except psutil.Error:
                pass
        if len(seen) >= 3:  # the scenario child and its two ranks
            break
        time.sleep(0.2)
    assert len(seen) >= 3
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err.decode()
    time.sleep(0.5)
    left = [pid for pid, created in seen.items() if _alive(pid) and psutil.Process(pid).create_time() == created]
    assert left == []
