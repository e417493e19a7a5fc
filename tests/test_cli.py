"""The real CLI in a subprocess: exit codes, errors as one line, formats, redaction."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import psutil
import pytest

from .conftest import run_cli, run_json

FINDING_KEYS = {"code", "name", "family", "severity", "area", "title", "message", "evidence", "fix", "related"}


def test_help_teaches_the_commands() -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0
    for word in ("check", "codes", "facts"):
        assert word in proc.stdout
    check_help = run_cli("check", "--help").stdout
    assert "--num-workers" in check_help and "--batch-bytes" in check_help and "Examples" in check_help


def test_version() -> None:
    proc = run_cli("--version")
    assert proc.returncode == 0 and "torchdoctor" in proc.stdout


def test_check_json_shape_on_live_host() -> None:
    doc = run_json("check", "--no-torch")
    assert doc["schema_version"] == 1 and doc["command"] == "check"
    assert set(doc["summary"]) == {"error", "warning", "info"}
    for f in doc["findings"]:
        assert FINDING_KEYS <= set(f)
        assert f["severity"] in ("info", "warning", "error")
        assert f["code"].startswith("TD")


def test_fail_on_controls_exit_code() -> None:
    # 8 GiB batches x 4 workers x prefetch 2 cannot fit any /dev/shm of this machine's 24 GiB RAM
    big = ("check", "--no-torch", "--batch-bytes", "8GiB")
    assert run_cli(*big).returncode == 1
    assert run_cli(*big, "--fail-on", "never").returncode == 0
    small = ("check", "--no-torch", "--batch-bytes", "1KiB", "--num-workers", "1")
    doc = run_json(*small)
    worst = {f["severity"] for f in doc["findings"]}
    expected = 1 if "error" in worst else 0
    assert run_cli(*small).returncode == expected


def test_bad_size_is_a_usage_error() -> None:
    proc = run_cli("check", "--batch-bytes", "lots")
    assert proc.returncode == 2
    assert "not a size" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "does not exist"),
        ("{not json", "not valid JSON"),
        ('{"hello": 1}', "not a torchdoctor facts snapshot"),
        ('{"meta": {"schema_version": 99}}', "schema_version 99"),
    ],
)
def test_bad_facts_file_is_one_clear_line(tmp_path, content, expected) -> None:
    path = tmp_path / "facts.json"
    if content is not None:
        path.write_text(content)
    proc = run_cli("check", "--facts", str(path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_facts_directory_is_a_clear_error(tmp_path) -> None:
    proc = run_cli("check", "--facts", str(tmp_path))
    assert proc.returncode == 2 and "is a directory" in proc.stderr


def test_unknown_code_did_you_mean() -> None:
    proc = run_cli("codes", "TD10")
    assert proc.returncode == 2
    assert "unknown code 'TD10'" in proc.stderr and "did you mean TD10" in proc.stderr
    proc = run_cli("codes", "shm-to-small")
    assert proc.returncode == 2 and "shm-too-small" in proc.stderr


def test_codes_one_and_filtered() -> None:
    one = run_cli("codes", "TD102")
    assert one.returncode == 0
    for heading in ("What it means", "Why it happens", "How to fix", "Known false positives"):
        assert heading in one.stdout
    fam = json.loads(run_cli("codes", "--family", "shm-exhausted", "--format", "json").stdout)
    assert fam["codes"] and {c["family"] for c in fam["codes"]} == {"shm-exhausted"}
    bad = run_cli("codes", "--family", "shm-exhaust")
    assert bad.returncode == 2 and "did you mean shm-exhausted" in bad.stderr


def test_markdown_report() -> None:
    proc = run_cli("check", "--no-torch", "--batch-bytes", "8GiB", "--format", "markdown")
    assert proc.stdout.startswith("## torchdoctor check")
    assert "### " in proc.stdout and "TD102" in proc.stdout and "**Fix:**" in proc.stdout


def test_text_report_has_no_colour_codes_when_piped() -> None:
    proc = run_cli("check", "--no-torch", "--batch-bytes", "8GiB")
    assert "\x1b[" not in proc.stdout
    assert "TD102" in proc.stdout and "fix:" in proc.stdout


def test_facts_redacts_secrets_and_url_credentials() -> None:
    env = {
        "HF_TOKEN": "hf_abcdefgh",
        "WANDB_API_KEY": "k-123",
        "DB_PASSWORD": "pw",
        "MY_AUTH_HEADER": "Bearer x",
        "PIP_INDEX_URL": "https://alice:s3cret@pypi.example/simple",
        "HARMLESS": "visible",
    }
    proc = run_cli("facts", "--no-torch", env=env)
    assert proc.returncode == 0
    data = json.loads(proc.stdout)
    envd = data["host"]["env"]
    for name in ("HF_TOKEN", "WANDB_API_KEY", "DB_PASSWORD", "MY_AUTH_HEADER"):
        assert envd[name] == "<redacted>"
    assert "s3cret" not in proc.stdout and "hf_abcdefgh" not in proc.stdout and "k-123" not in proc.stdout
    assert envd["PIP_INDEX_URL"] == "https://<redacted>@pypi.example/simple"
    assert envd["HARMLESS"] == "visible"


def test_facts_roundtrip_through_check(tmp_path) -> None:
    proc = run_cli("facts", "--no-torch")
    path = tmp_path / "host.json"
    path.write_text(proc.stdout)
    doc = run_json("check", "--facts", str(path), "--batch-bytes", "8GiB")
    assert doc["source"].startswith("recorded facts")
    assert any(f["code"] == "TD102" for f in doc["findings"])


def test_path_with_facts_file_is_rejected(tmp_path) -> None:
    proc = run_cli("check", "--facts", str(tmp_path / "x.json"), "--path", "/tmp")
    assert proc.returncode == 2 and "--path needs the live host" in proc.stderr


def test_core_commands_work_without_torch() -> None:
    """`import torchdoctor`, check, codes and facts with torch made unimportable."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import torchdoctor\n"
        "from torchdoctor.cli import main\n"
        "sys.argv = ['torchdoctor', 'check', '--format', 'json', '--fail-on', 'never']\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["command"] == "check"


def test_check_does_not_import_torch() -> None:
    code = (
        "import sys, io, contextlib\n"
        "import torchdoctor\n"
        "findings = torchdoctor.check()\n"
        "print('torch' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv to become an unprivileged user"
)
def test_check_survives_a_process_limit_that_refuses_threads() -> None:
    """RLIMIT_NPROC as an unprivileged user: no thread can start, the check still reports (inline gathering)."""
    import resource

    nobody = 65534
    tasks = sum(1 for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == nobody)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NPROC, (tasks + 1, tasks + 1))

    argv = [
        "setpriv",
        f"--reuid={nobody}",
        f"--regid={nobody}",
        "--clear-groups",
        sys.executable,
        "-m",
        "torchdoctor",
        "check",
        "--no-torch",
        "--format",
        "json",
        "--fail-on",
        "never",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, preexec_fn=limit, cwd="/")
    if "Permission denied" in proc.stderr and proc.returncode == 126:
        pytest.skip(f"uid {nobody} cannot run {sys.executable} here")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["command"] == "check"
