"""``torchdoctor.guard()`` in real processes: the report, the one stderr block, exit codes kept,
torchelastic's error file read by a real torchrun, secrets kept out, deliberate exits left alone."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

SECRET = "hf_abcdefghijklmnopqrstuvwxyz123456"
ENOSPC = "raise OSError(28, 'No space left on device')"
BLOCK = "torchdoctor: rank "
ENV_DROP = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GROUP_RANK")


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ENV_DROP and not k.startswith(("SLURM_", "TORCHELASTIC_")) and k != "PYTHONWARNINGS"
    }
    return {**env, "GLOO_SOCKET_IFNAME": "lo", **extra}


def run_script(tmp_path: Path, body: str, env: dict[str, str] | None = None, timeout: float = 60) -> Any:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def reports(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(directory.glob("rank-*.json"))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_with_guard_reports_and_keeps_the_exit_code(tmp_path: Path) -> None:
    bare = run_script(tmp_path, f"{ENOSPC}\n")
    proc = run_script(
        tmp_path,
        f"""
        from torchdoctor.guards.report import guard
        def save():
            {ENOSPC}
        with guard(report_dir="reps"):
            save()
        """,
    )
    assert bare.returncode == proc.returncode == 1, proc.stderr
    assert "OSError: [Errno 28] No space left on device" in proc.stderr  # the traceback still prints
    assert proc.stderr.count(BLOCK) == 1
    assert "TD654" in proc.stderr and "fix: " in proc.stderr
    (rep,) = reports(tmp_path / "reps")
    assert (tmp_path / "reps" / f"rank-0-{rep['process']['host'].split('.')[0]}-{rep['process']['pid']}.json").exists()
    assert rep["diagnosis"]["code"] == "TD654" and rep["diagnosis"]["family"] == "checkpoint-io"
    assert rep["diagnosis"]["fix"] and 0 < rep["diagnosis"]["confidence"] <= 1
    assert rep["exception"]["type"] == "OSError"
    assert "No space left on device" in rep["exception"]["message"]
    assert "in save" in rep["exception"]["traceback"]
    assert rep["memory"]["process"]["rss"] > 0 and rep["memory"]["cuda"] is None
    assert {"host", "limits", "shm", "memory", "cgroup"} <= set(rep["facts"])
    assert rep["facts"]["meta"]["gather_seconds"] < 1.5
    assert rep["time"].endswith("Z") and not rep["problems"]
    assert str(tmp_path / "reps") in proc.stderr or "reps/rank-0-" in proc.stderr


def test_decorator_with_real_torch_error_and_no_diagnosis(tmp_path: Path) -> None:
    """A real torch failure that no catalogue code explains: a report with diagnosis null; torch is
    the program's own import, the guard needs none."""
    proc = run_script(
        tmp_path,
        """
        import torch
        from torchdoctor.guards.report import guard
        @guard(report_dir="reps")
        def step():
            torch.nn.Linear(3, 4)(torch.zeros(2, 5))
        step()
        """,
    )
    assert proc.returncode == 1
    assert proc.stderr.count(BLOCK) == 1 and "no known cause matched" in proc.stderr
    (rep,) = reports(tmp_path / "reps")
    assert rep["diagnosis"] is None
    assert "shapes cannot be multiplied" in rep["exception"]["message"]
    assert rep["process"]["torch_imported"] is True


def test_nested_guards_report_once(tmp_path: Path) -> None:
    proc = run_script(
        tmp_path,
        f"""
        import torchdoctor.guards.report as r
        r.install(report_dir="reps")
        with r.guard(report_dir="reps"):
            with r.guard(report_dir="reps"):
                {ENOSPC}
        """,
    )
    assert proc.returncode == 1
    assert proc.stderr.count(BLOCK) == 1
    assert len(reports(tmp_path / "reps")) == 1


def test_install_reports_a_thread_and_main(tmp_path: Path) -> None:
    proc = run_script(
        tmp_path,
        f"""
        import threading
        import torchdoctor.guards.report as r
        r.guard.install(report_dir="reps")
        def work():
            {ENOSPC}
        t = threading.Thread(target=work, name="saver")
        t.start(); t.join()
        raise RuntimeError("main failed after the saver thread")
        """,
    )
    assert proc.returncode == 1
    assert "Exception in thread saver" in proc.stderr  # the previous hooks still run
    assert "RuntimeError: main failed after the saver thread" in proc.stderr
    assert proc.stderr.count(BLOCK) == 1  # the block once per process; later failures one line
    assert "torchdoctor: another failure (RuntimeError)" in proc.stderr
    reps = reports(tmp_path / "reps")
    assert len(reps) == 2
    by_thread = {r["exception"]["thread"]: r for r in reps}
    assert by_thread["saver"]["diagnosis"]["code"] == "TD654"
    assert by_thread["MainThread"]["exception"]["message"] == "main failed after the saver thread"


def test_secret_in_environment_and_message_stays_out(tmp_path: Path) -> None:
    proc = run_script(
        tmp_path,
        """
        import os
        from torchdoctor.guards.report import guard
        with guard(report_dir="reps"):
            raise RuntimeError("login failed with token " + os.environ["HF_TOKEN"])
        """,
        env=clean_env(HF_TOKEN=SECRET, TORCHELASTIC_ERROR_FILE=str(tmp_path / "error.json")),
    )
    assert proc.returncode == 1
    (path,) = (tmp_path / "reps").glob("rank-*.json")
    text = path.read_text()
    assert SECRET not in text and "<redacted>" in text
    assert SECRET not in (tmp_path / "error.json").read_text()
    block = proc.stderr[proc.stderr.index(BLOCK) :]
    assert SECRET not in block.split("Traceback")[0]


@pytest.mark.parametrize(
    "body, code",
    [
        ("raise SystemExit(0)", 0),
        ("import sys; sys.exit(3)", 3),
        ("raise KeyboardInterrupt", -2),
    ],
)
def test_deliberate_exits_are_not_failures(tmp_path: Path, body: str, code: int) -> None:
    err = tmp_path / "error.json"
    proc = run_script(
        tmp_path,
        f"""
        import torchdoctor.guards.report as r
        r.install(report_dir="reps")
        with r.guard(report_dir="reps"):
            {body}
        """,
        env=clean_env(TORCHELASTIC_ERROR_FILE=str(err)),
    )
    # an uncaught KeyboardInterrupt ends Python by SIGINT (-2), as without the guard
    assert proc.returncode == (-2 if "Keyboard" in body else code), proc.stderr
    assert not (tmp_path / "reps").exists()
    assert BLOCK not in proc.stderr
    assert not err.exists()


def test_error_file_is_torchelastic_format_and_never_overwritten(tmp_path: Path) -> None:
    err = tmp_path / "error.json"
    proc = run_script(
        tmp_path,
        f"from torchdoctor.guards.report import guard\nwith guard('reps'):\n    {ENOSPC}\n",
        env=clean_env(TORCHELASTIC_ERROR_FILE=str(err)),
    )
    assert proc.returncode == 1
    data = json.loads(err.read_text())
    assert set(data) == {"message"} and set(data["message"]) == {"message", "extraInfo"}
    assert data["message"]["message"] == "OSError: [Errno 28] No space left on device"
    assert set(data["message"]["extraInfo"]) == {"py_callstack", "timestamp"}
    assert data["message"]["extraInfo"]["py_callstack"].startswith("Traceback (most recent call last):")
    assert data["message"]["extraInfo"]["timestamp"].isdigit()
    # torch's own reader accepts it
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(err))
    assert failure.message["message"] == "OSError: [Errno 28] No space left on device"

    err.write_text('{"message": "first"}')
    run_script(
        tmp_path,
        f"from torchdoctor.guards.report import guard\nwith guard('reps'):\n    {ENOSPC}\n",
        env=clean_env(TORCHELASTIC_ERROR_FILE=str(err)),
    )
    assert json.loads(err.read_text()) == {"message": "first"}


def test_torchrun_root_cause_shows_rank_1_message(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import os
            import torch.distributed as dist
            import torchdoctor
            with torchdoctor.guard(report_dir="reps"):
                dist.init_process_group("gloo")
                dist.barrier()
                if dist.get_rank() == 1:
                    raise OSError(28, "No space left on device: '/ckpt/step-100.pt'")
                dist.destroy_process_group()
            """
        )
    )
    port = free_port()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--max-restarts",
            "0",
            str(script),
        ],
        cwd=tmp_path,
        env=clean_env(TMPDIR=str(tmp_path)),  # torchrun's own log directory (torchelastic_*) goes there
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "Root Cause" in out, out[-3000:]
    root = out[out.index("Root Cause") :]
    root = root[: root.index("=====")] if "=====" in root else root
    assert "rank      : 1" in root, root
    assert "No space left on device: '/ckpt/step-100.pt'" in root, root
    reps = {r["rank"]["RANK"]: r for r in reports(tmp_path / "reps")}
    assert reps["1"]["diagnosis"]["code"] == "TD654"
    assert reps["1"]["rank"]["WORLD_SIZE"] == "2" and "TORCHELASTIC_RUN_ID" in reps["1"]["rank"]
    assert out.count("torchdoctor: rank 1 failed") == 1


def test_unwritable_report_dir_is_one_line_and_the_exception_goes_on(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = run_script(
        tmp_path,
        f"""
        from torchdoctor.guards.report import guard
        with guard(report_dir={str(blocker / "reps")!r}):
            {ENOSPC}
        """,
    )
    assert proc.returncode == 1
    assert "torchdoctor: could not write the error report (" in proc.stderr
    assert proc.stderr.count(BLOCK) == 1 and "TD654" in proc.stderr and "report: not written" in proc.stderr
    assert proc.stderr.rstrip().endswith("OSError: [Errno 28] No space left on device")


def test_bare_decorator_is_refused_with_a_hint() -> None:
    from torchdoctor.guards.report import guard

    with pytest.raises(TypeError, match=r"guard\(\)"):
        guard(lambda: None)  # type: ignore[arg-type]


def test_passing_code_writes_nothing(tmp_path: Path) -> None:
    proc = run_script(
        tmp_path,
        """
        import torchdoctor
        torchdoctor.guard.install(report_dir="reps")
        with torchdoctor.guard(report_dir="reps"):
            x = 1
        print("ok")
        """,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok" and proc.stderr == ""
    assert not (tmp_path / "reps").exists()
