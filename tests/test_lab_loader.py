"""Closed loop for the DataLoader scenarios (lab/scenarios/loader.py): pickling and dying workers.

For each: the real failure happens with the text its code recognises; explain names that code
and family; the fixed variant (the catalogue's fix for that cause) passes. Plus the values the
signatures extract from the real text, and checks that each fixed run still met the condition
it fixes (the SIGTERM really arrived, the hang really waited for the timeout).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from torchdoctor.lab.scenarios import loader

from .test_lab import LabRuns, assert_explained, assert_failure, assert_fixed, scenario_names, signature_values

NAMES = scenario_names("loader")


@pytest.fixture(scope="module")
def runs() -> Iterator[LabRuns]:
    lab = LabRuns(NAMES)
    yield lab
    lab.close()


def test_the_scenarios_are_here() -> None:
    assert {"pickle-lambda-attribute", "pickle-local-function", "pickle-module-lambda", "pickle-thread-lock",
            "pickle-generator", "pickle-main-class", "main-guard-missing", "worker-sigsegv", "worker-sigkill",
            "worker-sigabrt", "worker-sigterm", "worker-exit", "worker-hang-timeout"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_failure_happens(runs: LabRuns, name: str) -> None:
    assert_failure(name, runs.get(name))


@pytest.mark.parametrize("name", NAMES)
def test_explain_names_the_code(runs: LabRuns, name: str) -> None:
    assert_explained(name, runs.get(name))


@pytest.mark.parametrize("name", NAMES)
def test_fixed_variant_passes(runs: LabRuns, name: str) -> None:
    assert_fixed(name, runs.get(name, fixed=True))


# -- worker-pickling: what could not be pickled, by name ------------------------------------------

@pytest.mark.parametrize(("name", "code", "key", "value"), [
    ("pickle-lambda-attribute", "TD550", "object", "pickle_lambda_attribute.<locals>.<lambda>"),
    ("pickle-local-function", "TD550", "object", "pickle_local_function.<locals>.scale"),
    ("pickle-module-lambda", "TD551", "module", "torchdoctor.lab.scenarios.loader"),
    ("pickle-thread-lock", "TD552", "type", "_thread.lock"),
    ("pickle-generator", "TD552", "type", "generator"),
    ("pickle-main-class", "TD553", "name", "Squares"),
])
def test_pickling_error_names_the_object(runs: LabRuns, name: str, code: str, key: str, value: str) -> None:
    assert signature_values(code, runs.get(name).text())[0][key] == value


def test_unpicklable_object_fails_in_the_parent_before_any_worker_starts(runs: LabRuns) -> None:
    for name in ("pickle-lambda-attribute", "pickle-thread-lock", "pickle-generator"):
        text = runs.get(name).text()
        assert "reduction.dump" in text and not signature_values("TD564", text), name


def test_worker_exits_end_in_the_exited_unexpectedly_cascade(runs: LabRuns) -> None:
    # (a death by signal is raised from the SIGCHLD handler wherever the main process is, so its
    # cascade line is usual but not certain; an exit status is found by the loader's own status check)
    for name in ("pickle-main-class", "main-guard-missing", "worker-exit"):
        assert signature_values("TD564", runs.get(name).text()), name


# -- worker-crash: the signal, the status, the timeout ----------------------------------------------

@pytest.mark.parametrize(("name", "signal"), [
    ("worker-sigsegv", "Segmentation fault"),
    ("worker-sigabrt", "Aborted"),
    ("worker-sigterm", "Terminated"),
])
def test_signal_is_named(runs: LabRuns, name: str, signal: str) -> None:
    signals = {v["signal"] for v in signature_values("TD560", runs.get(name).text())}
    assert signal in signals, signals


def test_segfault_banner_from_the_worker_is_in_the_output(runs: LabRuns) -> None:
    assert "segmentation fault" in {v["signal"] for v in signature_values("TD560", runs.get("worker-sigsegv").text())}


def test_sigkill_is_read_as_memory_not_as_a_crash(runs: LabRuns) -> None:
    text = runs.get("worker-sigkill").text()
    assert signature_values("TD562", text)[0]["pid"].isdigit()
    assert not signature_values("TD560", text)


def test_exit_status_is_extracted(runs: LabRuns) -> None:
    assert signature_values("TD563", runs.get("worker-exit").text())[0]["exit_code"] == "1"


def test_hang_waited_for_the_loader_timeout(runs: LabRuns) -> None:
    rec = runs.get("worker-hang-timeout")
    assert float(signature_values("TD565", rec.text())[0]["seconds"]) == loader.LOADER_TIMEOUT
    assert rec.seconds >= loader.LOADER_TIMEOUT


def test_fixed_sigterm_run_was_still_preempted(runs: LabRuns) -> None:
    """The fix is not 'no signal': the SIGTERM arrives and the main process finishes the epoch."""
    assert "preempted=True" in runs.get("worker-sigterm", fixed=True).text()
