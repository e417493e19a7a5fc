"""Memory, cgroups and process-count limits: parsers on kernel-format fixtures, gatherers on fixture
roots and on this host, pure checks both ways, a real RLIMIT_AS child, and the k8s snapshot."""

from __future__ import annotations

import copy
import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from torchdoctor.checks import run_checks
from torchdoctor.facts import Facts, GatherContext, cgroups, memory
from torchdoctor.options import CheckOptions
from torchdoctor.registry import lookup

from .conftest import FIXTURES, REPO, run_cli, run_json

CG = FIXTURES / "cgroups"
K8S = FIXTURES / "facts" / "k8s-pod-cgroupv2.json"
GiB = 1024**3


def gather_at(name: str) -> tuple[dict[str, Any], dict[str, str]]:
    ctx = GatherContext(root=CG / name, env={})
    return cgroups.gather(ctx), ctx.unknowns


def codes(facts: Facts, opts: CheckOptions | None = None, prefix: str = "TD2") -> dict[str, Any]:
    return {f.code: f for f in run_checks(facts, opts) if f.code.startswith(prefix)}


# -- parsers -----------------------------------------------------------------------------------
def test_parse_proc_cgroup_v1_and_v2_lines() -> None:
    text = (CG / "v1-docker/proc/self/cgroup").read_text()
    parsed = cgroups.parse_proc_cgroup(text)
    assert parsed["memory"].startswith("/docker/") and parsed["cpu"] == parsed["cpuacct"] == parsed["memory"]
    assert parsed[""] == "/system.slice/containerd.service"
    assert cgroups.parse_proc_cgroup("0::/\n") == {"": "/"}


def test_parse_cgroup_mounts_reads_root_and_controllers() -> None:
    mounts = cgroups.parse_cgroup_mounts((CG / "v1-docker/proc/self/mountinfo").read_text())
    cpu = next(m for m in mounts if "cpu" in m.controllers)
    assert cpu.mount_point == "/sys/fs/cgroup/cpu,cpuacct" and cpu.root.startswith("/docker/")
    assert {"cpu", "cpuacct"} <= cpu.controllers and cpu.version == 1
    assert all(m.version == 1 for m in mounts)  # the tmpfs holding them is not a cgroup mount
    v2 = cgroups.parse_cgroup_mounts((CG / "k8s-pod/proc/self/mountinfo").read_text())
    assert [(m.version, m.mount_point) for m in v2] == [(2, "/sys/fs/cgroup")]


@pytest.mark.parametrize(
    "raw, v1, expected",
    [
        ("max", False, None),
        ("8589934592", False, 8589934592),
        ("0", False, 0),
        ("9223372036854771712", True, None),
        ("-1", True, None),
        ("2147483648", True, 2147483648),
    ],
)
def test_parse_limit(raw: str, v1: bool, expected: int | None) -> None:
    assert cgroups.parse_limit(raw, v1) == expected


def test_parse_cpu_max_and_ranges() -> None:
    assert cgroups.parse_cpu_max("200000 100000") == (200000, 100000)
    assert cgroups.parse_cpu_max("max 100000") == (None, 100000)
    assert cgroups.parse_ranges("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert cgroups.parse_keyed("max 3\n") == {"max": 3}


def test_parse_meminfo_converts_kb() -> None:
    info = memory.parse_meminfo("MemTotal:       24684084 kB\nHugePages_Total:       0\n")
    assert info == {"MemTotal": 24684084 * 1024, "HugePages_Total": 0}


# -- gatherers on fixture roots ----------------------------------------------------------------
def test_v1_host_copy_is_unlimited_everywhere() -> None:
    out, unknown = gather_at("v1-host")
    assert (out["version"], out["hybrid"], out["path"]) == (1, True, "/session/job")
    mem = out["memory"]
    assert mem["limited"] is False and mem["max_bytes"] is None  # 9223372036854771712 means none
    usage = int((CG / "v1-host/sys/fs/cgroup/memory/session/job/memory.usage_in_bytes").read_text())
    assert mem["current_bytes"] == usage and mem["oom_kill_events"] == 0
    assert out["pids"]["limited"] is False  # process in the root pids cgroup
    assert out["cpu"]["limited"] is False and out["cpu"]["cpuset_count"] == 2
    assert unknown == {}


def test_v1_docker_resolves_mount_root_and_comounted_cpu() -> None:
    out, _ = gather_at("v1-docker")
    mem, pids, cpu = out["memory"], out["pids"], out["cpu"]
    assert mem["max_bytes"] == 2 * GiB and mem["max_source"] == "/sys/fs/cgroup/memory/memory.limit_in_bytes"
    assert mem["swap_max_bytes"] == 2 * GiB  # memsw 4 GiB less memory 2 GiB
    assert mem["oom_kill_events"] == 3 and mem["max_events"] == 1874
    assert mem["working_set_bytes"] == 2061584302 - 20971520  # usage less total_inactive_file
    assert (pids["max"], pids["current"]) == (100, 12)
    assert cpu["quota_cpus"] == 1.5 and cpu["quota_source"] == "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"
    assert cpu["cpuset_count"] == 8


def test_v2_namespaced_container() -> None:
    out, _ = gather_at("v2-docker")
    assert (out["version"], out["path"]) == (2, "/")
    assert out["memory"]["max_bytes"] == 4 * GiB and out["memory"]["swap_max_bytes"] == 0
    assert out["memory"]["oom_kill_events"] == 0
    assert out["pids"]["limited"] is False and out["pids"]["current"] == 7  # pids.max says "max"
    assert out["cpu"]["limited"] is False and out["cpu"]["quota_cpus"] is None


def test_v2_limits_are_the_smallest_over_ancestors() -> None:
    out, _ = gather_at("v2-nested")
    mem = out["memory"]
    assert mem["max_bytes"] == 16 * GiB and mem["max_source"] == "/sys/fs/cgroup/system.slice/memory.max"
    # usage and events are read where the limit is: the slice, not the service
    assert mem["current_bytes"] == 15032385536 and mem["oom_kill_events"] == 2
    assert out["pids"]["max"] == 512 and out["pids"]["max_events"] == 4
    assert out["cpu"]["quota_cpus"] == 0.5


def test_no_cgroup_files_is_unknown_not_a_crash(tmp_path: Path) -> None:
    ctx = GatherContext(root=tmp_path, env={})
    out = cgroups.gather(ctx)
    assert out["version"] is None and out["memory"] is None
    assert "cgroup.version" in ctx.unknowns


def test_memory_gather_from_fixture_root() -> None:
    ctx = GatherContext(root=CG / "k8s-pod", env={})
    out = memory.gather(ctx)
    assert out["total_bytes"] == 256 * GiB and out["swap_total_bytes"] == 0
    assert out["available_bytes"] <= out["total_bytes"]


# -- gatherers on this host --------------------------------------------------------------------
def test_live_memory_matches_psutil() -> None:
    out = memory.gather(GatherContext())
    vm, sw = psutil.virtual_memory(), psutil.swap_memory()
    assert out["total_bytes"] == vm.total
    assert out["swap_total_bytes"] == sw.total
    assert abs(out["available_bytes"] - vm.available) < 256 * 1024**2  # both read at slightly different times


def test_live_cgroup_matches_the_kernel_files() -> None:
    out = cgroups.gather(GatherContext())
    proc = Path("/proc/self/cgroup").read_text()
    v1 = any(
        line.split(":")[1] not in ("",) and not line.split(":")[1].startswith("name=") for line in proc.splitlines()
    )
    assert out["version"] == (1 if v1 else 2)
    mem = out["memory"]
    if mem and mem["limited"] is not None:
        raw = Path(mem["max_source"]).read_text().strip()
        assert mem["max_bytes"] == cgroups.parse_limit(raw, v1=out["version"] == 1)


# -- pure checks -------------------------------------------------------------------------------
def base_facts(**sections: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "meta": {"schema_version": 1},
        "host": {"uid": 1000, "env": {}},
        "memory": {
            "total_bytes": 64 * GiB,
            "available_bytes": 60 * GiB,
            "commit_limit_bytes": 40 * GiB,
            "committed_bytes": 10 * GiB,
        },
        "cgroup": {"version": 2, "memory": {"limited": False}, "pids": {"limited": False}},
        "limits": {
            "rlimits": {"as": {"soft": None, "soft_unlimited": True}, "data": {"soft": None}, "nproc": {"soft": None}},
            "sysctl": {"vm": {"overcommit_memory": 0}},
        },
        "cpu": {"torch_threads_estimate": 8},
    }
    for key, value in sections.items():
        data[key] = value
    return data


def with_(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(data)
    node = out
    parts = path.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return out


def F(data: dict[str, Any]) -> Facts:
    return Facts.from_dict(copy.deepcopy(data))


def test_healthy_facts_raise_no_memory_codes() -> None:
    assert codes(F(base_facts()), prefix="TD20") == {}


def mem_limit(max_bytes: int, working: int, kills: int = 0) -> dict[str, Any]:
    return {
        "limited": True,
        "max_bytes": max_bytes,
        "current_bytes": working,
        "working_set_bytes": working,
        "inactive_file_bytes": 0,
        "oom_kill_events": kills,
        "max_source": "/sys/fs/cgroup/memory.max",
    }


def test_td201_limit_below_host_ram_and_near_miss() -> None:
    hit = codes(F(with_(base_facts(), "cgroup.memory", mem_limit(8 * GiB, GiB))))
    assert "TD201" in hit and "8 GiB" in hit["TD201"].message and "64 GiB" in hit["TD201"].message
    same = codes(F(with_(base_facts(), "cgroup.memory", mem_limit(64 * GiB, GiB))))
    assert "TD201" not in same  # a limit at host RAM changes nothing


@pytest.mark.parametrize("used_gib, expected", [(6, None), (7, "warning"), (7.8, "error")])
def test_td202_near_limit_thresholds(used_gib: float, expected: str | None) -> None:
    hit = codes(F(with_(base_facts(), "cgroup.memory", mem_limit(8 * GiB, int(used_gib * GiB)))))
    assert (hit["TD202"].severity.label if "TD202" in hit else None) == expected


def test_td203_oom_kills_counted() -> None:
    hit = codes(F(with_(base_facts(), "cgroup.memory", mem_limit(8 * GiB, GiB, kills=2))))
    assert "TD203" in hit and "2 process" in hit["TD203"].message
    assert "TD203" not in codes(F(with_(base_facts(), "cgroup.memory", mem_limit(8 * GiB, GiB, kills=0))))


def test_td204_budget_uses_the_cgroup_headroom() -> None:
    facts = F(with_(base_facts(), "cgroup.memory", mem_limit(2 * GiB, int(1.5 * GiB))))
    opts = CheckOptions(num_workers=8, prefetch_factor=2, batch_bytes=64 * 1024**2)  # 1 GiB in flight
    hit = codes(facts, opts)
    assert "TD204" in hit and "512 MiB" in hit["TD204"].message and "1 GiB" in hit["TD204"].message
    assert "TD204" not in codes(facts, CheckOptions(num_workers=2, prefetch_factor=2, batch_bytes=64 * 1024**2))


def test_td205_rlimit_as_and_data() -> None:
    small = with_(base_facts(), "limits.rlimits.as", {"soft": 2 * GiB, "hard": None})
    hit = codes(F(small))["TD205"]
    assert hit.severity.label == "error" and hit.evidence[0].value == 2 * GiB
    large = with_(base_facts(), "limits.rlimits.data", {"soft": 128 * GiB, "hard": None})
    assert codes(F(large))["TD205"].severity.label == "warning"
    assert "TD205" not in codes(F(base_facts()))


def pids(limit: int, current: int, refused: int = 0) -> dict[str, Any]:
    return {
        "limited": True,
        "max": limit,
        "current": current,
        "max_events": refused,
        "max_source": "/sys/fs/cgroup/pids.max",
    }


def test_td206_pids_room_for_processes_and_threads() -> None:
    opts = CheckOptions(num_workers=8, nproc_per_node=2)  # 18 processes; 2 x (8 + 1 + 8) = 34 tasks
    assert codes(F(with_(base_facts(), "cgroup.pids", pids(40, 25))), opts)["TD206"].severity.label == "error"
    assert codes(F(with_(base_facts(), "cgroup.pids", pids(40, 10))), opts)["TD206"].severity.label == "warning"
    assert "TD206" not in codes(F(with_(base_facts(), "cgroup.pids", pids(44, 10))), opts)


def test_td207_pids_refusals() -> None:
    assert "TD207" in codes(F(with_(base_facts(), "cgroup.pids", pids(4096, 10, refused=3))))
    assert "TD207" not in codes(F(with_(base_facts(), "cgroup.pids", pids(4096, 10, refused=0))))


def test_td208_strict_overcommit() -> None:
    strict = with_(base_facts(), "limits.sysctl.vm.overcommit_memory", 2)
    hit = codes(F(strict))["TD208"]
    assert "30 GiB" in hit.message and hit.severity.label == "warning"
    full = with_(strict, "memory.committed_bytes", 40 * GiB - 1024)
    assert codes(F(full))["TD208"].severity.label == "error"
    assert "TD208" not in codes(F(with_(base_facts(), "limits.sysctl.vm.overcommit_memory", 1)))


def test_td209_nproc_rlimit_skips_root() -> None:
    low = with_(base_facts(), "limits.rlimits.nproc", {"soft": 10, "hard": 10})
    assert "TD209" in codes(F(low))
    assert "TD209" not in codes(F(with_(low, "host.uid", 0)))
    assert "TD209" not in codes(F(with_(base_facts(), "limits.rlimits.nproc", {"soft": 4096})))


def test_unknown_facts_yield_nothing() -> None:
    bare = Facts.from_dict({"meta": {"schema_version": 1}, "cgroup": None, "memory": None, "limits": None})
    assert codes(bare, prefix="TD20") == {}


# -- a real limit ------------------------------------------------------------------------------
def test_real_rlimit_as_child_reports_td205() -> None:
    limit = 1 * GiB

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    proc = subprocess.run(
        [sys.executable, "-m", "torchdoctor", "check", "--format", "json", "--no-torch"],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lower,
        cwd=REPO,
    )
    assert proc.returncode == 1, proc.stderr  # an error-level finding
    found = [f for f in json.loads(proc.stdout)["findings"] if f["code"] == "TD205"]
    assert len(found) == 1 and found[0]["severity"] == "error"
    assert {"label": "RLIMIT_AS soft limit", "value": limit, "source": "resource.getrlimit"} in found[0]["evidence"]
    assert "1 GiB" in found[0]["message"]


# -- the Kubernetes snapshot -------------------------------------------------------------------
def test_k8s_snapshot_reports_the_cgroup_codes() -> None:
    doc = run_json("check", "--facts", str(K8S.relative_to(REPO)), cwd=REPO)
    found = {f["code"]: f for f in doc["findings"]}
    assert {"TD201", "TD203", "TD207", "TD251"} <= set(found)
    assert "TD202" not in found and "TD204" not in found  # 1 GiB used of 8 GiB: near-misses
    assert found["TD201"]["evidence"][0]["value"] == "8 GiB"
    more = run_json(
        "check", "--facts", str(K8S.relative_to(REPO)), "--nproc-per-node", "4", "--num-workers", "8", cwd=REPO
    )
    assert {"TD206", "TD250"} <= {f["code"] for f in more["findings"]}


def test_k8s_snapshot_is_what_the_gatherers_read_from_its_root() -> None:
    snap = json.loads(K8S.read_text())
    assert "Constructed machine" in snap["meta"]["provenance"]
    ctx = GatherContext(root=CG / "k8s-pod", env={"KUBERNETES_SERVICE_HOST": "10.96.0.1"})
    assert snap["cgroup"] == cgroups.gather(ctx)
    assert snap["memory"] == memory.gather(ctx)
    assert snap["host"]["container"]["kind"] == "kubernetes"


def test_codes_docs_are_complete() -> None:
    for code in [f"TD20{i}" for i in range(1, 10)]:
        c = lookup(code)
        assert c.family in ("host-oom", "worker-crash") and c.area == "memory"
        assert c.meaning and c.why and c.false_positives and c.fix


def test_cli_codes_page_for_td206() -> None:
    proc = run_cli("codes", "pids-limit-low")
    assert proc.returncode == 0 and "TD206" in proc.stdout and "pids.max" in proc.stdout
