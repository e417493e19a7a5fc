"""Closed loop for uncoordinated appends to one file (lab/scenarios/writes.py).

The failing run really interleaves the writers (records glued onto one line, empty lines) and the
reader's own JSONDecodeError is what explain reads (TD657); with a file lock around each record the
same writers produce a file where every line parses. No preflight exists for this on a local file
system (TD610 warns about network file systems only).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from torchdoctor.lab.scenarios import writes

from .test_lab import (
    LabRuns, assert_explained, assert_failure, assert_fixed, assert_recorded, scenario_names, signature_values,
)

NAMES = scenario_names("writes")
SUMMARY = re.compile(r"(?P<written>\d+) records written by (?P<writers>\d+) processes; (?P<ok>\d+) lines parse, "
                     r"(?P<torn>\d+) do not, (?P<empty>\d+) empty, (?P<lost>\d+) records lost")


@pytest.fixture(scope="module")
def runs() -> Iterator[LabRuns]:
    lab = LabRuns(NAMES)
    yield lab
    lab.close()


def _summary(text: str) -> dict[str, int]:
    m = SUMMARY.search(text)
    assert m, text[-2000:]
    return {k: int(v) for k, v in m.groupdict().items()}


def test_the_scenario_is_here() -> None:
    assert NAMES == ["writes-shared-jsonl"]


def test_failure_happens(runs: LabRuns) -> None:
    assert_failure("writes-shared-jsonl", runs.get("writes-shared-jsonl"))


def test_explain_names_the_code(runs: LabRuns) -> None:
    assert_explained("writes-shared-jsonl", runs.get("writes-shared-jsonl"))


def test_fixed_variant_passes(runs: LabRuns) -> None:
    assert_fixed("writes-shared-jsonl", runs.get("writes-shared-jsonl", fixed=True))


def test_output_is_recorded_as_a_fixture() -> None:
    assert_recorded("writes-shared-jsonl")


def test_the_writers_really_interleaved(runs: LabRuns) -> None:
    found = _summary(runs.get("writes-shared-jsonl").text())
    assert found["written"] == writes.WRITERS * writes.RECORDS and found["writers"] == writes.WRITERS
    assert found["torn"] > 0 and found["empty"] >= found["torn"]  # each glued pair leaves its newline behind
    assert found["lost"] == 0  # O_APPEND keeps every write whole: interleaved, not lost
    assert found["ok"] + found["torn"] + found["empty"] <= found["written"]


def test_the_reader_error_points_inside_a_line(runs: LabRuns) -> None:
    values = signature_values("TD657", runs.get("writes-shared-jsonl").text())[0]
    assert values["line"] == "1" and int(values["column"]) > 1  # json.loads of one line: a second record follows


def test_the_lock_leaves_every_line_whole(runs: LabRuns) -> None:
    found = _summary(runs.get("writes-shared-jsonl", fixed=True).text())
    assert found == {"written": writes.WRITERS * writes.RECORDS, "writers": writes.WRITERS,
                     "ok": writes.WRITERS * writes.RECORDS, "torn": 0, "empty": 0, "lost": 0}
