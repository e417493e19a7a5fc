"""Closed loop for host memory and thread-pool scenarios (lab/scenarios/memory.py).

For each: the real failure happens with the text its code recognises; explain names that code and
family; the fixed variant passes; and where `torchdoctor check` has a preflight (TD205 for
RLIMIT_AS/RLIMIT_DATA, TD209 for RLIMIT_NPROC) it reported the same limit beforehand.
"""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from torchdoctor.lab.scenarios import memory
from torchdoctor.units import human_bytes

from .support.lab import (
    LOGS,
    LabRuns,
    check_json,
    closed_loop,
    fixture_text,
    scenario_names,
    signature_values,
)

NAMES = scenario_names("memory")
NOBODY = ["setpriv", f"--reuid={memory.NOBODY}", f"--regid={memory.NOBODY}", "--clear-groups", "--"]


# the closed loop over this module's scenarios (tests/support/lab.py)
(
    runs,
    test_failure_happens,
    test_explain_names_the_code,
    test_fixed_variant_passes,
    test_output_is_recorded_as_a_fixture,
) = closed_loop(NAMES)


def test_the_scenarios_are_here() -> None:
    assert {
        "oom-rlimit-as",
        "oom-rlimit-data",
        "oom-python-memoryerror",
        "oom-rlimit-before-import",
        "threads-nproc-limit",
    } <= set(NAMES)


# -- values extracted from the real text ------------------------------------------------------------


@pytest.mark.parametrize("name", ["oom-rlimit-as", "oom-rlimit-data"])
def test_allocator_error_names_the_requested_bytes(runs: LabRuns, name: str) -> None:
    assert signature_values("TD270", runs.get(name).text())[0]["bytes"] == str(memory.TOO_MUCH)


def test_memoryerror_is_not_read_as_the_cpu_allocator(runs: LabRuns) -> None:
    text = runs.get("oom-python-memoryerror").text()
    assert signature_values("TD271", text) and not signature_values("TD270", text)


def test_library_map_failure_names_the_library(runs: LabRuns) -> None:
    assert signature_values("TD272", runs.get("oom-rlimit-before-import").text())[0]["library"] == "libtorch_cpu.so"


def test_thread_creation_failure_names_the_errno_text(runs: LabRuns) -> None:
    values = signature_values("TD280", runs.get("threads-nproc-limit").text())[0]
    assert values["strerror"] == "Resource temporarily unavailable"


# -- preflight: check saw the limit that the scenario then ran into -----------------------------------


@pytest.mark.parametrize("which", ["RLIMIT_AS", "RLIMIT_DATA"])
def test_check_predicts_the_address_space_limit(which: str) -> None:
    limit = memory.LIMIT
    rlimit = getattr(resource, which)
    findings = check_json(preexec_fn=lambda: resource.setrlimit(rlimit, (limit, limit)))
    assert "TD205" in findings, sorted(findings)
    assert which in findings["TD205"]["message"] and human_bytes(limit) in findings["TD205"]["message"]


@pytest.mark.root
def test_check_predicts_the_nproc_limit(runs: LabRuns) -> None:
    if not Path("/usr/bin/setpriv").exists():
        pytest.skip("setpriv is not installed")
    runs.get("threads-nproc-limit")  # skips when the scenario cannot run here (not root)
    runs.wait_all()  # threads-nproc-growth runs as the same user: its tasks would inflate the count below
    limit = memory._user_tasks(memory.NOBODY) + memory.NPROC_ROOM
    findings = check_json(prefix=NOBODY, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit)))
    assert "TD209" in findings, sorted(findings)
    assert str(limit) in findings["TD209"]["message"]


# -- explain across ranks: the OOM of one rank explains the others' cascade ---------------------------


def test_torchrun_oom_fixture_names_the_oom_rank_first() -> None:
    from torchdoctor.explain import explain

    text = (LOGS / "TD270" / "lab-torchrun-peer-oom.log").read_text().split("# ---\n", 1)[1]
    report = explain(text)
    assert report.root_cause is not None and (report.root_cause.code, report.root_cause.rank) == ("TD270", 1)
    cascade = next(d for d in report.diagnoses if d.code == "TD454")
    assert cascade.role == "cascade" and cascade.rank == 0 and cascade.explained_by == "TD270"


def test_kernel_oom_kill_values_from_a_public_report() -> None:
    text = (LOGS / "TD273" / "bigbang-494-killed-and-kernel-line.log").read_text()
    assert {"pid": "10245", "process": "python3"}.items() <= signature_values("TD273", text)[0].items()
    assert signature_values("TD274", text)  # the shell's bare "Killed" confirms it


# -- older and other wordings of host OOM, from public reports (fixtures cite them) --------------------


@pytest.mark.parametrize(
    ("name", "gigabytes"), [("dreamtime-112-percent-d-gb.log", "%d"), ("gvcnn-7-th-whole-gb.log", "0")]
)
def test_old_allocator_wording_in_whole_gb(name: str, gigabytes: str) -> None:
    values = signature_values("TD270", fixture_text("TD270", name))
    assert values and values[0]["gigabytes"] == gigabytes and "whole GB" in values[0]["request"]


def test_allocator_wording_in_bytes_names_the_request() -> None:
    values = signature_values("TD270", fixture_text("TD270", "tiny-faces-12-bytes-buy-new-ram.log"))
    assert values[0]["bytes"] == "113246208" and values[0]["request"] == "113246208 bytes"


@pytest.mark.parametrize("name", ["self-critical-11-python2-fork.log", "person-reid-193-fork-loop.log"])
def test_fork_enomem_is_its_own_code(name: str) -> None:
    text = fixture_text("TD275", name)
    assert signature_values("TD275", text) and not signature_values("TD270", text)


@pytest.mark.parametrize("name", ["oom-rlimit-as", "oom-rlimit-data"])
def test_allocator_error_code_12_is_not_a_failed_fork(runs: LabRuns, name: str) -> None:
    assert not signature_values("TD275", runs.get(name).text())


def test_fork_enomem_is_the_root_cause() -> None:
    from torchdoctor.explain import explain

    root = explain(fixture_text("TD275", "self-critical-11-python2-fork.log")).root_cause
    assert root is not None and (root.code, root.family) == ("TD275", "host-oom")
    assert "forkserver" in root.fix and "num_workers" in root.fix
