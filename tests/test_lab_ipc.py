"""Closed loop for the shared-memory, map-count and descriptor scenarios (lab/scenarios/{ipc,fds}.py).

For each: the real failure happens with the text its code recognises; explain names that code
and family; the fixed variant passes; and, where `torchdoctor check` has a preflight for it
(TD110 map count, TD111 open files, TD102 /dev/shm size), the check predicted the failure on the
same limits. The seed case (70,000 tensors, ~15 s and ~650 MB each) is marked slow: run it with
``pytest -m slow`` (or TORCHDOCTOR_LAB_SLOW=1).
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from torchdoctor.lab.runner import run
from torchdoctor.lab import get
from torchdoctor.lab.scenarios import fds, ipc

from .test_lab import (
    LabRuns, assert_explained, assert_failure, assert_fixed, check_json, evidence_budget, scenario_names,
    signature_values, slow_requested,
)

NAMES = scenario_names("ipc", "fds")
SLOW = scenario_names("ipc", "fds", slow=True)


@pytest.fixture(scope="module")
def runs() -> Iterator[LabRuns]:
    lab = LabRuns(NAMES)
    yield lab
    lab.close()


def test_the_scenarios_are_here() -> None:
    assert {"fd-queue-ancdata", "fd-spawn-dataset", "fd-loader-kept-batches", "map-count-fast-spawn",
            "map-count-fast-forkserver", "shm-no-space", "shm-sigbus"} <= set(NAMES)
    assert {"map-count-spawn", "map-count-forkserver"} <= set(SLOW)


@pytest.mark.parametrize("name", NAMES)
def test_failure_happens(runs: LabRuns, name: str) -> None:
    assert_failure(name, runs.get(name))


@pytest.mark.parametrize("name", NAMES)
def test_explain_names_the_code(runs: LabRuns, name: str) -> None:
    assert_explained(name, runs.get(name))


@pytest.mark.parametrize("name", NAMES)
def test_fixed_variant_passes(runs: LabRuns, name: str) -> None:
    assert_fixed(name, runs.get(name, fixed=True))


# -- values the signatures extract from the real text ---------------------------------------------

@pytest.mark.parametrize("name", ["map-count-fast-spawn", "map-count-fast-forkserver"])
def test_map_count_error_names_bytes_and_segment(runs: LabRuns, name: str) -> None:
    values = signature_values("TD155", runs.get(name).text())[0]
    assert int(values["bytes"]) >= ipc.ELEMENTS * 4  # one small tensor's storage, not a large allocation
    assert values["segment"].startswith("/torch_") and values["strategy"] == "file_system"


def test_fd_errors_name_the_segment(runs: LabRuns) -> None:
    values = signature_values("TD151", runs.get("fd-spawn-dataset").text())[0]
    assert values["segment"].startswith("/torch_") and values["mode"] == "read-write"
    assert signature_values("TD150", runs.get("fd-queue-ancdata").text())[0]["items"] == "0"


def test_shm_no_space_names_the_segment(runs: LabRuns) -> None:
    assert signature_values("TD156", runs.get("shm-no-space").text())[0]["segment"].startswith("/torch_")


def test_sigbus_worker_is_reported_by_the_worker_and_the_main_process(runs: LabRuns) -> None:
    text = runs.get("shm-sigbus").text()
    assert any("how" in v and "pid" not in v for v in signature_values("TD157", text))  # the worker's banner
    pids = [v["pid"] for v in signature_values("TD157", text) if "pid" in v]  # the main process's report
    assert pids and pids[0].isdigit()
    for cascade in signature_values("TD564", text):  # usually (not always) followed by the cascade line
        assert pids[0] in cascade["pids"].split(", ")
    assert not signature_values("TD560", text), "a bus error must not read as a generic worker crash"


def test_shm_scenarios_never_touch_the_real_dev_shm(runs: LabRuns) -> None:
    for name in ("shm-no-space", "shm-sigbus"):
        assert runs.get(name).private_shm == "16m"
    if os.geteuid() == 0 and shutil.which("unshare"):
        # file_system segments (/dev/shm/torch_*) can outlive a killed run: these get a private tmpfs
        for name in ("fd-queue-ancdata", "fd-loader-kept-batches", "map-count-fast-spawn", "map-count-fast-forkserver"):
            assert runs.get(name, fixed=True).private_shm is not None, name
    leftovers = [f for f in os.listdir("/dev/shm") if f.startswith("torchdoctor-lab-cache-")]
    assert not leftovers, leftovers


# -- the preflight predicted it ----------------------------------------------------------------------

def test_check_predicts_the_map_count_failure() -> None:
    findings = check_json("--sharing-strategy", "file_system", "--start-method", "spawn")
    td110 = findings.get("TD110")
    assert td110 is not None and td110["severity"] == "warning", sorted(findings)
    budget = evidence_budget(td110, "storages that fit")
    assert budget < ipc.SEED_TENSORS, f"check says {budget} storages fit; the seed case shares {ipc.SEED_TENSORS}"
    # and the fix: with fork only batches are shared, so the same limit is no longer a warning
    forked = check_json("--sharing-strategy", "file_system", "--start-method", "fork").get("TD110")
    assert forked is None or forked["severity"] == "info"


def _low_nofile() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (fds.LOW_NOFILE, hard))


def test_check_predicts_the_descriptor_failures() -> None:
    spawn = check_json("--sharing-strategy", "file_descriptor", "--start-method", "spawn", preexec_fn=_low_nofile)
    assert "TD111" in spawn, sorted(spawn)
    budget = evidence_budget(spawn["TD111"], "storages that can be shared at once")
    assert budget < fds.TENSORS, f"check says {budget} descriptors; fd-spawn-dataset shares {fds.TENSORS}"
    fork = check_json("--sharing-strategy", "file_descriptor", "--start-method", "fork", preexec_fn=_low_nofile)
    assert "TD111" in fork, "a 256 open-file limit must be flagged for fork loaders that keep batches too"
    assert "TD111" not in check_json("--sharing-strategy", "file_system", "--start-method", "fork",
                                     preexec_fn=_low_nofile), "file_system (the fix) holds no descriptors"


def _private_shm(size: str) -> list[str]:
    return ["unshare", "-m", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs -o size="$0",mode=1777 tmpfs /dev/shm && exec "$@"', size]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare -m")
def test_check_predicts_the_shm_failure() -> None:
    args = ("--num-workers", "2", "--batch-bytes", "16MiB", "--prefetch-factor", "2")
    small = check_json(*args, prefix=_private_shm("16m"))
    assert "TD102" in small, sorted(small)
    assert "TD102" not in check_json(*args, prefix=_private_shm(ipc.SHM_GROWN))


def test_shm_fix_refuses_a_shared_mount_namespace() -> None:
    """The fixed variants grow /dev/shm only in their own mount namespace; run here, they must refuse."""
    proc = subprocess.run([sys.executable, "-c", "from torchdoctor.lab.scenarios.ipc import _grow_private_shm as g; g()"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "refusing to remount" in proc.stderr


# -- the seed case (slow) ----------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_seed_case(name: str, request: pytest.FixtureRequest) -> None:
    if not slow_requested(request.config):
        pytest.skip("slow (~15 s, ~650 MB): run with -m slow or TORCHDOCTOR_LAB_SLOW=1")
    failed = run(get(name))
    assert_failure(name, failed)
    assert failed.peak_rss_mb > 300, "the seed case pickles 70,000 real tensors"
    assert_explained(name, failed)
    assert_fixed(name, run(get(name), fixed=True))
