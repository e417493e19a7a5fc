"""`check` warns with TD570 when the DataLoader workers outnumber the CPUs the process may use (issue 6):
`--num-workers` × `--nproc-per-node` against the least of online CPUs, affinity and cgroup CPU quota."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

from torchdoctor.catalogue import PREFLIGHT_VARIANTS
from torchdoctor.checks import preflight_codes, run_checks
from torchdoctor.facts import Facts
from torchdoctor.options import CheckOptions
from torchdoctor.registry import lookup

from .conftest import FIXTURES, REPO, run_cli, run_json

K8S = FIXTURES / "facts" / "k8s-pod-cgroupv2.json"  # recorded: 64 CPUs visible, cgroup quota of 2


def _usable_threads() -> int:
    facts = json.loads(run_cli("facts", "--no-torch").stdout)
    return int(facts["cpu"]["usable_threads"])


def _td570(doc: dict[str, Any]) -> dict[str, Any] | None:
    return next((f for f in doc["findings"] if f["code"] == "TD570"), None)


def test_the_reported_case_more_workers_than_cpus_warns() -> None:
    usable = _usable_threads()
    many = max(32, usable + 1)
    doc = run_json("check", "--no-torch", "--num-workers", str(many))
    f = _td570(doc)
    assert f is not None and f["severity"] == "warning" and f["area"] == "loader"
    assert f"{many} DataLoader worker processes (--num-workers {many}), more than the {usable} CPUs" in f["message"]
    assert f"at most {usable} per training process" in f["fix"]
    assert _td570(run_json("check", "--no-torch", "--num-workers", str(usable))) is None
    assert _td570(run_json("check", "--no-torch", "--num-workers", "0")) is None


@pytest.mark.skipif(
    shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2, reason="needs taskset and 2 CPUs"
)
def test_the_affinity_mask_is_respected() -> None:
    """A real affinity mask of one CPU (taskset): two workers are already too many."""
    argv = [
        "taskset",
        "-c",
        str(min(os.sched_getaffinity(0))),
        sys.executable,
        "-m",
        "torchdoctor",
        "check",
        "--no-torch",
        "--num-workers",
        "2",
        "--format",
        "json",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    f = _td570(json.loads(proc.stdout))
    assert f is not None and "more than the 1 CPUs" in f["message"]
    assert {"label": "CPUs this process may run on", "value": 1, "source": "/proc/self/status Cpus_allowed_list"} in f[
        "evidence"
    ]


def test_the_cgroup_cpu_quota_is_respected() -> None:
    rel = str(K8S.relative_to(REPO))
    doc = run_json("check", "--facts", rel, "--num-workers", "3", cwd=REPO)
    f = _td570(doc)
    assert (
        f is not None and "more than the 2 CPUs this process may use (limited by its cgroup CPU quota)" in f["message"]
    )
    assert {"label": "cgroup CPU quota (CPUs)", "value": "2", "source": "/sys/fs/cgroup/cpu.max"} in f["evidence"]
    # 64 CPUs are visible, but the quota decides: 2 workers fit, and are listed as fine
    ok = run_json("check", "--facts", rel, "--num-workers", "2", cwd=REPO)
    assert _td570(ok) is None
    assert any(p["subject"] == "DataLoader workers" and p["codes"] == ["TD570"] for p in ok["passed"])


def test_training_processes_multiply_the_workers() -> None:
    facts = Facts.load(K8S)
    facts.data["cpu"] = {
        **facts.data["cpu"],
        "cgroup_quota_cpus": None,
        "usable_cores": 8,
        "usable_threads": 8,
        "affinity_cores": 8,
        "usable_limited_by": "affinity",
    }
    codes = [c for c in preflight_codes() if c.code == "TD570"]
    assert run_checks(facts, CheckOptions(num_workers=2, nproc_per_node=4), codes=codes) == []
    [f] = run_checks(facts, CheckOptions(num_workers=3, nproc_per_node=4), codes=codes)
    assert f.code == "TD570" and "12 DataLoader worker processes (4 training processes × 3)" in f.message
    assert "at most 2 per training process" in f.fix
    [f] = run_checks(facts, CheckOptions(num_workers=1, nproc_per_node=16), codes=codes)
    assert "at most 0 (load in the main process) or 1 per training process" in f.fix


def test_unknown_cpus_say_nothing() -> None:
    facts = Facts.from_dict({"meta": {"schema_version": 1}})
    assert [f for f in run_checks(facts, CheckOptions(num_workers=64)) if f.code == "TD570"] == []


def test_codes_tells_td570_is_also_a_preflight_check() -> None:
    assert "TD570" in {c.code for c in preflight_codes()}
    assert lookup("TD570").signatures, "the log signature stays with the declaration in log_workers.py"
    doc = json.loads(run_cli("codes", "TD570", "--format", "json").stdout)
    assert doc["codes"][0]["preflight"] is True
    text = run_cli("codes", "TD570").stdout
    assert "What `torchdoctor check` says before the run" in text
    md = (REPO / "docs" / "codes.md").read_text(encoding="utf-8")
    section = md[md.index("## TD570 ") :]
    section = section[: section.index("\n## ", 5)]
    assert "preflight check" in section and "What `torchdoctor check` says before the run" in section


def test_explain_still_uses_the_log_wording() -> None:
    """The preflight variant does not change what explain says about torch's own warning."""
    assert lookup("TD570").message.startswith("The DataLoader warned")
    assert lookup("TD570").check is None and PREFLIGHT_VARIANTS["TD570"].check is not None
