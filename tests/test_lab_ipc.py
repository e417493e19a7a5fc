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

import pytest

from torchdoctor.explain import explain
from torchdoctor.lab import get
from torchdoctor.lab.runner import run
from torchdoctor.lab.scenarios import fds, ipc

from .support.lab import (
    LabRuns,
    assert_explained,
    assert_failure,
    assert_fixed,
    check_json,
    closed_loop,
    evidence_budget,
    fixture_text,
    scenario_names,
    signature_values,
    slow_requested,
)

NAMES = scenario_names("ipc", "fds")
SLOW = scenario_names("ipc", "fds", slow=True)


# the closed loop over this module's scenarios (tests/support/lab.py)
runs, test_failure_happens, test_explain_names_the_code, test_fixed_variant_passes = closed_loop(NAMES, recorded=False)


def test_the_scenarios_are_here() -> None:
    assert {
        "fd-queue-ancdata",
        "fd-spawn-dataset",
        "fd-loader-kept-batches",
        "map-count-fast-spawn",
        "map-count-fast-forkserver",
        "shm-no-space",
        "shm-sigbus",
    } <= set(NAMES)
    assert {"map-count-spawn", "map-count-forkserver"} <= set(SLOW)


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
    leftovers = runs.left_behind("torchdoctor-lab-cache-", where="/dev/shm")
    assert not leftovers, leftovers


# -- other torch versions' wordings, from public reports (tests/fixtures/logs/<CODE>/*.log) ----------


@pytest.mark.parametrize(
    ("name", "segment", "how"),
    [
        ("nnunet-2162-write-no-space.log", "/torch_8289_606636967_0", "grow"),  # torch 1.x/2.0: errno printed
        ("dls-example-26-thallocator.log", "/torch_76_3625483894", "grow"),  # TH: " at …/THAllocator.c:383"
        ("yolov3-490-write-bare.log", "/torch_1131_1226038649", "grow"),  # nothing after the file name
        ("lab-shm-no-space.log", None, "allocate"),  # today's posix_fallocate wording, recorded here
    ],
)
def test_every_shm_no_space_wording_names_the_segment(name: str, segment: str | None, how: str) -> None:
    values = signature_values("TD156", fixture_text("TD156", name))[0]
    assert values["how"] == how and values["segment"].startswith("/torch_")
    assert segment is None or values["segment"] == segment


def test_shm_open_without_errno_is_not_read_as_no_space() -> None:
    assert not signature_values("TD156", fixture_text("TD156", "near-open-shm-read-write.log"))


def test_map_count_under_the_file_descriptor_strategy() -> None:
    """The default strategy maps a descriptor, so torch names no segment (`<filename not specified>`)."""
    (values,) = signature_values("TD155", fixture_text("TD155", "pytorch-92134-file-descriptor-strategy.log"))
    assert values["strategy"] == "file_descriptor" and values["bytes"] == "2048"


@pytest.mark.parametrize(
    "name",
    [
        "mmf-441-banner-after-timestamps.log",
        "gdr-net-16-banner-fullwidth-comma.log",
        "deeplab-pytorch-17-banner-case-mangled.log",
    ],
)
def test_bus_error_banner_in_any_case_and_punctuation(name: str) -> None:
    banners = [v for v in signature_values("TD157", fixture_text("TD157", name)) if "pid" not in v]
    assert banners, name


def test_bus_error_wrapped_after_killed_by_signal_is_still_shm() -> None:
    report = explain(fixture_text("TD157", "kraken-699-wrapped-bus-error.log"))
    assert report.root_cause is not None and report.root_cause.code == "TD157"
    assert report.root_cause.family == "shm-exhausted" and "--shm-size" in report.root_cause.fix


def test_no_space_write_comes_before_the_bus_errors_it_causes() -> None:
    report = explain(fixture_text("TD156", "ultralytics-1238-write-then-bus-errors.log"))
    assert report.diagnoses[0].code == "TD156" and "TD157" in report.codes()


@pytest.mark.parametrize(
    "name",
    [
        "caduceus-58-worker-start-pipe.log",
        "ssd-pytorch-91-worker-dupfd.log",
        "maskrcnn-benchmark-158-resource-sharer.log",
    ],
)
def test_errno_24_is_fd_exhausted_inside_and_outside_torch_sharing(name: str) -> None:
    top = explain(fixture_text("TD153", name)).diagnoses[0]
    assert (top.code, top.family) == ("TD153", "fd-exhausted")
    assert "ulimit -n" in top.fix and "file_system" in top.fix


def test_torch_descriptor_messages_do_not_double_as_errno_24() -> None:
    for code, name in (("TD152", "lab-fd-loader-kept-batches.log"), ("TD151", "lab-fd-spawn-dataset.log")):
        assert not signature_values("TD153", fixture_text(code, name)), name


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
    assert "TD111" not in check_json(
        "--sharing-strategy", "file_system", "--start-method", "fork", preexec_fn=_low_nofile
    ), "file_system (the fix) holds no descriptors"


def _private_shm(size: str) -> list[str]:
    return [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -t tmpfs -o size="$0",mode=1777 tmpfs /dev/shm && exec "$@"',
        size,
    ]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare -m")
def test_check_predicts_the_shm_failure() -> None:
    args = ("--num-workers", "2", "--batch-bytes", "16MiB", "--prefetch-factor", "2")
    small = check_json(*args, prefix=_private_shm("16m"))
    assert "TD102" in small, sorted(small)
    assert "TD102" not in check_json(*args, prefix=_private_shm(ipc.SHM_GROWN))


def test_shm_fix_refuses_a_shared_mount_namespace() -> None:
    """The fixed variants grow /dev/shm only in their own mount namespace; run here, they must refuse."""
    proc = subprocess.run(
        [sys.executable, "-c", "from torchdoctor.lab.scenarios.ipc import _grow_private_shm as g; g()"],
        capture_output=True,
        text=True,
        timeout=60,
    )
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
