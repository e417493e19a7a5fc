"""`torchdoctor explain` as a user runs it: a real subprocess, exit codes 0 / 1 / 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .conftest import run_cli
from .test_explain_support import CONSOLE, TD150_LOG, TORCHRUN_LOGS


def _json(proc: subprocess.CompletedProcess[str]) -> dict:
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def _real_keyerror() -> str:
    """A real Python traceback that is no torch/OS failure (produced live, never typed)."""
    proc = subprocess.run([sys.executable, "-c", "d = {}\nd['learning_rate']"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "KeyError" in proc.stderr
    return proc.stderr


def test_named_root_cause_exits_0_with_json() -> None:
    proc = run_cli("explain", str(TD150_LOG), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = _json(proc)
    assert doc["schema_version"] == 1 and doc["command"] == "explain"
    assert doc["diagnoses"][0]["code"] == "TD150" and doc["diagnoses"][0]["role"] == "root-cause"
    assert doc["diagnoses"][0]["evidence"][0]["line"] > 0
    assert doc["first_failure"]["code"] == "TD150"


def test_text_report_names_cause_evidence_fix_and_code() -> None:
    proc = run_cli("explain", str(TD150_LOG))
    assert proc.returncode == 0
    out = proc.stdout
    assert "Root cause: TD150 fd-ancdata-exhausted" in out
    assert f"{TD150_LOG}:" in out and "received 0 items of ancdata" in out
    assert "fix:" in out and "torchdoctor codes TD150" in out


def test_only_unmatched_errors_exit_1_and_are_shown() -> None:
    text = _real_keyerror()
    proc = run_cli("explain", "-", input=text)
    assert proc.returncode == 1, proc.stdout
    assert "No known failure signature matched" in proc.stdout
    assert "KeyError: 'learning_rate'" in proc.stdout
    doc = _json(run_cli("explain", "-", "--format", "json", input=text))
    assert doc["diagnoses"] == [] and doc["unmatched_errors"][0]["text"] == "KeyError: 'learning_rate'"
    assert doc["unmatched_errors"][0]["traceback"][0] == "Traceback (most recent call last):"


def test_markdown_format() -> None:
    proc = run_cli("explain", str(TD150_LOG), "--format", "markdown")
    assert proc.returncode == 0
    assert proc.stdout.startswith("## torchdoctor explain")
    assert "### Root cause: TD150 `fd-ancdata-exhausted`" in proc.stdout and "```" in proc.stdout


def test_stdin_without_arguments_and_with_dash() -> None:
    data = TD150_LOG.read_text()
    for args in (("explain",), ("explain", "-")):
        proc = run_cli(*args, "--format", "json", input=data)
        assert proc.returncode == 0 and _json(proc)["sources"] == ["<stdin>"]


def test_missing_file_is_one_clear_line_and_exit_2(tmp_path: Path) -> None:
    proc = run_cli("explain", str(tmp_path / "missing.log"))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no such file or directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_option_exits_2() -> None:
    proc = run_cli("explain", str(TD150_LOG), "--format", "yaml")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_directory_and_several_inputs(tmp_path: Path) -> None:
    proc = run_cli("explain", str(TORCHRUN_LOGS), str(CONSOLE), "--format", "json")
    assert proc.returncode in (0, 1), proc.stderr
    doc = _json(proc)
    assert len(doc["sources"]) == 12
    assert {"1", "2", "3"} <= set(doc["ranks"]) or doc["unmatched_errors"]


def test_help_names_the_inputs() -> None:
    proc = run_cli("explain", "--help")
    assert proc.returncode == 0 and "error.json" in proc.stdout and "--format" in proc.stdout
