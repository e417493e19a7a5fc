"""The lab's closed-loop helpers, shared by tests/test_lab.py and tests/test_lab_*.py.

Each lab test module runs its scenarios in the background (:class:`LabRuns`) and declares the closed
loop over them with :func:`closed_loop`: the failure really happens, explain names the expected code,
the fixed variant passes, and the output is recorded as an explain fixture.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from torchdoctor.explain import shows
from torchdoctor.lab import all_scenarios, get
from torchdoctor.lab.runner import RunRecord, run

from . import LOGS, fixture_text

__all__ = [
    "LOGS",
    "LabRuns",
    "assert_explained",
    "assert_failure",
    "assert_fixed",
    "assert_recorded",
    "check_json",
    "closed_loop",
    "evidence_budget",
    "fixture_text",
    "scenario_names",
    "signature_values",
    "slow_requested",
]


def scenario_names(*modules: str, slow: bool = False) -> list[str]:
    """Scenarios declared in ``torchdoctor.lab.scenarios.<module>``; slow ones only when asked."""
    return [s.name for s in all_scenarios() if s.body.__module__.rsplit(".", 1)[-1] in modules and s.slow == slow]


class LabRuns:
    """Starts every failing run, then every fixed run, a few at a time; each test waits for its own."""

    def __init__(self, names: Iterable[str], workers: int = 3) -> None:
        # what the temporary directory held before these runs: another run, killed before it could clean up
        # (or running beside this suite), is not this module's to answer for
        self.before = {d: set(os.listdir(d)) for d in (tempfile.gettempdir(), "/dev/shm") if os.path.isdir(d)}
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

    def wait_all(self) -> None:
        """Every run finished: nothing of the lab runs beside the caller (a test counting a user's tasks)."""
        for future in self.futures.values():
            future.result()

    def left_behind(self, *prefixes: str, where: str | None = None) -> list[str]:
        """Entries of ``where`` (the temporary directory) starting with one of ``prefixes`` that these runs left."""
        self.wait_all()
        where = where or tempfile.gettempdir()
        return sorted(p for p in set(os.listdir(where)) - self.before.get(where, set()) if p.startswith(prefixes))

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
    """`explain` names the scenario's code and family as the root cause of its output."""
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
    """`torchdoctor check --format json` (optionally in a prepared child) succeeds; its findings by code."""
    argv = [
        *(prefix or []),
        sys.executable,
        "-m",
        "torchdoctor",
        "check",
        "--format",
        "json",
        "--fail-on",
        "never",
        "--no-torch",
        *args,
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, preexec_fn=preexec_fn, check=False)
    assert proc.returncode == 0, proc.stderr
    return {f["code"]: f for f in json.loads(proc.stdout)["findings"]}


def evidence_budget(finding: dict[str, Any], label: str) -> int:
    """The N of an evidence value like '65530 − 220 = 65310 ≈ …'."""
    value = next(e["value"] for e in finding["evidence"] if e["label"] == label)
    m = re.search(r"= (\d+)", str(value))
    assert m, value
    return int(m.group(1))
