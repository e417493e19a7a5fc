"""Closed loop for the rank scenarios (lab/scenarios/ranks.py): two gloo ranks on loopback, forked.

- ranks-param-perturbed: check_in_sync raises RankDivergenceError on both ranks, naming the head's
  weight and rank 1 (TD469, explain's root cause); re-initialising before DDP passes.
- ranks-memory-extra: MemoryTracker's TD277 report names rank 0 and the steps it grew over, before
  rank 0 runs out under its RLIMIT_AS with torch's own allocator error (TD270). TD277 is a warning
  with a *confirmation* signature: explain names TD270 as the root cause and attaches TD277 to it,
  so this scenario is checked with ``shows`` for both codes rather than with the lab's generic
  "explain names the scenario's code" loop. Keeping ``.item()`` passes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from torchdoctor.explain import explain, shows
from torchdoctor.lab import get

from .conftest import FIXTURES
from .support.lab import LabRuns, assert_fixed, assert_recorded, scenario_names

NAMES = ["ranks-memory-extra", "ranks-param-perturbed"]


@pytest.fixture(scope="module")
def runs() -> Iterator[LabRuns]:
    lab = LabRuns(NAMES, workers=2)
    yield lab
    lab.close()


def test_the_scenarios_are_declared_here() -> None:
    assert sorted(scenario_names("ranks")) == NAMES
    assert {(get(n).code, get(n).family) for n in NAMES} == {("TD469", "rank-divergence"), ("TD277", "host-oom")}


def test_param_perturbed_fails_on_every_rank_naming_the_tensor_and_rank_1(runs: LabRuns) -> None:
    rec = runs.get("ranks-param-perturbed")
    assert rec.failed and not rec.timed_out and not rec.memory_killed, rec.tail()
    text = rec.text()
    hits = shows(text, "TD469")
    assert hits, rec.tail()
    assert {h.values["name"] for h in hits} == {"4.weight", "4.bias"}
    assert {h.values["ranks"] for h in hits} == {"1"}
    for rank in (0, 1):  # raised on every rank, never leaving one waiting in a collective
        assert f"[rank{rank}]: torchdoctor.ranks.sync.RankDivergenceError: TD469 rank-divergence: 4.weight" in text
    root = explain(text).root_cause
    assert root is not None and (root.code, root.family) == ("TD469", "rank-divergence")


def test_memory_extra_reports_rank_0_before_it_runs_out(runs: LabRuns) -> None:
    rec = runs.get("ranks-memory-extra")
    assert rec.failed and not rec.timed_out and not rec.memory_killed, rec.notes
    text = rec.text()
    imbalance = shows(text, "TD277")
    oom = shows(text, "TD270")
    assert imbalance and oom, rec.tail()
    assert {h.values["rank"] for h in imbalance} == {"0"}
    assert imbalance[0].line < oom[0].line  # the warning came first
    first = imbalance[0].values
    assert int(first["first_step"]) >= 3 and int(first["last_step"]) > int(first["first_step"])
    assert re.search(r"\[rank0\]: RuntimeError: .*DefaultCPUAllocator: can't allocate memory", text)
    report = explain(text)
    assert report.root_cause is not None and report.root_cause.code == "TD270"
    confirmation = next(d for d in report.diagnoses if d.code == "TD277")
    assert confirmation.role == "confirmation" and confirmation.explained_by == "TD270"


@pytest.mark.parametrize("name", NAMES)
def test_fixed_variant_passes(runs: LabRuns, name: str) -> None:
    rec = runs.get(name, fixed=True)
    assert_fixed(name, rec)
    assert not shows(rec.text(), get(name).code)


@pytest.mark.parametrize("name", NAMES)
def test_output_is_recorded_as_a_fixture(name: str) -> None:
    assert_recorded(name)


def test_lab_explain_counts_a_confirmation_attached_to_the_root_cause() -> None:
    # `lab run ranks-memory-extra --explain`: explain's root cause is TD270; the scenario's TD277 is attached to it
    from torchdoctor.cli_lab import explain_record

    text = (FIXTURES / "logs" / "TD277" / "lab-ranks-memory-extra.log").read_text()
    family, code, note = explain_record(text, "TD277")
    assert (family, code) == ("host-oom", "TD277") and note and "TD270" in note
    assert explain_record(text)[1] == "TD270"  # without an expectation: the root cause itself
