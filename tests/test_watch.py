"""``torchdoctor watch`` on real jobs: warnings before real failures (descriptors under a lowered
RLIMIT_NOFILE, a private small /dev/shm filling up), exact passthrough, exit codes and signals,
``--pid`` attach, the Python ``Watcher``; and the pure warning rules.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from torchdoctor.watch.trend import Warner, rate

from .conftest import REPO

TD = [sys.executable, "-m", "torchdoctor", "watch"]

FD_LEAK = """
import os, resource, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
held = []
print("leaking", flush=True)
try:
    while True:
        held.append(open(os.devnull))
        time.sleep(0.01)
except OSError as exc:
    print(f"EMFILE at {time.time():.3f}: {exc}", flush=True)
    raise
"""

SHM_FILL = """
import mmap, os, time
path = "/dev/shm/td-watch-test-fill"
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
os.ftruncate(fd, 64 * 2**20)
m = mmap.mmap(fd, 64 * 2**20)
os.unlink(path)
for i in range(64):
    print(f"{i} MiB at {time.time():.3f}", flush=True)
    m[i * 2**20:(i + 1) * 2**20] = b"x" * 2**20
    time.sleep(0.08)
"""


def script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def watch(*args: str, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*TD, *args], capture_output=True, timeout=timeout, **kw)


# -- the rules -------------------------------------------------------------------------------------


def sample(t: float, fds: int, nofile: int = 1000, maps: int = 10, pid: int = 7) -> dict[str, Any]:
    return {"t": t, "processes": [{"pid": pid, "name": "job", "fds": fds, "nofile": nofile, "maps": maps}]}


def test_rate_is_the_least_squares_slope() -> None:
    assert rate(deque([(0.0, 0.0), (1.0, 10.0), (2.0, 20.0)])) == pytest.approx(10.0)
    assert rate(deque([(0.0, 5.0), (1.0, 5.0)])) is None  # too few points
    assert rate(deque([(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)])) is None  # no time span


def test_a_rising_resource_warns_once_with_its_projection() -> None:
    w = Warner()
    out = []
    for i in range(20):
        out += w.feed(sample(float(i), 100 + 40 * i), {"max_map_count": 65530})
    assert len(out) == 1, [x.message for x in out]
    first = out[0]
    assert (first.code, first.family, first.resource, first.pid) == ("TD153", "fd-exhausted", "fds", 7)
    assert first.value >= 250 and first.rate == pytest.approx(40.0)
    assert first.projected_seconds is not None and 0 < first.projected_seconds < 30
    assert "open files, +40/s, limit in ~" in first.message and first.message.endswith("TD153 too-many-open-files")


def test_a_flat_resource_far_from_its_limit_never_warns_and_one_near_it_does() -> None:
    w = Warner()
    assert not [x for i in range(30) for x in w.feed(sample(float(i), 300), {})]
    near = Warner().feed(sample(0.0, 950), {})
    assert [x.resource for x in near] == ["fds"] and "95% of the limit" in near[0].message


def test_map_count_is_judged_against_max_map_count() -> None:
    w = Warner()
    out = [x for i in range(6) for x in w.feed(sample(float(i), 5, maps=10_000 + 8_000 * i), {"max_map_count": 65530})]
    assert [(x.code, x.family, x.resource) for x in out] == [("TD155", "shm-map-count", "maps")]


# -- real jobs ---------------------------------------------------------------------------------------


def test_descriptor_leak_warns_before_emfile_and_is_explained(tmp_path: Path) -> None:
    tl = tmp_path / "t.json"
    proc = watch("--interval", "0.2", "--timeline", str(tl), "--", sys.executable, script(tmp_path, "leak.py", FD_LEAK))
    assert proc.returncode == 1, proc.stderr.decode()
    failed_at = float(proc.stdout.decode().split("EMFILE at ")[1].split(":")[0])
    data = json.loads(tl.read_text())
    warning = next(w for w in data["warnings"] if w["resource"] == "fds")
    assert warning["code"] == "TD153" and warning["limit"] == 256 and warning["family"] == "fd-exhausted"
    assert warning["t"] < failed_at, "the warning came after EMFILE"
    assert data["diagnosis"]["family"] == "fd-exhausted" and data["diagnosis"]["warned_before_seconds"] > 0
    err = proc.stderr.decode()
    assert "torchdoctor watch: ▲ pid" in err and "/256 open files" in err and "TD153" in err
    assert err.count("▲") == 1  # one warning, not one per sample
    assert {"schema_version", "command", "exit_code", "started", "ended", "samples", "warnings", "diagnosis"} <= set(
        data
    )
    assert data["exit_code"] == 1 and data["samples"] and all("processes" in s for s in data["samples"])


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare -m")
def test_a_small_private_shm_filling_warns_before_the_bus_error(tmp_path: Path) -> None:
    tl = tmp_path / "t.json"
    inner = " ".join(
        [*TD, "--interval", "0.2", "--timeline", str(tl), "--", sys.executable, script(tmp_path, "fill.py", SHM_FILL)]
    )
    proc = subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            f"mount -t tmpfs -o size=16m tmpfs /dev/shm && exec {inner}",
        ],
        capture_output=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    assert proc.returncode == 128 + signal.SIGBUS, proc.stderr.decode()
    last_written = float(proc.stdout.decode().strip().splitlines()[-1].split(" at ")[1])  # the write that faulted
    data = json.loads(tl.read_text())
    assert data["signal"] == "SIGBUS" and data["exit_code"] == 135
    warning = next(w for w in data["warnings"] if w["resource"] == "shm")
    assert warning["code"] == "TD156" and warning["limit"] == 16 * 2**20 and warning["t"] < last_written
    assert data["diagnosis"]["code"] == "TD157" and data["diagnosis"]["family"] == "shm-exhausted"


def test_output_passes_through_byte_for_byte_and_the_exit_code_is_the_jobs(tmp_path: Path) -> None:
    job = script(
        tmp_path,
        "out.py",
        """
        import sys
        sys.stdout.buffer.write(bytes(range(256)) + b"no newline at the end")
        sys.stderr.buffer.write(b"\\xff\\xfe err \\r progress\\r")
        sys.exit(7)
        """,
    )
    proc = watch("--", sys.executable, job)
    assert proc.returncode == 7
    assert proc.stdout == bytes(range(256)) + b"no newline at the end"
    assert proc.stderr.startswith(b"\xff\xfe err \r progress\r")
    ok = watch("--", sys.executable, "-c", "print('fine')")
    assert ok.returncode == 0 and ok.stdout == b"fine\n"


def test_a_job_killed_by_a_signal_exits_128_plus_it(tmp_path: Path) -> None:
    proc = watch("--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert proc.returncode == 128 + signal.SIGKILL
    assert b"exit 137, SIGKILL" in proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signals_are_forwarded_to_the_job(sig: signal.Signals, tmp_path: Path) -> None:
    job = script(
        tmp_path,
        "sig.py",
        """
        import signal, sys, time
        def on(signum, frame):
            print(f"job got {signal.Signals(signum).name}", flush=True)
            sys.exit(40)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, on)
        print("ready", flush=True)
        time.sleep(60)
        """,
    )
    proc = subprocess.Popen([*TD, "--", sys.executable, job], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 40
    assert out == f"job got {sig.name}\n".encode()


def test_attach_to_a_running_pid_until_it_ends(tmp_path: Path) -> None:
    job = subprocess.Popen([sys.executable, script(tmp_path, "leak.py", FD_LEAK)], stdout=subprocess.PIPE)
    tl = tmp_path / "t.json"
    try:
        proc = watch("--pid", str(job.pid), "--interval", "0.2", "--timeline", str(tl), timeout=60)
    finally:
        job.kill()
        job.wait()
    assert proc.returncode == 0, proc.stderr.decode()
    data = json.loads(tl.read_text())
    assert data["command"] is None and data["pid"] == job.pid and data["exit_code"] is None
    assert [w["code"] for w in data["warnings"]] == ["TD153"]


def test_children_are_picked_up_as_they_appear(tmp_path: Path) -> None:
    job = script(
        tmp_path,
        "kids.py",
        """
        import subprocess, sys, time
        time.sleep(0.6)
        kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"]) for _ in range(3)]
        for k in kids:
            k.wait()
        """,
    )
    tl = tmp_path / "t.json"
    proc = watch("--interval", "0.2", "--timeline", str(tl), "--", sys.executable, job)
    assert proc.returncode == 0
    counts = [len(s["processes"]) for s in json.loads(tl.read_text())["samples"]]
    assert counts[0] == 1 and max(counts) == 4


def test_usage_errors_are_one_line(tmp_path: Path) -> None:
    for args, words in (
        ([], "nothing to watch"),
        (["--pid", "1", "--", "true"], "not both"),
        (["--report", "x.pdf", "--", "true"], ".html"),
        (["--", "/no/such/program"], "cannot start"),
        (["--pid", "999999999"], "no such process"),
    ):
        proc = watch(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert words.encode() in proc.stderr and b"Traceback" not in proc.stderr


def test_watcher_api_warns_from_inside_the_script(tmp_path: Path) -> None:
    job = script(
        tmp_path,
        "api.py",
        f"""
        import json, os, resource, sys, time
        sys.path.insert(0, {str(REPO / "src")!r})
        from torchdoctor import Watcher
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        held = []
        with Watcher(interval=0.2, timeline={str(tmp_path / "api.json")!r}) as w:
            for _ in range(200):
                held.append(open(os.devnull))
                time.sleep(0.01)
        print(json.dumps([x.code for x in w.warnings]))
        """,
    )
    proc = subprocess.run([sys.executable, job], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout) == ["TD153"]
    assert b"torchdoctor watch: \xe2\x96\xb2 pid" in proc.stderr
    assert json.loads((tmp_path / "api.json").read_text())["warnings"][0]["limit"] == 256
    with pytest.raises(ValueError, match="interval"):
        from torchdoctor import Watcher

        Watcher(interval=0)


def test_no_process_of_ours_stays_behind_when_watch_is_killed(tmp_path: Path) -> None:
    """SIGKILL cannot be forwarded: the job is in a session of its own and keeps running, as a job
    started with nohup would; but SIGTERM to watch ends the job and watch itself."""
    job = script(tmp_path, "slow.py", "import time\nprint('ready', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([*TD, "--", sys.executable, job], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    kids = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
    proc.terminate()
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    time.sleep(0.2)
    for pid in kids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]
