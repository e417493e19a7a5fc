"""Closed loop for uncoordinated writers (lab/scenarios/writes.py).

writes-shared-jsonl: the failing run really interleaves the writers (records glued onto one line,
empty lines) and the reader's own JSONDecodeError is what explain reads (TD657); with a file lock
around each record the same writers produce a file where every line parses.
writes-ranks-rename-*: every rank renames a staging directory to the final checkpoint name; one
rename wins, the others fail (ENOENT or ENOTEMPTY, TD659); with one publisher every shard arrives.
writes-ranks-same-checkpoint: every rank torch.saves one path; torch.load then finds storages at
the wrong offsets (TD660); saving from rank 0 only resumes every round.
writes-ranks-rmtree-checkpoint: every rank shutil.rmtrees the same old checkpoint; the losers find
entries gone inside the walk (TD661, a name relative to its directory); rank 0 alone deletes it.
No preflight exists for these on a local file system (TD610 warns about network file systems only).
"""

from __future__ import annotations

import os
import re

import pytest

from torchdoctor.lab import get
from torchdoctor.lab.runner import run
from torchdoctor.lab.scenarios import writes

from .support import fixture_text
from .support.lab import (
    LabRuns,
    closed_loop,
    scenario_names,
    signature_values,
)

NAMES = scenario_names("writes")
SUMMARY = re.compile(
    r"(?P<written>\d+) records written by (?P<writers>\d+) processes; (?P<ok>\d+) lines parse, "
    r"(?P<torn>\d+) do not, (?P<empty>\d+) empty, (?P<lost>\d+) records lost"
)


# the closed loop over this module's scenarios (tests/support/lab.py)
(
    runs,
    test_failure_happens,
    test_explain_names_the_code,
    test_fixed_variant_passes,
    test_output_is_recorded_as_a_fixture,
) = closed_loop(NAMES)


def _summary(text: str) -> dict[str, int]:
    m = SUMMARY.search(text)
    assert m, text[-2000:]
    return {k: int(v) for k, v in m.groupdict().items()}


def test_the_scenarios_are_here() -> None:
    assert set(NAMES) == {
        "writes-shared-jsonl",
        "writes-ranks-rename-staging",
        "writes-ranks-rename-own-staging",
        "writes-ranks-same-checkpoint",
        "writes-ranks-rmtree-checkpoint",
    }


def test_no_temporary_directory_is_left_behind(runs: LabRuns) -> None:
    assert not runs.left_behind(  # waits for every run, failing and fixed
        "torchdoctor-lab-writes-", "torchdoctor-lab-publish-", "torchdoctor-lab-samepath-", "torchdoctor-lab-rotate-"
    )


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
    assert found == {
        "written": writes.WRITERS * writes.RECORDS,
        "writers": writes.WRITERS,
        "ok": writes.WRITERS * writes.RECORDS,
        "torn": 0,
        "empty": 0,
        "lost": 0,
    }


# -- ranks publishing one checkpoint directory (TD659) -------------------------------------------------

PUBLISHED = re.compile(r"checkpoint-\d+: \[(?P<files>[^]]*)\]; left in \S+: \[(?P<left>[^]]*)\]")


def test_shared_staging_rename_loses_the_source(runs: LabRuns) -> None:
    values = signature_values("TD659", runs.get("writes-ranks-rename-staging").text())
    assert values, "no rename failure in the output"
    assert values[0]["source"].endswith(f"/tmp-checkpoint-{writes.STEP}")
    assert values[0]["target"].endswith(f"/checkpoint-{writes.STEP}")
    assert "ENOENT" in values[0]["what"]


def test_own_staging_rename_finds_the_final_directory_full(runs: LabRuns) -> None:
    values = signature_values("TD659", runs.get("writes-ranks-rename-own-staging").text())
    assert values, "no rename failure in the output"
    assert os.path.basename(values[0]["source"]).startswith("tmp-checkpoint-")
    assert values[0]["target"].endswith(f"/checkpoint-{writes.STEP}") and "ENOTEMPTY" in values[0]["what"]


@pytest.mark.parametrize("name", ["writes-ranks-rename-staging", "writes-ranks-rename-own-staging"])
def test_one_publisher_delivers_every_shard(runs: LabRuns, name: str) -> None:
    m = PUBLISHED.search(runs.get(name, fixed=True).text())
    assert m, runs.get(name, fixed=True).tail()
    assert m["files"] == ", ".join(f"'rng_state_{r}.pth'" for r in range(writes.RANKS))
    assert m["left"] == f"'checkpoint-{writes.STEP}'"  # no staging directory left behind


# -- ranks saving one checkpoint path (TD660) ----------------------------------------------------------


def test_concurrent_saves_leave_storages_at_wrong_offsets(runs: LabRuns) -> None:
    text = runs.get("writes-ranks-same-checkpoint").text()
    rounds = re.findall(r"^round (\d+): (\d+) bytes saved by (\d+) process", text, re.MULTILINE)
    assert rounds and all(int(n) == writes.RANKS for _, _, n in rounds)
    assert len(rounds) <= writes.SAVE_ROUNDS
    assert signature_values("TD660", text), text[-2000:]
    assert not signature_values("TD656", text)  # the legacy format does not fail like a truncated zip


def test_saving_from_one_rank_resumes_every_round(runs: LabRuns) -> None:
    text = runs.get("writes-ranks-same-checkpoint", fixed=True).text()
    assert f"resumed {writes.SAVE_ROUNDS} of {writes.SAVE_ROUNDS} times" in text
    sizes = set(re.findall(r"^round \d+: (\d+) bytes saved by 1 process", text, re.MULTILINE))
    assert len(sizes) == 1  # one writer: the same file every round


# -- ranks deleting one old checkpoint (TD661) ----------------------------------------------------------


def test_concurrent_rmtree_loses_entries_inside_the_tree(runs: LabRuns) -> None:
    # a real race: now and then (once in 5 full CI runs) every rank's walk misses the others' deletions;
    # up to 3 more runs of the scenario until it shows
    text = runs.get("writes-ranks-rmtree-checkpoint").text()
    values = signature_values("TD661", text)
    for _ in range(3):
        if values:
            break
        text = run(get("writes-ranks-rmtree-checkpoint"), fixed=False).text()
        values = signature_values("TD661", text)
    assert values, text[-2000:]
    # rmtree reports the entry relative to its directory: one of the files or shard directories the
    # scenario created (a fresh-clone CI run lost the race on a shard directory)
    m = re.fullmatch(r"rng_state_(\d+)\.pth|shard-(\d+)", values[0]["path"])
    assert m, values[0]["path"]
    if m.group(1) is not None:
        assert int(m.group(1)) < writes.FILES_PER_SHARD
    else:
        assert int(m.group(2)) < writes.SHARDS
    assert "in _rmtree_safe_fd" in text  # failed inside the walk, not at the top directory


def test_one_deleter_leaves_nothing_and_fails_no_rank(runs: LabRuns) -> None:
    text = runs.get("writes-ranks-rmtree-checkpoint", fixed=True).text()
    m = re.search(
        rf"checkpoint-{writes.OLD_STEP}: deleted by (?P<n>\d+) rank\(s\); left in \S+: \[(?P<left>[^]]*)\]", text
    )
    assert m, text[-2000:]
    assert m["n"] == "1" and m["left"] == ""
    assert "FileNotFoundError" not in text


def test_python2_json_wording_names_the_column() -> None:
    """Python 2.7 and 3.0-3.4 raise ValueError and also print where the extra data ends."""
    (values,) = signature_values("TD657", fixture_text("TD657", "gns3-gui-611-python34-valueerror.log"))
    assert values["line"] == "1" and values["column"] == "3"
    assert not signature_values("TD657", fixture_text("TD657", "near-nlvr-1-python27-json-load.log"))
