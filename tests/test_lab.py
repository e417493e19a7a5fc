"""The lab's command line (list, run, record).

The closed loops themselves (failure → explain → fix → preflight) are in test_lab_*.py; they and this
module share :class:`LabRuns`, :func:`closed_loop` and the matchers from tests/support/lab.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from torchdoctor.lab import all_scenarios
from torchdoctor.lab.runner import RunRecord
from torchdoctor.registry import all_codes

from .conftest import run_cli
from .support.lab import (
    assert_recorded,
    scenario_names,
    signature_values,
)

RUN_KEYS = {
    "scenario",
    "expected_family",
    "expected_code",
    "reproduced",
    "exit_code",
    "seconds",
    "explained_family",
    "explained_code",
    "fixed_passed",
    "output_tail",
}
MY_MODULES = ("fds", "ipc", "loader")


# -- lab list -------------------------------------------------------------------------------------------


def test_list_json_has_every_scenario_with_its_fields() -> None:
    proc = run_cli("lab", "list", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert {"name", "family", "code", "needs", "seconds", "summary", "skipped_reason"} <= set(rows[0])
    names = [r["name"] for r in rows]
    assert len(names) == len(set(names))
    mine = set(scenario_names(*MY_MODULES) + scenario_names(*MY_MODULES, slow=True))
    assert mine <= set(names)
    assert all(r["needs"][0] == "torch" and r["seconds"] > 0 for r in rows if r["name"] in mine)


def test_list_text_names_each_scenario_and_code() -> None:
    proc = run_cli("lab", "list")
    assert proc.returncode == 0, proc.stderr
    for s in all_scenarios():
        assert re.search(rf"^{re.escape(s.name)}\s+{s.code}\s+{s.family}", proc.stdout, re.M), s.name


def test_every_scenario_expects_a_registered_code_of_its_family() -> None:
    codes = {c.code: c for c in all_codes()}
    for s in all_scenarios():
        assert s.code in codes, f"{s.name}: {s.code} is not registered"
        assert codes[s.code].family == s.family, f"{s.name}: {s.code} is {codes[s.code].family}, not {s.family}"
        assert codes[s.code].signatures, f"{s.name}: {s.code} has no log signatures for explain to find"


@pytest.mark.parametrize("name", scenario_names(*MY_MODULES) + scenario_names(*MY_MODULES, slow=True))
def test_scenario_output_is_recorded_as_a_fixture(name: str) -> None:
    assert_recorded(name)


# -- lab run ------------------------------------------------------------------------------------------


def test_run_unknown_scenario_is_one_line_usage_error() -> None:
    proc = run_cli("lab", "run", "worker-sigseg")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "unknown scenario 'worker-sigseg'" in proc.stderr and "worker-sigsegv" in proc.stderr


def test_run_json_closed_loop() -> None:
    proc = run_cli("lab", "run", "fd-loader-kept-batches", "--fixed", "--explain", "--format", "json", timeout=180)
    out = json.loads(proc.stdout)
    assert RUN_KEYS <= set(out)
    assert out["scenario"] == "fd-loader-kept-batches"
    assert (out["expected_family"], out["expected_code"]) == ("fd-exhausted", "TD152")
    assert out["reproduced"] is True and out["exit_code"] == 1 and out["seconds"] > 0
    assert "Communication with the workers is no longer possible" in out["output_tail"]
    assert out["fixed_passed"] is True
    assert (out["explained_family"], out["explained_code"]) == ("fd-exhausted", "TD152")
    assert proc.returncode == 0, proc.stderr


def test_run_text_without_fix_reports_reproduction() -> None:
    proc = run_cli("lab", "run", "pickle-generator", timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "pickle-generator: worker-pickling, expects TD552" in proc.stdout
    assert re.search(r"failure reproduced in [\d.]+ s \(exit code 1\)", proc.stdout)
    assert "cannot pickle 'generator' object" in proc.stdout
    assert "with the fix" not in proc.stdout


def test_run_json_without_fix_has_null_fixed_passed() -> None:
    proc = run_cli("lab", "run", "pickle-module-lambda", "--format", "json", timeout=180)
    out = json.loads(proc.stdout)
    assert out["fixed_passed"] is None and out["explained_code"] is None and out["reproduced"] is True


# -- lab record ---------------------------------------------------------------------------------------


def _header(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("# ---\n", 1)[0].splitlines()


def test_record_writes_header_and_never_overwrites_without_force(tmp_path: Path) -> None:
    proc = run_cli("lab", "record", str(tmp_path), "pickle-module-lambda", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    path = tmp_path / "TD551" / "lab-pickle-module-lambda.log"
    head = _header(path)
    assert head[0] == "# source: recorded on this machine by `torchdoctor lab run pickle-module-lambda` (exit code 1)"
    assert re.fullmatch(r"# torch \S+, Python 3\.\d+\.\d+, \w+ \S+, \d{4}-\d\d-\d\d", head[1]), head[1]
    assert "attribute lookup <lambda> on torchdoctor.lab.scenarios.loader failed" in path.read_text()

    path.write_text("# source: hand-kept\n# ---\nkept\n")
    proc = run_cli("lab", "record", str(tmp_path), "pickle-module-lambda", timeout=180)
    assert proc.returncode == 0 and "exists; kept" in proc.stdout
    assert path.read_text().endswith("kept\n")

    proc = run_cli("lab", "record", str(tmp_path), "pickle-module-lambda", "--force", timeout=180)
    assert proc.returncode == 0 and "attribute lookup" in path.read_text()


def test_record_as_files_under_another_code_with_expect_top(tmp_path: Path) -> None:
    # Which of torch's two texts a dead worker gets depends on timing: the SIGCHLD handler's "DataLoader
    # worker (pid(s) N) exited unexpectedly" (TD564) or, when the queue timeout sees it first, only "...
    # exited unexpectedly with exit code 1" (TD563). In full CI runs the second came alone about once in 3
    # runs; up to 3 recordings (--force) are made until one holds TD564's line.
    path = tmp_path / "TD564" / "lab-worker-exit.log"
    for _ in range(3):
        proc = run_cli("lab", "record", str(tmp_path), "worker-exit", "--as", "td564", "--force", timeout=180)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "# expect-top: TD563" in _header(path)
        if signature_values("TD564", path.read_text()):
            return
    raise AssertionError(f"3 recordings of worker-exit, none with TD564's line:\n{path.read_text()}")


def test_record_rejects_an_unknown_code() -> None:
    proc = run_cli("lab", "record", "/nonexistent-dir", "worker-exit", "--as", "TD999")
    assert proc.returncode == 2 and "unknown code" in proc.stderr


def test_a_scenario_that_cannot_run_here_is_skipped_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchdoctor.lab.runner as runner
    from torchdoctor.cli_lab import run_outcome

    monkeypatch.setattr(runner, "missing_needs", lambda s: "needs root (private mounts, dropped privileges)")
    out = run_outcome("shm-no-space", fixed=True, explain=True, timeout=None)
    assert out.skipped_reason == "needs root (private mounts, dropped privileges)"
    assert out.reproduced is False and out.exit_code is None and out.fixed_passed is None
    assert out.ok, "a skip is not a failure of the scenario"
    assert out.to_dict()["skipped_reason"] == out.skipped_reason


def test_a_failure_without_the_expected_text_is_not_a_reproduction(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchdoctor.lab.runner as runner
    from torchdoctor.cli_lab import run_outcome

    # a child that failed for another reason: the line this scenario's own body prints (ipc.py) on a
    # host whose vm.max_map_count is too high to use up; no torch text in it
    other = b"torchdoctor lab: vm.max_map_count is 2147483642 here; too many slots to use up in a lab child\n"
    monkeypatch.setattr(
        runner,
        "run",
        lambda s, fixed=False, timeout=None, watch=None: RunRecord(
            scenario=s.name, fixed=fixed, argv=[], exit_code=1, seconds=0.1, output=other
        ),
    )
    out = run_outcome("map-count-fast-spawn", fixed=False, explain=False, timeout=None)
    assert out.exit_code == 1 and out.reproduced is False and not out.ok
    assert any("not with the text TD155 recognises" in n for n in out.notes)
