"""`torchdoctor explain` refuses binary input with one clear line (issue 7), and still reads every log.

Real inputs: the Python interpreter (an ELF executable), gzip of it, the recorded fixtures; text in other
encodings and a log that starts with a NUL hole (what logrotate's copytruncate leaves) are still logs.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchdoctor.explain.sources import SNIFF, sniff_binary
from torchdoctor.explain.sources import _regular_binary as regular_binary

from .conftest import FIXTURES, run_cli

TD150_LOG = next((FIXTURES / "logs" / "TD150").glob("*.log"))
EXECUTABLE = Path(sys.executable).resolve()


def assert_refused(proc, name: str) -> str:
    """The CLI refused ``name`` with exit code 2 and one clear line on stderr; that line."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[:500], proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert name in lines[0] and "not a log" in lines[0] and "give the text the run printed" in lines[0]
    return lines[0]


def test_an_executable_is_refused() -> None:
    line = assert_refused(run_cli("explain", str(EXECUTABLE)), str(EXECUTABLE))
    assert "an ELF executable or library" in line


@pytest.mark.skipif(not Path("/usr/bin/ls").exists(), reason="no /usr/bin/ls")
def test_the_reported_case_usr_bin_ls() -> None:
    assert_refused(run_cli("explain", "/usr/bin/ls"), "/usr/bin/ls")


def test_gzip_of_an_executable_is_refused(tmp_path: Path) -> None:
    packed = tmp_path / "python.gz"
    packed.write_bytes(gzip.compress(EXECUTABLE.read_bytes()[: 1 << 20]))
    assert_refused(run_cli("explain", str(packed)), str(packed))


def test_binary_on_stdin_is_refused() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "torchdoctor", "explain", "-"],
        input=EXECUTABLE.read_bytes()[: 1 << 20],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2 and b"Traceback" not in proc.stderr
    assert proc.stderr.decode().strip().startswith("torchdoctor: error: standard input is an ELF executable")


def test_a_binary_in_a_log_directory_is_skipped(tmp_path: Path) -> None:
    shutil.copy(EXECUTABLE, tmp_path / "a.out")  # named like Slurm output, but a program
    shutil.copy(TD150_LOG, tmp_path / "rank0.log")
    proc = run_cli("explain", str(tmp_path), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["diagnoses"][0]["code"] == "TD150"
    (tmp_path / "rank0.log").unlink()
    proc = run_cli("explain", str(tmp_path))
    assert proc.returncode == 2 and "1 binary file(s) skipped" in proc.stderr


def test_text_that_is_not_utf8_and_a_nul_hole_are_still_logs(tmp_path: Path) -> None:
    body = TD150_LOG.read_bytes()
    hole = tmp_path / "truncated.log"  # logrotate copytruncate: the writer's offset kept, a hole before it
    hole.write_bytes(b"\0" * (64 * 1024) + body)
    latin = tmp_path / "latin1.log"
    latin.write_bytes("Lauf gestartet: Größe der Stapel = 32\n".encode("latin-1") + body)
    sjis = tmp_path / "sjis.log"
    sjis.write_bytes("学習を開始します\n".encode("shift_jis") * 200 + body)
    for path in (hole, latin, sjis):
        assert regular_binary(path) is None, path
        proc = run_cli("explain", str(path), "--format", "json")
        assert proc.returncode == 0 and json.loads(proc.stdout)["diagnoses"][0]["code"] == "TD150", path


def test_utf16_is_refused_with_how_to_convert(tmp_path: Path) -> None:
    wide = tmp_path / "powershell.log"
    wide.write_bytes(TD150_LOG.read_text(encoding="utf-8").encode("utf-16"))
    line = assert_refused(run_cli("explain", str(wide)), str(wide))
    assert "UTF-16" in line and "iconv" in line


def test_no_recorded_fixture_is_judged_binary() -> None:
    files = [p for p in FIXTURES.rglob("*") if p.is_file()]
    assert len(files) > 100
    assert [p for p in files if regular_binary(p) is not None] == []


def test_sniff_looks_at_the_first_block_only() -> None:
    text = b"[rank0]: step 1 loss 1.0\n" * (SNIFF // 25 + 1)
    assert sniff_binary(text + bytes(range(32)) * 1000) is None
    assert sniff_binary(bytes(range(256)) * 40) is not None
    assert sniff_binary(b"") is None
