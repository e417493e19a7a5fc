"""`torchdoctor explain` as a user runs it: a real subprocess, exit codes 0 / 1 / 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .conftest import run_cli
from .support.explain import CONSOLE, FIXTURES, TD150_LOG, TORCHRUN_LOGS, fixture_body


def _json(proc: subprocess.CompletedProcess[str]) -> dict:
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def _real_keyerror() -> str:
    """A real Python traceback that is no torch/OS failure (produced live, never typed)."""
    proc = subprocess.run(
        [sys.executable, "-c", "d = {}\nd['learning_rate']"], capture_output=True, text=True, timeout=60, check=False
    )
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


def test_directory_and_several_inputs() -> None:
    # torchrun's --log-dir (4 ranks: stdout/stderr.log each, error.json for ranks 1-3) and its console:
    # rank 2's torch.save into a missing directory; ranks 1 and 3 lose their gloo peer; rank 0 is SIGTERMed
    proc = run_cli("explain", str(TORCHRUN_LOGS), str(CONSOLE), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = _json(proc)
    assert len(doc["sources"]) == 12 and doc["sources"][-1] == str(CONSOLE)
    assert sum(s.endswith("error.json") for s in doc["sources"]) == 3
    assert doc["root_cause"] == "TD650"
    assert (doc["first_failure"]["code"], doc["first_failure"]["rank"]) == ("TD650", 2)
    assert "Parent directory /nonexistent-dir does not exist" in doc["first_failure"]["text"]

    def named(role: str) -> list[tuple[str, list[int]]]:
        return [(d["code"], d["ranks"]) for d in doc["diagnoses"] if d["role"] == role]

    assert named("root-cause") == [("TD650", [2])]
    assert named("cascade") == [("TD454", [1, 3])]
    ranks = doc["ranks"]
    assert set(ranks) == {"0", "1", "2", "3"}
    assert ranks["2"]["codes"] == {"TD650": 4} and ranks["2"]["exitcode"] == 1 and ranks["2"]["torchrun_root_cause"]
    for r in ("1", "3"):
        assert set(ranks[r]["codes"]) == {"TD454"} and ranks[r]["first"]["role"] == "cascade", r
    assert ranks["0"]["codes"] == {} and ranks["0"]["signal"] == "SIGTERM"
    explained = ("Parent directory", "Connection closed by peer")
    assert not [u for u in doc["unmatched_errors"] if any(t in u["text"] for t in explained)]


def test_help_names_the_inputs() -> None:
    proc = run_cli("explain", "--help")
    assert proc.returncode == 0 and "error.json" in proc.stdout and "--format" in proc.stdout


def test_a_second_failure_is_shown_under_the_root_cause(tmp_path: Path) -> None:
    # rank 5's real TD150 failure, and on rank 2 a real KeyError traceback that no signature explains
    log = tmp_path / "console.log"
    body = TD150_LOG.read_text(encoding="utf-8").split("# ---\n", 1)[1]
    lines = [f"[rank5]: {line}" for line in body.split("\n")] + [
        f"[rank2]: {line}" for line in _real_keyerror().split("\n")
    ]
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = run_cli("explain", str(log))
    assert proc.returncode == 0 and "Root cause: TD150" in proc.stdout
    tail = proc.stdout.split("Not explained by TD150 (another failure?):", 1)[1]
    assert "KeyError: 'learning_rate'" in tail and "[rank 2]" in tail
    doc = _json(run_cli("explain", str(log), "--format", "json"))
    assert [(u["rank"], u["relevance"], u["text"]) for u in doc["unmatched_errors"]] == [
        (2, 4, "[rank2]: KeyError: 'learning_rate'")
    ]


def _on_a_terminal(*args: str, env: dict[str, str] | None = None) -> str:
    """Run the CLI with a real pseudo-terminal as stdout; return what it printed."""
    import os
    import pty

    master, slave = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "torchdoctor", *args],
            stdout=slave,
            stderr=subprocess.PIPE,
            timeout=120,
            check=False,
            env={**os.environ, "COLUMNS": "120", **(env or {})},
        )
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
    assert proc.returncode == 0, proc.stderr
    return b"".join(chunks).decode("utf-8", "replace")


def test_text_on_a_terminal_is_coloured_and_laid_out_alike() -> None:
    import re

    plain = run_cli("explain", str(TD150_LOG)).stdout
    tty = _on_a_terminal("explain", str(TD150_LOG))
    visible = re.sub(r"\x1b\[[0-9;]*m", "", tty).replace("\r\n", "\n")
    assert "\x1b[1;31mRoot cause: " in tty  # coloured through rich
    assert visible.split("\n")[:3] == plain.split("\n")[:3]
    assert "torchdoctor codes TD150" in visible and "\x1b" not in plain
    no_color = _on_a_terminal("explain", str(TD150_LOG), env={"NO_COLOR": "1"})
    assert "\x1b[1;31m" not in no_color and "torchdoctor codes TD150" in no_color


def test_a_traceback_pasted_without_its_exception_line() -> None:
    # the recorded TD450 lab output, cut here before its ValueError line (a paste that stops at a frame)
    body = [
        line
        for line in fixture_body(FIXTURES / "logs" / "TD450" / "lab-dist-env-missing-world-size.log")
        if line.strip()
    ]
    cut = "\n".join(body[:-1]) + "\n"
    doc = _json(run_cli("explain", "-", "--format", "json", input=cut))
    root = doc["diagnoses"][0]
    assert (root["code"], root["role"]) == ("TD450", "root-cause") and root["values"]["var"] in body[-1]
    assert root["evidence"][0]["line"] == len(body) - 1 and root["evidence"][0]["text"] == body[-2]
    proc = run_cli("explain", "-", input=cut)
    assert proc.returncode == 0 and "cut before its exception line" in proc.stdout
