"""Closed loop for the DataLoader scenarios (lab/scenarios/loader.py): pickling and dying workers.

For each: the real failure happens with the text its code recognises; explain names that code
and family; the fixed variant (the catalogue's fix for that cause) passes. Plus the values the
signatures extract from the real text, and checks that each fixed run still met the condition
it fixes (the SIGTERM really arrived, the hang really waited for the timeout).
"""

from __future__ import annotations

import pytest

from torchdoctor.explain import explain
from torchdoctor.lab.scenarios import loader
from torchdoctor.registry import lookup

from .support.lab import LabRuns, closed_loop, fixture_text, scenario_names, signature_values

NAMES = scenario_names("loader")


# the closed loop over this module's scenarios (tests/support/lab.py)
runs, test_failure_happens, test_explain_names_the_code, test_fixed_variant_passes = closed_loop(NAMES, recorded=False)


def test_the_scenarios_are_here() -> None:
    assert {
        "pickle-lambda-attribute",
        "pickle-local-function",
        "pickle-module-lambda",
        "pickle-thread-lock",
        "pickle-generator",
        "pickle-main-class",
        "main-guard-missing",
        "worker-sigsegv",
        "worker-sigkill",
        "worker-sigabrt",
        "worker-sigterm",
        "worker-exit",
        "worker-hang-timeout",
    } <= set(NAMES)


# -- worker-pickling: what could not be pickled, by name ------------------------------------------


@pytest.mark.parametrize(
    ("name", "code", "key", "value"),
    [
        ("pickle-lambda-attribute", "TD550", "object", "pickle_lambda_attribute.<locals>.<lambda>"),
        ("pickle-local-function", "TD550", "object", "pickle_local_function.<locals>.scale"),
        ("pickle-module-lambda", "TD551", "module", "torchdoctor.lab.scenarios.loader"),
        ("pickle-thread-lock", "TD552", "type", "_thread.lock"),
        ("pickle-generator", "TD552", "type", "generator"),
        ("pickle-main-class", "TD553", "name", "Squares"),
    ],
)
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


@pytest.mark.parametrize(
    ("name", "signal"),
    [
        ("worker-sigsegv", "Segmentation fault"),
        ("worker-sigabrt", "Aborted"),
        ("worker-sigterm", "Terminated"),
    ],
)
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


# -- other Python/torch versions' wordings, from public reports (tests/fixtures/logs/<CODE>/*.log) ----


def test_python_313_get_local_object_is_the_same_pickling_failure() -> None:
    values = signature_values("TD550", fixture_text("TD550", "py313-get-local-object.log"))
    assert values == [{"verb": "get", "object": "main.<locals>.worker_init_fn"}]


def test_pickling_fixes_put_the_real_fix_first_and_num_workers_0_as_the_isolation_step() -> None:
    for code in ("TD550", "TD551", "TD552", "TD553", "TD554"):
        fix = lookup(code).fix
        assert "num_workers=0" in fix, code
        real = fix.index("module level") if "module level" in fix else fix.index("`")
        assert real < fix.index("num_workers=0"), code


@pytest.mark.parametrize("name", ["siam-nestedunet-11-without-first-line.log", "overhaul-distillation-26-title.log"])
def test_bootstrapping_message_pasted_without_its_first_line(name: str) -> None:
    text = fixture_text("TD554", name)
    assert "An attempt has been made" not in text
    top = explain(text).diagnoses[0]
    assert (top.code, top.family) == ("TD554", "worker-pickling") and "__name__" in top.fix


def test_freeze_support_in_a_script_is_not_the_error() -> None:
    assert not signature_values("TD554", fixture_text("TD554", "near-freeze-support-in-code.log"))


@pytest.mark.parametrize(
    ("name", "signal"),
    [
        ("db-94-segfault-no-dot.log", "Segmentation fault"),  # no final "." after the signal name
        ("ultralytics-22222-banner-no-space.log", "segmentation fault"),  # "ERROR:Unexpected ..."
        ("swin-det-16-segfault-banner.log", "segmentation fault"),
    ],
)
def test_segfault_wordings(name: str, signal: str) -> None:
    assert [v["signal"] for v in signature_values("TD560", fixture_text("TD560", name))] == [signal]


@pytest.mark.parametrize(
    ("name", "workers", "suggested"),
    [
        ("yolo-world-413-8-workers-4-cpus.log", "8", "4"),
        ("hypertorch-121-9-workers-8-cpus.log", "9", "8"),
        ("particleseg3d-pr2-wrapped-windows.log", "12", None),  # one sentence per line: the count is on the next
    ],
)
def test_too_many_workers_warning_names_the_counts(name: str, workers: str, suggested: str | None) -> None:
    values = signature_values("TD570", fixture_text("TD570", name))[0]
    assert values["workers"] == workers
    assert suggested is None or values["suggested"] == suggested
    top = explain(fixture_text("TD570", name)).diagnoses[0]
    assert (top.code, top.family, top.role) == ("TD570", "thread-oversubscription", "root-cause")
    assert top.confidence < 0.5 and "num_workers" in top.fix


def test_too_many_workers_warning_never_outranks_a_real_error() -> None:
    """A warning printed at start-up leads only when nothing failed: a worker crash after it wins."""
    text = (
        fixture_text("TD570", "yolo-world-413-8-workers-4-cpus.log")
        + "\n"
        + fixture_text("TD560", "db-94-segfault-no-dot.log")
    )
    report = explain(text)
    assert report.root_cause is not None and report.root_cause.code == "TD560"
    assert "TD570" in report.codes()


def test_lightning_too_few_workers_advice_is_not_oversubscription() -> None:
    report = explain(fixture_text("TD570", "near-lightning-too-few-workers.log"))
    assert not report.codes()  # nothing recognised; at most a low-confidence guess from its words
    assert all(d.role == "guess" and d.confidence < 0.5 for d in report.diagnoses)
    assert "thread-oversubscription" not in {d.family for d in report.diagnoses}
