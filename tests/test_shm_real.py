"""Real /dev/shm limits: torchdoctor run inside ``unshare -m`` with a private tmpfs over /dev/shm.

The tmpfs is mounted in a new mount namespace whose propagation is made private first, so the
real /dev/shm is never touched (checked before and after). Needs root; skipped with the reason
otherwise. The recorded snapshot test at the end needs nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from torchdoctor.units import human_bytes

MiB = 1024 * 1024
SNAPSHOT = Path(__file__).parent / "fixtures" / "facts" / "docker-64mb-shm.json"

# A fixed script; the size and the command arrive as positional arguments, never spliced in.
_MOUNT_AND_EXEC = 'mount --make-rprivate / && mount -t tmpfs -o "size=$1" tmpfs /dev/shm && shift && exec "$@"'


def private_shm_argv(size: str, *command: str) -> list[str]:
    """argv that runs ``command`` with a private tmpfs of ``size`` over /dev/shm."""
    return ["unshare", "-m", "--propagation", "private", "--", "sh", "-c", _MOUNT_AND_EXEC, "sh", size, *command]


def _skip_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return "mount namespaces are Linux only"
    if os.geteuid() != 0:
        return "needs root to mount a private tmpfs in a new mount namespace (unshare -m)"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(private_shm_argv("1m", "true"), capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"unshare -m with a private tmpfs is refused here: {probe.stderr.strip() or probe.returncode}"
    return None


@pytest.fixture(scope="module")
def private_shm() -> Any:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    before = os.statvfs("/dev/shm")
    yield
    after = os.statvfs("/dev/shm")
    assert (after.f_blocks, after.f_frsize) == (before.f_blocks, before.f_frsize), "the real /dev/shm changed"


def _torchdoctor(size: str, *args: str) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        private_shm_argv(size, sys.executable, "-m", "torchdoctor", *args), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _check(size: str, *args: str) -> dict[str, dict[str, Any]]:
    _, report = _torchdoctor(size, "check", "--format", "json", "--no-torch", *args)
    return {f["code"]: f for f in report["findings"]}


def _ev(finding: dict[str, Any]) -> dict[str, Any]:
    return {e["label"]: e["value"] for e in finding["evidence"]}


@pytest.mark.root
def test_facts_measure_the_private_tmpfs(private_shm: None) -> None:
    _, facts = _torchdoctor("16m", "facts", "--format", "json", "--no-torch")
    assert facts["shm"]["size_bytes"] == 16 * MiB
    assert facts["shm"]["mount_size_option"] == "16384k"
    assert facts["shm"]["fstype"] == "tmpfs" and facts["shm"]["mounted"] is True


@pytest.mark.root
def test_16mb_shm_is_too_small_and_a_container_default(private_shm: None) -> None:
    found = _check("16m")
    size = human_bytes(16 * MiB)
    assert "TD102" in found, sorted(found)
    assert _ev(found["TD102"])["/dev/shm size"] == size and size in found["TD102"]["message"]
    assert found["TD102"]["severity"] == "error"
    assert "TD103" in found, sorted(found)  # 16 MiB <= the 64 MiB container default
    assert _ev(found["TD103"])["/dev/shm size"] == size


@pytest.mark.root
def test_64mb_shm_is_the_container_default(private_shm: None) -> None:
    found = _check("64m")
    assert "TD103" in found, sorted(found)
    assert _ev(found["TD103"])["/dev/shm size"] == human_bytes(64 * MiB)
    assert "64 MiB" in found["TD103"]["message"]


@pytest.mark.root
def test_65mb_shm_is_not_the_container_default(private_shm: None) -> None:
    found = _check("65m")
    assert "TD103" not in found, found.get("TD103")


@pytest.mark.root
def test_64mb_shm_fits_small_batches(private_shm: None) -> None:
    # 1 worker × prefetch 2 × 1 MiB = 2 MiB in flight: fits in 64 MiB, so no TD102 ...
    assert "TD102" not in _check("64m", "--num-workers", "1", "--batch-bytes", "1MiB")
    # ... while the defaults (4 × 2 × 32 MiB = 256 MiB) do not.
    assert "TD102" in _check("64m")


# -- the recorded snapshot ---------------------------------------------------------------------


def test_docker_64mb_snapshot_is_recorded_for_real() -> None:
    data = json.loads(SNAPSHOT.read_text())
    assert data["meta"]["provenance"].startswith("Recorded with")
    assert data["shm"]["size_bytes"] == 64 * MiB
    assert data["host"]["container"]["in_container"] is True


def test_check_on_docker_64mb_snapshot_reports_td103() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "torchdoctor", "check", "--facts", str(SNAPSHOT), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode in (0, 1), proc.stderr
    found = {f["code"]: f for f in json.loads(proc.stdout)["findings"]}
    assert "TD103" in found, sorted(found)
    assert _ev(found["TD103"])["/dev/shm size"] == "64 MiB"
    assert "this container" in found["TD103"]["message"]
