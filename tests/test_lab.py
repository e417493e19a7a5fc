"""The lab's command line (list, run, record) and the helpers the closed-loop tests share.

The closed loops themselves (failure → explain → fix → preflight) are in test_lab_ipc.py and
test_lab_loader.py; they import :class:`LabRuns` and the matchers from here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from torchdoctor.lab import all_scenarios, get
from torchdoctor.lab.runner import RunRecord, run
from torchdoctor.explain import shows
from torchdoctor.registry import all_codes, lookup

from .conftest import FIXTURES, run_cli

LOGS = FIXTURES / "logs"
RUN_KEYS = {"scenario", "expected_family", "expected_code", "reproduced", "exit_code", "seconds",
            "explained_family", "explained_code", "fixed_passed", "output_tail"}
MY_MODULES = ("fds", "ipc", "loader")


# -- helpers for the closed-loop tests ----------------------------------------------------------------

def scenario_names(*modules: str, slow: bool = False) -> list[str]:
    """Scenarios declared in ``torchdoctor.lab.scenarios.<module>``; slow ones only when asked."""
    return [s.name for s in all_scenarios()
            if s.body.__module__.rsplit(".", 1)[-1] in modules and s.slow == slow]


class LabRuns:
    """Starts every failing run, then every fixed run, a few at a time; each test waits for its own."""

    def __init__(self, names: Iterable[str], workers: int = 3) -> None:
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="lab")
        names = list(names)
        self.futures: dict[tuple[str, bool], Future[RunRecord]] = {}
        for fixed in (False, True):
            for name in names:
                self.futures[(name, fixed)] = self.pool.submit(run, get(name), fixed)

    def get(self, name: str, fixed: bool = False) -> RunRecord:
        rec = self.futures[(name, fixed)].result()
        if rec.skipped:
            pytest.skip(f"{name}: {rec.skipped}")
        return rec

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def signature_values(code: str, text: str) -> list[dict[str, str]]:
    """Values of every match of ``code`` in ``text``, as the engine decides (:func:`torchdoctor.explain.shows`)."""
    return [m.values for m in shows(text, code)]


def slow_requested(config: pytest.Config) -> bool:
    """Slow scenarios run with ``-m slow`` (CI's full run) or TORCHDOCTOR_LAB_SLOW=1, never by default."""
    expr = config.getoption("markexpr") or ""
    return ("slow" in expr and "not slow" not in expr) or bool(os.environ.get("TORCHDOCTOR_LAB_SLOW"))


def assert_failure(name: str, rec: RunRecord) -> None:
    """The failure really happened, with the text the scenario's code recognises."""
    s = get(name)
    assert rec.exit_code not in (0, None), f"{name} did not fail:\n{rec.tail()}"
    assert not rec.timed_out and not rec.memory_killed, f"{name} was killed by the runner: {rec.notes}\n{rec.tail()}"
    assert signature_values(s.code, rec.text()), f"no line of {name}'s output matches {s.code}:\n{rec.tail()}"


def assert_explained(name: str, rec: RunRecord) -> None:
    from torchdoctor.explain import explain
    s = get(name)
    root = explain(rec.text()).root_cause
    assert root is not None, f"explain named no root cause for {name}:\n{rec.tail()}"
    assert (root.code, root.family) == (s.code, s.family), f"{name}: explain said {root.code} ({root.family})"


def assert_fixed(name: str, rec: RunRecord) -> None:
    assert rec.exit_code == 0 and not rec.timed_out, f"{name} --fixed failed ({get(name).fix}):\n{rec.tail()}"


def assert_recorded(name: str) -> None:
    """`torchdoctor lab record` has stored this scenario's real output as an explain fixture."""
    s = get(name)
    path = LOGS / s.code / f"lab-{name}.log"
    assert path.is_file(), f"no recorded fixture {path}: run `torchdoctor lab record tests/fixtures/logs {name}`"
    head = path.read_text(encoding="utf-8").split("# ---\n", 1)[0]
    assert f"`torchdoctor lab run {name}`" in head


def closed_loop(names: list[str], recorded: bool = True) -> tuple[Any, ...]:
    """The closed loop each lab test module runs over its scenarios, declared once.

    Returns the module-scoped ``runs`` fixture (every scenario started in the background) and the
    tests: the failure really happens, explain names the expected code, the fixed variant passes,
    and (``recorded``) the output is a fixture explain is tested on. A module unpacks them into its
    own namespace, where pytest collects them.
    """

    @pytest.fixture(scope="module", name="runs")
    def runs_fixture() -> Iterable[LabRuns]:
        lab = LabRuns(names)
        yield lab
        lab.close()

    @pytest.mark.parametrize("name", names)
    def test_failure_happens(runs: LabRuns, name: str) -> None:
        assert_failure(name, runs.get(name))

    @pytest.mark.parametrize("name", names)
    def test_explain_names_the_code(runs: LabRuns, name: str) -> None:
        assert_explained(name, runs.get(name))

    @pytest.mark.parametrize("name", names)
    def test_fixed_variant_passes(runs: LabRuns, name: str) -> None:
        assert_fixed(name, runs.get(name, fixed=True))

    @pytest.mark.parametrize("name", names)
    def test_output_is_recorded_as_a_fixture(name: str) -> None:
        assert_recorded(name)

    tests = (runs_fixture, test_failure_happens, test_explain_names_the_code, test_fixed_variant_passes)
    return tests + ((test_output_is_recorded_as_a_fixture,) if recorded else ())



def check_json(*args: str, preexec_fn: Any = None, prefix: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """`torchdoctor check --format json` (optionally in a prepared child); findings by code."""
    argv = [*(prefix or []), sys.executable, "-m", "torchdoctor", "check", "--format", "json", "--fail-on", "never",
            "--no-torch", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, preexec_fn=preexec_fn)
    assert proc.returncode == 0, proc.stderr
    return {f["code"]: f for f in json.loads(proc.stdout)["findings"]}


def evidence_budget(finding: dict[str, Any], label: str) -> int:
    """The N of an evidence value like '65530 − 220 = 65310 ≈ …'."""
    value = next(e["value"] for e in finding["evidence"] if e["label"] == label)
    m = re.search(r"= (\d+)", str(value))
    assert m, value
    return int(m.group(1))


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
    proc = run_cli("lab", "record", str(tmp_path), "worker-exit", "--as", "td564", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    path = tmp_path / "TD564" / "lab-worker-exit.log"
    assert "# expect-top: TD563" in _header(path)
    assert signature_values("TD564", path.read_text())


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
    monkeypatch.setattr(runner, "run", lambda s, fixed=False, timeout=None: RunRecord(
        scenario=s.name, fixed=fixed, argv=[], exit_code=1, seconds=0.1, output=other))
    out = run_outcome("map-count-fast-spawn", fixed=False, explain=False, timeout=None)
    assert out.exit_code == 1 and out.reproduced is False and not out.ok
    assert any("not with the text TD155 recognises" in n for n in out.notes)
