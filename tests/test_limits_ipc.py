"""Process limits (facts/limits.py) and the IPC sharing checks TD110-TD112 (catalogue/ipc.py)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from torchdoctor.catalogue.ipc import LOW_NOFILE, SUGGESTED_MAP_COUNT, SUGGESTED_NOFILE
from torchdoctor.checks import run_checks
from torchdoctor.facts import Facts, GatherContext, gather
from torchdoctor.facts.limits import RLIMITS, parse_cap_eff, parse_proc_limits
from torchdoctor.model import Finding, Severity
from torchdoctor.options import CheckOptions
from torchdoctor.registry import lookup
from torchdoctor.units import human_bytes

FIXTURES = Path(__file__).parent / "fixtures" / "limits"
IPC_CODES = ("TD110", "TD111", "TD112")


# -- helpers ----------------------------------------------------------------------------------


def make_facts(
    *,
    soft: int | None = 1024,
    hard: int | None = 4096,
    open_fds: int = 10,
    max_map: int | None = 65530,
    maps: int = 200,
    default_method: str = "fork",
    python: str = "3.11.7",
    cap: bool | None = False,
    nr_open: int = 1048576,
    torch_strategy: str | None = None,
    nofile_known: bool = True,
) -> Facts:
    """A facts snapshot; ``soft``/``hard`` None means unlimited, ``nofile_known=False`` unreadable."""
    nofile = None
    if nofile_known:
        nofile = {"soft": soft, "hard": hard, "soft_unlimited": soft is None, "hard_unlimited": hard is None}
    data: dict[str, Any] = {
        "meta": {"schema_version": 1},
        "host": {"system": "Linux", "python": {"version": python, "default_start_method": default_method}},
        "limits": {
            "rlimits": {"nofile": nofile},
            "sysctl": {"vm": {"max_map_count": max_map}, "fs": {"nr_open": nr_open}},
            "process": {"open_fds": open_fds, "map_count": maps, "page_size": 4096, "cap_sys_resource": cap},
        },
    }
    if torch_strategy:
        data["torch"] = {"installed": True, "default_sharing_strategy": torch_strategy}
    return Facts.from_dict(data)


def hits(code: str, facts: Facts, **opts: Any) -> list[Finding]:
    return run_checks(facts, CheckOptions(**opts), codes=[lookup(code)])


def one(code: str, facts: Facts, **opts: Any) -> Finding:
    found = hits(code, facts, **opts)
    assert len(found) == 1, found
    assert not found[0].check_error, found[0].message
    return found[0]


def evidence(f: Finding) -> dict[str, Any]:
    return {e.label: e.value for e in f.evidence}


# -- TD110: vm.max_map_count ------------------------------------------------------------------


def test_td110_seed_case_file_system_spawn_is_a_warning_with_the_250mb_arithmetic() -> None:
    f = one("TD110", make_facts(maps=0), sharing_strategy="file_system", start_method="forkserver")
    assert f.severity is Severity.WARNING
    assert f.family == "shm-map-count"
    # 65530 one-page mappings: the "fails at 250 MB" of the seed report.
    assert human_bytes(65530 * 4096) in f.message and "65530" in f.message
    assert "Cannot allocate memory (12)" in f.message
    assert "forkserver" in f.message
    assert f"vm.max_map_count={SUGGESTED_MAP_COUNT}" in f.fix
    assert evidence(f)["vm.max_map_count"] == 65530


def test_td110_budget_subtracts_mappings_already_used() -> None:
    f = one("TD110", make_facts(maps=230), sharing_strategy="file_system", start_method="spawn")
    assert "65530 − 230 = 65300" in str(evidence(f)["storages that fit"])
    assert "about 65300 storages" in f.message


def test_td110_file_system_with_fork_is_info_only() -> None:
    f = one("TD110", make_facts(), sharing_strategy="file_system", start_method="fork")
    assert f.severity is Severity.INFO
    assert "only batches in flight" in f.message


def test_td110_near_miss_raised_map_count() -> None:
    facts = make_facts(max_map=SUGGESTED_MAP_COUNT)
    assert hits("TD110", facts, sharing_strategy="file_system", start_method="spawn") == []
    assert hits(
        "TD110", make_facts(max_map=SUGGESTED_MAP_COUNT - 1), sharing_strategy="file_system", start_method="spawn"
    )


def test_td110_not_for_default_strategy_with_fork() -> None:
    assert hits("TD110", make_facts(soft=1048576, hard=1048576)) == []


def test_td110_file_descriptor_spawn_when_mappings_run_out_before_descriptors() -> None:
    # Docker's usual nofile 1048576: descriptors outlast the 65530 mappings.
    f = one("TD110", make_facts(soft=1048576, hard=1048576), start_method="spawn")
    assert f.severity is Severity.WARNING
    assert "mappings run out first" in f.message
    # ... but with 1024 descriptors those run out first, which is TD111's finding.
    assert hits("TD110", make_facts(soft=1024), start_method="spawn") == []


def test_td110_uses_torch_default_strategy_from_facts() -> None:
    facts = make_facts(torch_strategy="file_system")
    f = one("TD110", facts, start_method="spawn")
    assert evidence(f)["sharing strategy"] == "file_system"


# -- TD111: RLIMIT_NOFILE ---------------------------------------------------------------------


def test_td111_low_soft_limit_with_fork_and_raisable_hard() -> None:
    f = one("TD111", make_facts(soft=1024, hard=4096, open_fds=12))
    assert f.severity is Severity.WARNING and f.family == "fd-exhausted"
    assert evidence(f)["RLIMIT_NOFILE soft"] == 1024
    assert "1024 − 12 = 1012" in str(evidence(f)["storages that can be shared at once"])
    assert "received 0 items of ancdata" in f.message
    assert "ulimit -n 4096" in f.fix and "needs no root" in f.fix
    assert "resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))" in f.fix


def test_td111_near_miss_fork_at_threshold() -> None:
    assert hits("TD111", make_facts(soft=LOW_NOFILE, hard=LOW_NOFILE)) == []
    assert hits("TD111", make_facts(soft=LOW_NOFILE - 1, hard=LOW_NOFILE))


def test_td111_spawn_needs_more_descriptors() -> None:
    f = one("TD111", make_facts(soft=20000, hard=20000, cap=False), start_method="spawn")
    assert "Too many open files (24)" in f.message
    assert "nofile=65536:65536" in f.fix and "lacks CAP_SYS_RESOURCE" in f.fix
    assert hits("TD111", make_facts(soft=SUGGESTED_NOFILE, hard=SUGGESTED_NOFILE), start_method="spawn") == []


def test_td111_equal_hard_limit_with_capability_says_so() -> None:
    f = one("TD111", make_facts(soft=1024, hard=1024, cap=True, nr_open=40000))
    assert "has CAP_SYS_RESOURCE" in f.fix and "ulimit -n 40000" in f.fix  # capped at fs.nr_open


def test_td111_unlimited_hard_limit() -> None:
    f = one("TD111", make_facts(soft=1024, hard=None, nr_open=1048576))
    assert "ulimit -n 1048576" in f.fix and "resource.RLIM_INFINITY" in f.fix
    assert evidence(f)["RLIMIT_NOFILE hard"] == "unlimited"


def test_td111_not_under_file_system_or_unknown() -> None:
    assert hits("TD111", make_facts(soft=256), sharing_strategy="file_system") == []
    assert hits("TD111", make_facts(soft=None, hard=None)) == []  # unlimited: nothing to compare with
    assert hits("TD111", make_facts(nofile_known=False)) == []


# -- TD112: the start method in effect -------------------------------------------------------


def test_td112_spawn_reports_both_budgets() -> None:
    f = one("TD112", make_facts(soft=1024, open_fds=24, maps=300), start_method="spawn")
    assert f.severity is Severity.INFO
    assert "about 1000 under file_descriptor" in f.message
    assert "about 65230 under file_system" in f.message
    assert "multiprocessing_context" in f.message and "--start-method" in f.message


def test_td112_python_314_default_forkserver() -> None:
    f = one("TD112", make_facts(default_method="forkserver", python="3.14.0"))
    assert "forkserver" in f.message and "3.14" in f.message


def test_td112_not_for_fork() -> None:
    assert hits("TD112", make_facts()) == []
    assert hits("TD112", make_facts(default_method="spawn"), start_method="fork") == []


def test_td112_tolerates_unknown_limits() -> None:
    f = one("TD112", make_facts(soft=None, hard=None, max_map=None), start_method="spawn")
    assert "RLIMIT_NOFILE unlimited" in f.message and "vm.max_map_count not read" in f.message
    f = one("TD112", make_facts(nofile_known=False), start_method="spawn")
    assert "RLIMIT_NOFILE not read" in f.message and "about 65330 under file_system" in f.message


def test_ipc_checks_tolerate_missing_sections() -> None:
    facts = Facts.from_dict({"meta": {"schema_version": 1}, "limits": None})
    for code in IPC_CODES:
        found = hits(code, facts, start_method="spawn", sharing_strategy="file_system")
        assert all(not f.check_error for f in found)
    assert hits("TD110", facts, start_method="spawn") == [] and hits("TD111", facts) == []


# -- the gatherer -----------------------------------------------------------------------------


def _expected(resource_name: str) -> dict[str, Any]:
    soft, hard = resource.getrlimit(getattr(resource, resource_name))
    inf = resource.RLIM_INFINITY
    return {
        "soft": None if soft == inf else soft,
        "hard": None if hard == inf else hard,
        "soft_unlimited": soft == inf,
        "hard_unlimited": hard == inf,
    }


def test_gather_live_matches_getrlimit_and_proc() -> None:
    facts = gather(GatherContext(torch=False), sections=["limits"])
    assert facts.get("limits.rlimits_source") == "resource.getrlimit"
    for key, (const, _) in RLIMITS.items():
        assert facts.get(f"limits.rlimits.{key}") == _expected(const), key
    with open("/proc/sys/vm/max_map_count") as fh:
        assert facts.get("limits.sysctl.vm.max_map_count") == int(fh.read())
    with open("/proc/sys/fs/nr_open") as fh:
        assert facts.get("limits.sysctl.fs.nr_open") == int(fh.read())
    assert facts.get("limits.process.open_fds") >= 3
    assert facts.get("limits.process.map_count") > 10
    assert facts.get("limits.process.page_size") == os.sysconf("SC_PAGE_SIZE")
    json.dumps(facts.to_json())


def test_gather_replayed_root() -> None:
    ctx = GatherContext(torch=False, root=FIXTURES / "host-root")
    facts = gather(ctx, sections=["limits"])
    assert facts.get("limits.rlimits_source") == "/proc/self/limits"
    assert facts.get("limits.rlimits.nofile") == {
        "soft": 1024,
        "hard": 20000,
        "soft_unlimited": False,
        "hard_unlimited": False,
    }
    assert facts.get("limits.rlimits.stack.hard_unlimited") is True
    assert facts.get("limits.rlimits.as.soft_unlimited") is True
    assert facts.get("limits.sysctl.vm.max_map_count") == 65530
    assert facts.get("limits.sysctl.fs.file-max") == 2466170
    assert facts.get("limits.process.open_fds") == 4
    assert facts.get("limits.process.map_count") == 38
    assert facts.get("limits.process.cap_sys_resource") is False
    assert facts.unknown == {}
    # and the checks read it: soft 1024 with fork → TD111, raisable to the hard 20000
    f = one("TD111", facts, start_method="fork")
    assert "ulimit -n 20000" in f.fix


def test_gather_empty_root_records_unknowns(tmp_path: Path) -> None:
    facts = gather(GatherContext(torch=False, root=tmp_path), sections=["limits"])
    assert facts.get("limits.sysctl.vm.max_map_count") is None
    assert "cannot read /proc/sys/vm/max_map_count" in facts.why_unknown("limits.sysctl.vm.max_map_count")
    assert facts.why_unknown("limits.process.open_fds")
    assert facts.get("limits.rlimits.nofile") is None and facts.why_unknown("limits.rlimits.nofile")
    for code in IPC_CODES:
        assert all(not f.check_error for f in hits(code, facts, start_method="spawn"))


def test_parse_proc_limits_and_cap_eff() -> None:
    rows = parse_proc_limits((FIXTURES / "host-root/proc/self/limits").read_text())
    assert rows["memlock"] == {"soft": 8388608, "hard": 8388608, "soft_unlimited": False, "hard_unlimited": False}
    assert rows["data"]["soft"] is None and rows["data"]["soft_unlimited"] is True
    assert set(rows) == set(RLIMITS)
    assert parse_cap_eff("Name:\tx\nCapEff:\t000001ffffffffff\n") == 0x1FFFFFFFFFF
    assert parse_cap_eff("Name:\tx\n") is None


# -- REAL: shrunken RLIMIT_NOFILE in a child --------------------------------------------------


def _check_json(*args: str, nofile: tuple[int, int] | None = None) -> dict[str, Any]:
    def lower() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

    proc = subprocess.run(
        [sys.executable, "-m", "torchdoctor", "check", "--format", "json", "--no-torch", *args],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lower,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def test_real_low_nofile_child_reports_td111() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    report = _check_json(nofile=(256, hard))
    found = [f for f in report["findings"] if f["code"] == "TD111"]
    assert len(found) == 1, report["findings"]
    ev_values = {e["label"]: e["value"] for e in found[0]["evidence"]}
    assert ev_values["RLIMIT_NOFILE soft"] == 256
    assert "256" in found[0]["message"]
    if hard != resource.RLIM_INFINITY and hard > 256:
        assert f"ulimit -n {hard}" in found[0]["fix"]


def test_real_high_nofile_child_has_no_td111() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    high = hard if hard != resource.RLIM_INFINITY else SUGGESTED_NOFILE
    if high < LOW_NOFILE:
        pytest.skip(f"hard RLIMIT_NOFILE here is {high}, below the {LOW_NOFILE} that counts as high")
    report = _check_json("--start-method", "fork", nofile=(high, hard))
    assert [f for f in report["findings"] if f["code"] == "TD111"] == []


# -- REAL: the premise, with torch: one descriptor and one mapping per shared storage ---------

_PREMISE = textwrap.dedent("""
    import json, os, sys
    import torch, torch.multiprocessing as mp
    from torchdoctor.facts import GatherContext, gather
    mp.set_sharing_strategy(sys.argv[1])
    f = gather(GatherContext(torch=False), sections=["limits"])
    before = (len(os.listdir("/proc/self/fd")), sum(1 for _ in open("/proc/self/maps")))
    kept, error = [], None
    try:
        for _ in range(int(sys.argv[2])):
            kept.append(torch.zeros(16).share_memory_())
    except RuntimeError as exc:
        error = str(exc)
    shared = len(kept)
    if error:  # free a few descriptors so that /proc can be read at all
        del kept[-8:]
    after = (len(os.listdir("/proc/self/fd")), sum(1 for _ in open("/proc/self/maps")))
    print(json.dumps({"shared": shared, "error": error, "fds": after[0] - before[0], "maps": after[1] - before[1],
                      "soft": f.get("limits.rlimits.nofile.soft"), "open": f.get("limits.process.open_fds")}))
""")


def _in_private_shm(argv: list[str]) -> list[str]:
    """As root, keep the segments torch creates off the real /dev/shm: a private tmpfs in a new mount
    namespace (see test_shm_real.py); otherwise run as is (torch removes its segments itself)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return argv
    wrapped = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        'mount --make-rprivate / && mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"',
        "sh",
        *argv,
    ]
    probe = subprocess.run(wrapped[: -len(argv)] + ["true"], capture_output=True, timeout=30)
    return wrapped if probe.returncode == 0 else argv


def _premise(strategy: str, n: int, nofile: tuple[int, int] | None = None) -> dict[str, Any]:
    pytest.importorskip("torch", reason="needs torch to share real tensor storages")

    def lower() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

    argv = [sys.executable, "-c", _PREMISE, strategy, str(n)]
    proc = subprocess.run(_in_private_shm(argv), capture_output=True, text=True, timeout=120, preexec_fn=lower)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.torch
def test_real_file_descriptor_strategy_fails_inside_the_td111_budget() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    out = _premise("file_descriptor", 1000, nofile=(256, hard))
    assert out["soft"] == 256
    assert out["error"] is not None and "Too many open files" in out["error"]
    budget = out["soft"] - out["open"]
    # torch's import opens a few descriptors of its own after the facts were read
    assert budget - 32 <= out["shared"] <= budget


@pytest.mark.torch
def test_real_file_system_strategy_costs_one_mapping_per_storage_not_a_descriptor() -> None:
    out = _premise("file_system", 500)
    assert out["error"] is None and out["shared"] == 500
    assert 500 <= out["maps"] <= 510
    assert out["fds"] <= 5
