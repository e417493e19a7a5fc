"""Predicted, happened, explained, fixed: the first step of the closed loop, as `lab run` reports it.

Each scenario that declares a :class:`~torchdoctor.lab.predict.Prediction` runs `torchdoctor check` (or
`dist`) under its own conditions: its lowered rlimit, its private /dev/shm, its environment, its
loader settings. The preflight must name the scenario's family before the failure happens. Without
those conditions it must not: the prediction comes from the conditions, not from the scenario's name.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from torchdoctor.lab import all_scenarios, get
from torchdoctor.lab.predict import Prediction, predicted

from .conftest import run_cli

PREDICTED = [s.name for s in all_scenarios() if s.predict is not None]


def test_the_preflight_families_are_covered() -> None:
    families = {get(n).family for n in PREDICTED}
    assert {"shm-map-count", "fd-exhausted", "shm-exhausted", "host-oom", "dist-env", "dist-connect"} <= families


@pytest.mark.parametrize("name", PREDICTED)
def test_the_preflight_names_the_family_before_the_run(name: str) -> None:
    s = get(name)
    assert s.predict is not None
    if s.predict.shm_size:
        import os

        if os.geteuid() != 0:
            pytest.skip("a private /dev/shm needs root")
    got = predicted(s)
    assert got is not None, f"{name}: `torchdoctor {s.predict.by}` named nothing of {s.family}"
    assert got["family"] == s.family and got["by"] == s.predict.by
    assert got["severity"] in ("warning", "error")


@pytest.mark.parametrize("name", ["fd-spawn-dataset", "oom-rlimit-as", "map-count-fast-spawn"])
def test_without_the_scenarios_conditions_nothing_is_predicted(name: str) -> None:
    s = get(name)
    assert s.predict is not None
    plain = replace(
        s, predict=Prediction(s.predict.by, ("--sharing-strategy", "file_system", "--start-method", "fork"))
    )
    assert predicted(plain) is None


def test_a_failure_made_at_run_time_is_not_predicted() -> None:
    assert get("dist-peer-killed").predict is None
    assert predicted(get("dist-peer-killed")) is None


def test_lab_run_json_reports_predicted_and_warned() -> None:
    proc = run_cli("lab", "run", "fd-queue-ancdata", "--watch", "0.05", "--format", "json", timeout=300)
    out = json.loads(proc.stdout)
    assert out["predicted"] == {"by": "check", "code": "TD111", "family": "fd-exhausted", "severity": "warning"}
    assert out["reproduced"] and out["warned"] is not None and out["warned"]["lead_seconds"] > 0
    text = run_cli("lab", "run", "oom-rlimit-as", timeout=300).stdout
    assert "predicted by `torchdoctor check` before the run: TD205 (error)" in text
