"""What users see, for recorded machines: text, JSON and exit code of `check --facts`.

Snapshots live in tests/__snapshots__/ and change only through `pytest --snapshot-update`,
reviewed in the diff.
"""

from __future__ import annotations

import json

import pytest

from .conftest import FIXTURES, REPO, run_cli

RECORDED = sorted((FIXTURES / "facts").glob("*.json"))
REQUIRED = {"docker-64mb-shm", "k8s-pod-cgroupv2", "slurm-4gpu-node", "healthy-workstation"}


def test_the_recorded_machines_are_there() -> None:
    assert REQUIRED <= {p.stem for p in RECORDED}


def test_every_snapshot_says_how_it_was_recorded() -> None:
    for path in RECORDED:
        meta = json.loads(path.read_text())["meta"]
        assert len(meta.get("provenance", "")) > 20, f"{path.name}: meta.provenance missing"


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_check_text_snapshot(path, snapshot) -> None:
    rel = path.relative_to(REPO)
    proc = run_cli("check", "--facts", str(rel), cwd=REPO, env={"NO_COLOR": "1"})
    assert proc.returncode in (0, 1), proc.stderr
    assert {"exit_code": proc.returncode, "stdout": proc.stdout} == snapshot


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_check_json_snapshot(path, snapshot) -> None:
    rel = path.relative_to(REPO)
    proc = run_cli("check", "--facts", str(rel), "--format", "json", cwd=REPO)
    doc = json.loads(proc.stdout)
    assert doc["source"] == f"recorded facts {rel}"
    assert doc == snapshot
