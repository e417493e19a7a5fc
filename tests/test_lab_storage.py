"""Closed loop for the checkpoint scenarios (lab/scenarios/storage.py).

For each: torch.save/torch.load really fails with the text its code recognises; explain names that
code and family; the fixed variant (create the directory, remove the attribute, write elsewhere,
chown, enough space with an atomic save) passes; and `torchdoctor check --path DIR` on the same
directory, prepared the same way, reported it beforehand (TD602, TD604, TD605, TD607).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

from torchdoctor.lab.scenarios import storage

from .support.lab import (
    LabRuns,
    check_json,
    closed_loop,
    scenario_names,
    signature_values,
)

NAMES = scenario_names("storage")
NOBODY = ["setpriv", f"--reuid={storage.NOBODY}", f"--regid={storage.NOBODY}", "--clear-groups", "--"]


# the closed loop over this module's scenarios (tests/support/lab.py)
(
    runs,
    test_failure_happens,
    test_explain_names_the_code,
    test_fixed_variant_passes,
    test_output_is_recorded_as_a_fixture,
) = closed_loop(NAMES)


@pytest.fixture
def directory() -> Iterator[str]:
    """A fresh directory under /tmp, traversable by other users like the scenarios' own."""
    d = tempfile.mkdtemp(prefix="torchdoctor-test-")
    os.chmod(d, 0o755)
    yield d
    subprocess.run(["chattr", "-i", d], check=False, capture_output=True)
    shutil.rmtree(d, ignore_errors=True)


def _needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (chattr, private mounts, dropped privileges)")


def _in_private_mount(script: str) -> list[str]:
    """A prefix that runs the command after ``script`` in a private mount namespace (root only)."""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", f'{script} && exec "$@"', "sh"]


def test_the_scenarios_are_here() -> None:
    assert {
        "ckpt-save-missing-dir",
        "ckpt-save-immutable-dir",
        "ckpt-save-readonly-mount",
        "ckpt-save-permission-denied",
        "ckpt-save-disk-full",
        "ckpt-save-disk-full-fileobj",
        "ckpt-load-truncated",
        "ckpt-legacy-save-disk-full",
        "ckpt-save-io-error",
    } <= set(NAMES)


def test_no_temporary_directory_or_attribute_is_left_behind(runs: LabRuns) -> None:
    assert not runs.left_behind("torchdoctor-lab-")  # waits for every run, failing and fixed


# -- what the real texts say -------------------------------------------------------------------------


def test_missing_dir_names_the_directory(runs: LabRuns) -> None:
    values = signature_values("TD650", runs.get("ckpt-save-missing-dir").text())[0]
    assert values["directory"].endswith("/run-7/checkpoints")


def test_full_disk_leaves_a_truncated_file(runs: LabRuns) -> None:
    text = runs.get("ckpt-save-disk-full").text()
    size = int(re.search(r"left behind: \S+ \((\d+) bytes\)", text).group(1))
    assert 0 < size < storage.BIG_TENSOR_ELEMS * 4  # something was written, not the whole tensor
    values = signature_values("TD655", text)
    assert any(int(v["pos"]) > int(v["expected"]) for v in values if "pos" in v)


def test_full_disk_through_a_file_object_gives_the_errno(runs: LabRuns) -> None:
    values = signature_values("TD654", runs.get("ckpt-save-disk-full-fileobj").text())[0]
    assert (values["errno"], values["strerror"]) == ("28", "No space left on device")


def test_legacy_writer_names_the_full_disk(runs: LabRuns) -> None:
    text = runs.get("ckpt-legacy-save-disk-full").text()
    values = signature_values("TD654", text)[0]
    assert (values["errno"], values["strerror"]) == ("28", "No space left on device") and int(values["fd"]) >= 0
    assert not signature_values("TD658", text)  # ENOSPC through the same write loop is not an I/O error


def test_thin_disk_running_out_is_an_io_error(runs: LabRuns) -> None:
    text = runs.get("ckpt-save-io-error").text()
    values = signature_values("TD658", text)[0]
    assert values["call"] == "write" and int(values["fd"]) >= 0
    assert not signature_values("TD654", text)  # the file system thought it had room: EIO, not ENOSPC


def test_no_loop_device_is_left_behind(runs: LabRuns) -> None:
    runs.get("ckpt-save-io-error"), runs.get("ckpt-save-io-error", fixed=True)
    proc = subprocess.run(
        ["losetup", "--list", "--noheadings", "--output", "BACK-FILE"], capture_output=True, text=True, check=False
    )
    assert "torchdoctor-lab-thin-backing" not in proc.stdout


def test_truncated_checkpoint_has_no_central_directory(runs: LabRuns) -> None:
    values = signature_values("TD656", runs.get("ckpt-load-truncated").text())[0]
    assert values["reason"] == "failed finding central directory"


# -- preflight: `check --path` on the same kind of directory ---------------------------------------------


def test_check_predicts_the_missing_directory(directory: str) -> None:
    target = os.path.join(directory, "run-7", "checkpoints")
    findings = check_json("--path", target)
    assert "TD602" in findings, sorted(findings)
    assert target in findings["TD602"]["message"]


@pytest.mark.root
def test_check_predicts_the_immutable_directory(directory: str) -> None:
    _needs_root()
    subprocess.run(["chattr", "+i", directory], check=True)
    try:
        findings = check_json("--path", directory)
    finally:
        subprocess.run(["chattr", "-i", directory], check=True)
    assert "TD604" in findings, sorted(findings)
    assert "EPERM" in findings["TD604"]["message"]


@pytest.mark.root
def test_check_predicts_the_permission_denied(directory: str) -> None:
    _needs_root()
    findings = check_json("--path", directory, prefix=NOBODY)
    assert "TD604" in findings, sorted(findings)
    assert "EACCES" in findings["TD604"]["message"] and f"uid {storage.NOBODY}" in findings["TD604"]["message"]


@pytest.mark.root
def test_check_predicts_the_read_only_mount(directory: str) -> None:
    _needs_root()
    prefix = _in_private_mount(f"mount --bind {directory} {directory} && mount -o remount,bind,ro {directory}")
    findings = check_json("--path", directory, prefix=prefix)
    assert "TD605" in findings, sorted(findings)


@pytest.mark.root
def test_check_predicts_the_full_disk(directory: str) -> None:
    _needs_root()
    prefix = _in_private_mount(f"mount -t tmpfs -o size={storage.FULL_FS_SIZE} tmpfs {directory}")
    findings = check_json("--path", directory, "--expect-bytes", "16MiB", prefix=prefix)
    assert "TD607" in findings, sorted(findings)
    assert "16 MiB" in findings["TD607"]["message"]
