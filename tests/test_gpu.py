"""GPUs (TD301-TD313): the live host (no GPU here), the nvidia-smi parser on real reports, the NVML
path replayed from the same reports, CUDA_VISIBLE_DEVICES, and every check both ways.

Real reports: tests/fixtures/gpu/*.xml (sources in SOURCE.md). Where a test edits a parsed
report to create a condition no public report shows, the edit is written next to it.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchdoctor.checks import run_checks
from torchdoctor.facts import Facts, GatherContext, gather
from torchdoctor.facts.gpu import build_section, read_nvml, resolve_visible
from torchdoctor.facts.nvsmi import COMPUTE_MODES, NvsmiParseError, parse_xml
from torchdoctor.facts.redact import anonymise
from torchdoctor.model import Severity
from torchdoctor.options import CheckOptions
from torchdoctor.registry import all_codes, lookup

from .conftest import FIXTURES, REPO, run_cli

GPU_DIR = FIXTURES / "gpu"
MiB = 1024 * 1024
V100 = "nvsmi-8x-v100s-busy.xml"
A100 = "nvsmi-a100-mig.xml"
GTX = "nvsmi-gtx1050-desktop.xml"
TORCH_CUDA = {
    "installed": True,
    "version": "2.5.1+cu124",
    "cuda": "12.4",
    "cuda_build": True,
    "backends": {"nccl": True},
}


def report(name: str) -> dict[str, Any]:
    return parse_xml((GPU_DIR / name).read_text())


def facts_for(
    report_: dict[str, Any] | None,
    env: dict[str, str] | None = None,
    torch: dict[str, Any] | None = None,
    pid: int = 4242,
    reason: str | None = None,
) -> Facts:
    env = env or {}
    gpu = build_section(copy.deepcopy(report_), "nvidia-smi" if report_ else None, reason, env)
    return Facts.from_dict(
        {
            "meta": {"schema_version": 1},
            "host": {"pid": pid, "env": env},
            "torch": torch if torch is not None else dict(TORCH_CUDA),
            "gpu": gpu,
        }
    )


def hits(facts: Facts, code: str, opts: CheckOptions | None = None) -> list[Any]:
    return [f for f in run_checks(facts, opts, [lookup(code)]) if f.code == code]


# -- live host: no GPU here ------------------------------------------------------------------------


def test_live_host_reports_no_gpu_as_info_never_error() -> None:
    proc = run_cli("check", "--format", "json", "--no-torch", "--fail-on", "error")
    doc = json.loads(proc.stdout)
    gpu_findings = [f for f in doc["findings"] if f["code"].startswith("TD3")]
    assert [f["code"] for f in gpu_findings] == ["TD301"]
    assert gpu_findings[0]["severity"] == "info"
    assert "libnvidia-ml.so.1" in gpu_findings[0]["message"]
    assert not any(f.get("check_error") for f in gpu_findings)


def test_live_gather_reads_nvml_without_torch_or_cuda() -> None:
    code = (
        "import sys, json; from torchdoctor.facts import gather; f = gather(sections=['gpu']); "
        "print(json.dumps({'gpu': f.data['gpu'], 'unknown': f.unknown, 'torch': 'torch' in sys.modules}))"
    )
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert out["torch"] is False
    assert out["gpu"]["available"] is False and out["gpu"]["device_count"] == 0
    assert "not installed" in out["gpu"]["reason"]
    assert "gpu" not in out["unknown"]


def _fake_smi(tmp_path: Path, body: str) -> dict[str, str]:
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(0o755)
    return {"PATH": f"{tmp_path}:/usr/bin:/bin"}


def test_falls_back_to_a_real_nvidia_smi_process_when_nvml_fails(tmp_path: Path) -> None:
    # NVML really fails on this host (no driver); the nvidia-smi on PATH prints a recorded report.
    env = _fake_smi(tmp_path, f"[ \"$1 $2\" = '-q -x' ] || exit 2\ncat '{GPU_DIR / V100}'\n")
    env["CUDA_VISIBLE_DEVICES"] = "GPU-3181eb56,1"
    section = gather(GatherContext(env=env), sections=["gpu"]).data["gpu"]
    assert section["source"] == "nvidia-smi" and section["available"] is True
    assert section["device_count"] == 8 and section["driver_version"] == "460.73.01"
    assert section["visible"]["visible_indices"] == [3, 1]
    assert section["devices"][3]["uuid"] == anonymise("GPU-3181eb56-505c-8214-ba05-c132f68f89b8")
    assert "3181eb56" not in json.dumps(section)


def test_a_failing_nvidia_smi_becomes_the_reason(tmp_path: Path) -> None:
    msg = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running."
    )
    env = _fake_smi(tmp_path, f'echo "{msg}"\nexit 9\n')
    section = gather(GatherContext(env=env), sections=["gpu"]).data["gpu"]
    assert section["available"] is False
    assert "couldn't communicate with the NVIDIA driver" in section["reason"]


def test_a_hanging_nvidia_smi_is_bounded(tmp_path: Path) -> None:
    env = _fake_smi(tmp_path, "exec sleep 30\n")
    section = gather(GatherContext(env=env, command_timeout=0.5), sections=["gpu"]).data["gpu"]
    assert section["available"] is False and "timed out after 0.5 s" in section["reason"]


# -- the nvidia-smi parser on real reports ------------------------------------------------------------


def test_parses_the_busy_8_gpu_server() -> None:
    r = report(V100)
    assert (r["driver_version"], r["cuda_driver_version"], r["attached_gpus"]) == ("460.73.01", "11.2", 8)
    assert [d["pci_bus_id"][-7:] for d in r["devices"]] == [
        "00:0D.0",
        "00:0E.0",
        "00:0F.0",
        "00:10.0",
        "00:11.0",
        "00:12.0",
        "00:13.0",
        "00:14.0",
    ]
    d3 = r["devices"][3]
    assert d3["index"] == 3 and d3["minor_number"] == 3 and d3["name"] == "Tesla V100S-PCIE-32GB"
    assert d3["memory"] == {"total_bytes": 32510 * MiB, "used_bytes": 32099 * MiB, "free_bytes": 411 * MiB}
    assert d3["utilization"] == {"gpu_percent": 23, "memory_percent": 12}
    assert (d3["compute_mode"], d3["persistence_mode"]) == ("Default", False)
    assert d3["ecc"] == {"enabled": True, "volatile_uncorrected": 0}
    assert d3["processes"] == [
        {
            "pid": 37305,
            "type": "C",
            "name": "python",
            "used_memory_bytes": 32093 * MiB,
            "gpu_instance_id": None,
            "compute_instance_id": None,
        }
    ]
    assert d3["mig"] == {"current": None, "pending": None, "devices": []}


def test_parses_an_a100_in_mig_mode_with_the_v12_layout() -> None:
    r = report(A100)
    assert (r["driver_version"], r["cuda_driver_version"], r["attached_gpus"], len(r["devices"])) == (
        "535.54.03",
        "12.2",
        4,
        1,
    )
    dev = r["devices"][0]
    assert dev["utilization"] == {"gpu_percent": None, "memory_percent": None}  # N/A under MIG
    assert dev["mig"]["current"] == "Enabled"
    assert [(m["gpu_instance_id"], m["memory_total_bytes"]) for m in dev["mig"]["devices"]] == [
        (g, 19968 * MiB) for g in (3, 4, 5, 6)
    ]
    assert dev["ecc"] == {"enabled": True, "volatile_uncorrected": 0}  # sram_/dram_uncorrectable
    assert dev["processes"] == []


def test_parses_a_desktop_report_without_xml_declaration() -> None:
    dev = report(GTX)["devices"][0]
    assert [(p["pid"], p["type"], p["used_memory_bytes"]) for p in dev["processes"]] == [
        (1200, "G", 61 * MiB),
        (30091, "G", MiB),
    ]
    assert dev["ecc"] == {"enabled": None, "volatile_uncorrected": None}
    assert dev["persistence_mode"] is True


@pytest.mark.parametrize("text", ["", "no GPU here", "<not-xml", "<other/>", "<nvidia_smi_log><gpu></nvidia_smi_log>"])
def test_parser_rejects_what_is_not_a_report(text: str) -> None:
    with pytest.raises(NvsmiParseError):
        parse_xml(text)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("<>/ a=\"'gpu_nvidia_smi_log0123456789%MiB\n")), max_size=200))
def test_parser_raises_only_its_own_error(text: str) -> None:
    try:
        out = parse_xml(text)
    except NvsmiParseError:
        return
    assert isinstance(out["devices"], list)


# -- the NVML path, replayed from the same recorded reports -------------------------------------------


class NotSupported(Exception):
    pass


class RecordedNVML:
    """Answers pynvml's calls from a parsed nvidia-smi report (recorded data, NVML's call shapes)."""

    def __init__(self, rep: dict[str, Any], fail_at: str | None = None) -> None:
        self.rep, self.fail_at, self.shutdowns = rep, fail_at, 0
        self.modes = {v: k for k, v in COMPUTE_MODES.items()}

    def _dev(self, h: Any) -> dict[str, Any]:
        return self.rep["devices"][h]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.rep["driver_version"]

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        major, minor = self.rep["cuda_driver_version"].split(".")
        return int(major) * 1000 + int(minor) * 10

    def nvmlDeviceGetCount(self) -> int:
        if self.fail_at == "count":
            raise RuntimeError("GPU is lost")
        return len(self.rep["devices"])

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self._dev(h)["name"].encode()

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self._dev(h)["uuid"]

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=self._dev(h)["pci_bus_id"].encode())

    def nvmlDeviceGetMinorNumber(self, h: int) -> int:
        return self._dev(h)["minor_number"]

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        m = self._dev(h)["memory"]
        return SimpleNamespace(total=m["total_bytes"], used=m["used_bytes"], free=m["free_bytes"])

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        u = self._dev(h)["utilization"]
        if u["gpu_percent"] is None:
            raise NotSupported()
        return SimpleNamespace(gpu=u["gpu_percent"], memory=u["memory_percent"])

    def nvmlDeviceGetComputeMode(self, h: int) -> int:
        return self.modes[self._dev(h)["compute_mode"]]

    def nvmlDeviceGetPersistenceMode(self, h: int) -> int:
        return int(self._dev(h)["persistence_mode"])

    def nvmlDeviceGetCurrentEccMode(self, h: int) -> int:
        if self._dev(h)["ecc"]["enabled"] is None:
            raise NotSupported()
        return int(self._dev(h)["ecc"]["enabled"])

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        assert (kind, counter) == (1, 0)  # uncorrected, volatile
        return self._dev(h)["ecc"]["volatile_uncorrected"]

    def _procs(self, h: int, kind: str) -> list[Any]:
        return [
            SimpleNamespace(
                pid=p["pid"],
                usedGpuMemory=p["used_memory_bytes"],
                gpuInstanceId=0xFFFFFFFF,
                computeInstanceId=0xFFFFFFFF,
            )
            for p in self._dev(h)["processes"]
            if kind in p["type"]
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return self._procs(h, "C")

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[Any]:
        return self._procs(h, "G")

    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        names = {"Enabled": 1, "Disabled": 0}
        mig = self._dev(h)["mig"]
        if mig["current"] is None:
            raise NotSupported()
        return [names[mig["current"]], names[mig["pending"]]]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:
        return len(self._dev(h)["mig"]["devices"])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, i: int) -> tuple[int, int]:
        return (h, i)

    def nvmlDeviceGetGpuInstanceId(self, m: tuple[int, int]) -> int:
        return self._dev(m[0])["mig"]["devices"][m[1]]["gpu_instance_id"]

    def nvmlDeviceGetComputeInstanceId(self, m: tuple[int, int]) -> int:
        return self._dev(m[0])["mig"]["devices"][m[1]]["compute_instance_id"]


def _without_names(rep: dict[str, Any]) -> dict[str, Any]:
    rep = copy.deepcopy(rep)
    for dev in rep["devices"]:
        for p in dev["processes"]:
            p["name"] = None  # NVML gives no process names; gather adds them with psutil
        for m in dev["mig"]["devices"]:
            m["memory_total_bytes"] = m["memory_used_bytes"] = None  # the replay has no MIG memory calls
    return rep


@pytest.mark.parametrize("name", [V100, A100, GTX])
def test_nvml_path_gives_the_same_schema_and_values_as_the_parser(name: str) -> None:
    rep = report(name)
    nvml = RecordedNVML(rep)
    got = read_nvml(nvml)
    assert nvml.shutdowns == 1
    want = _without_names(rep)
    for dev in got["devices"]:
        for m in dev["mig"]["devices"]:
            m["memory_total_bytes"] = m["memory_used_bytes"] = None
    assert got == {**want, "attached_gpus": len(rep["devices"])}


def test_nvml_is_shut_down_even_when_a_query_fails() -> None:
    nvml = RecordedNVML(report(V100), fail_at="count")
    with pytest.raises(RuntimeError):
        read_nvml(nvml)
    assert nvml.shutdowns == 1


def test_gather_uses_nvml_when_it_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", RecordedNVML(report(V100)))
    section = gather(GatherContext(env={"CUDA_VISIBLE_DEVICES": "4,5"}), sections=["gpu"]).data["gpu"]
    assert section["source"] == "nvml" and section["cuda_driver_version"] == "11.2"
    assert section["visible"]["visible_indices"] == [4, 5]
    assert all(d["uuid"].startswith("anon-") for d in section["devices"])


# -- CUDA_VISIBLE_DEVICES ----------------------------------------------------------------------------

DEVICES = report(V100)["devices"]


@pytest.mark.parametrize(
    ("value", "visible", "invalid", "ignored", "hides_all"),
    [
        (None, list(range(8)), [], [], False),
        ("0,2,-1,1", [0, 2], ["-1"], ["1"], False),  # the example in CUDA's documentation
        ("2,1", [2, 1], [], [], False),
        ("", [], [], [], True),
        ("-1", [], ["-1"], [], True),
        ("NoDevFiles", [], ["NoDevFiles"], [], True),
        ("0,8,1", [0], ["8"], ["1"], False),
        (" 3 , 7 ", [3, 7], [], [], False),
        ("GPU-76098dc1-d3bc-9a1b-7ea6-f7b48837829e,GPU-1d95", [0, 7], [], [], False),
        ("GPU-3,0", [], ["GPU-3"], ["0"], False),  # two UUIDs start with GPU-3: ambiguous
        ("GPU-ffffffff", [], ["GPU-ffffffff"], [], False),
        ("1,1", [1], [], [], False),
        ("1,²", [1], ["²"], [], False),  # a Unicode digit is not an index
    ],
)
def test_visible_devices_follow_cuda_rules(value, visible, invalid, ignored, hides_all) -> None:
    out = resolve_visible(value, DEVICES)
    assert (out["visible_indices"], out["invalid"], out["ignored"], out["hides_all"]) == (
        visible,
        invalid,
        ignored,
        hides_all,
    )
    assert out["count"] == len(visible)


def test_mig_identifiers() -> None:
    devs = report(A100)["devices"]
    uuid = "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert resolve_visible(f"MIG-{uuid}/4/0", devs)["visible_indices"] == [0]
    assert resolve_visible(f"MIG-{uuid}/9/0", devs)["invalid"] == [f"MIG-{uuid}/9/0"]
    unknown = resolve_visible("MIG-2a5b2a2d-2f48-5b3e-9bbd-b0e2c3d2a4d1", devs)  # XML has no MIG UUIDs to check
    assert (unknown["invalid"], unknown["count"]) == ([], 1)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.none(),
        st.text(max_size=60),
        st.lists(
            st.sampled_from(
                [
                    "0",
                    "7",
                    "8",
                    "-1",
                    "",
                    " 2",
                    "GPU-",
                    "GPU-3",
                    "GPU-2aa8",
                    "MIG-x",
                    "MIG-GPU-39c3a168/1/0",
                    "NoDevFiles",
                    "x",
                    "01",
                    "²",
                    "٣",
                ]
            ),
            max_size=6,
        ).map(",".join),
    )
)
def test_visible_devices_never_raise(value: str | None) -> None:
    out = resolve_visible(value, DEVICES)
    assert set(out["visible_indices"]) <= set(range(8))
    assert out["count"] >= len(out["visible_indices"])
    json.dumps(out)


# -- the checks, both ways -----------------------------------------------------------------------------


def test_td301_no_gpu_is_info_and_absent_with_gpus() -> None:
    found = hits(facts_for(None, reason="the NVIDIA kernel driver is not loaded"), "TD301")
    assert found[0].severity is Severity.INFO and "kernel driver is not loaded" in found[0].message
    assert hits(facts_for(report(V100)), "TD301") == []


def test_td301_when_gpu_facts_timed_out() -> None:
    facts = Facts.from_dict({"meta": {"schema_version": 1}, "gpu": None, "unknown": {"gpu": "timed out after 8 s"}})
    assert "timed out after 8 s" in hits(facts, "TD301")[0].message


def test_td302_cpu_torch_on_gpu_machine() -> None:
    cpu_torch = {"installed": True, "version": "2.13.0+cpu", "cuda": None, "cuda_build": False}
    found = hits(facts_for(report(V100), torch=cpu_torch), "TD302")
    assert found[0].severity is Severity.WARNING and "8 NVIDIA GPU(s)" in found[0].message
    assert hits(facts_for(report(V100)), "TD302") == []  # CUDA build
    assert hits(facts_for(None, reason="no driver", torch=cpu_torch), "TD302") == []  # no GPU


def _edited(name: str, **changes: Any) -> dict[str, Any]:
    rep = report(name)
    for index, fields in changes.items():
        rep["devices"][int(index[1:])].update(fields)
    return rep


def test_td303_exclusive_process_gpu_held_by_another_process() -> None:
    # Edit: GPU 0 of the real V100S report set to Exclusive_Process (its python pid 37305 stays).
    rep = _edited(V100, d0={"compute_mode": "Exclusive_Process"})
    only = hits(facts_for(rep, {"CUDA_VISIBLE_DEVICES": "0"}), "TD303")
    assert only[0].severity is Severity.ERROR and "1 of 1" in only[0].message
    assert "first CUDA call fails" in only[0].message and "pid 37305" in only[0].evidence[0].value
    assert "using one of them" in hits(facts_for(rep), "TD303")[0].message  # 1 of 8
    assert hits(facts_for(rep, {"CUDA_VISIBLE_DEVICES": "1,2"}), "TD303") == []  # GPU 0 hidden
    assert hits(facts_for(rep, pid=37305), "TD303") == []  # the holder is this process
    free = _edited(V100, d0={"compute_mode": "Exclusive_Process", "processes": []})
    assert hits(facts_for(free), "TD303") == []


def test_td304_prohibited() -> None:
    rep = _edited(V100, d2={"compute_mode": "Prohibited"})  # edit: GPU 2 set to Prohibited
    assert "GPU 2" in hits(facts_for(rep), "TD304")[0].message
    assert hits(facts_for(rep, {"CUDA_VISIBLE_DEVICES": "0,1"}), "TD304") == []
    assert hits(facts_for(report(V100)), "TD304") == []


def test_td305_memory_held_by_others_real_report() -> None:
    found = hits(facts_for(report(V100), {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}), "TD305")
    assert found[0].severity is Severity.ERROR and "4 of 4" in found[0].message
    assert "821 MiB free of 31.7 GiB" in found[0].message
    assert hits(facts_for(report(GTX)), "TD305") == []  # 3974 MiB of 4096 MiB free
    assert hits(facts_for(report(V100), {"CUDA_VISIBLE_DEVICES": "0"}, pid=37305), "TD305") == []  # its own memory


def test_td305_warning_band() -> None:
    # Edit: GPU 7 given 40 % free instead of 9 %.
    total = 32510 * MiB
    rep = _edited(
        V100, d7={"memory": {"total_bytes": total, "used_bytes": total * 6 // 10, "free_bytes": total * 4 // 10}}
    )
    assert hits(facts_for(rep, {"CUDA_VISIBLE_DEVICES": "7"}), "TD305")[0].severity is Severity.WARNING
    rep = _edited(
        V100, d7={"memory": {"total_bytes": total, "used_bytes": total * 4 // 10, "free_bytes": total * 6 // 10}}
    )
    assert hits(facts_for(rep, {"CUDA_VISIBLE_DEVICES": "7"}), "TD305") == []


def test_td306_busy_with_other_processes() -> None:
    found = hits(facts_for(report(V100), {"CUDA_VISIBLE_DEVICES": "0,3"}), "TD306")
    assert found[0].severity is Severity.INFO and "GPU 0 (Tesla V100S-PCIE-32GB) at 97%" in found[0].message
    assert "GPU 3" not in found[0].message  # 23 %
    assert hits(facts_for(report(V100), pid=37305), "TD306") == []  # own work
    assert hits(facts_for(report(GTX)), "TD306") == []  # 7 %, graphics only


def test_td307_unknown_device_in_cuda_visible_devices() -> None:
    found = hits(facts_for(report(V100), {"CUDA_VISIBLE_DEVICES": "0,9,1"}), "TD307")
    assert found[0].severity is Severity.ERROR
    assert "names 9" in found[0].message and "ignores 1" in found[0].message
    assert "shows the process 1 GPU(s)" in found[0].message
    assert hits(facts_for(report(V100), {"CUDA_VISIBLE_DEVICES": "0,7"}), "TD307") == []
    assert hits(facts_for(report(V100), {"CUDA_VISIBLE_DEVICES": "-1"}), "TD307") == []  # TD308's case


def test_td308_all_gpus_hidden() -> None:
    for value in ("", "-1", "NoDevFiles"):
        assert hits(facts_for(report(V100), {"CUDA_VISIBLE_DEVICES": value}), "TD308")[0].severity is Severity.WARNING
    assert hits(facts_for(report(V100)), "TD308") == []
    assert hits(facts_for(None, {"CUDA_VISIBLE_DEVICES": ""}, reason="no driver"), "TD308") == []


def test_td309_local_rank_beyond_visible_gpus() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "LOCAL_RANK": "4"}
    found = hits(facts_for(report(V100), env), "TD309")
    assert found[0].severity is Severity.ERROR and "invalid device ordinal" in found[0].message
    assert hits(facts_for(report(V100), {**env, "LOCAL_RANK": "3"}), "TD309") == []
    assert hits(facts_for(report(V100), {**env, "LOCAL_RANK": "--4"}), "TD309") == []  # not a number: no judgement
    slurm = {"CUDA_VISIBLE_DEVICES": "5", "SLURM_LOCALID": "2", "SLURM_GPUS_PER_TASK": "1"}
    assert hits(facts_for(report(V100), slurm), "TD309")[0].severity is Severity.WARNING


def test_td310_more_ranks_than_gpus() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "LOCAL_WORLD_SIZE": "8"}
    found = hits(facts_for(report(V100), env), "TD310")
    assert (
        found[0].family == "nccl"
        and found[0].severity is Severity.ERROR
        and "Duplicate GPU detected" in found[0].message
    )
    no_nccl = dict(TORCH_CUDA, backends={"nccl": False})
    assert hits(facts_for(report(V100), env, torch=no_nccl), "TD310")[0].severity is Severity.WARNING
    assert hits(facts_for(report(V100), {**env, "LOCAL_WORLD_SIZE": "4"}), "TD310") == []
    slurm = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_TASKS_PER_NODE": "2,8(x2)", "SLURM_NODEID": "2"}
    assert "8 processes per node (SLURM_TASKS_PER_NODE)" in hits(facts_for(report(V100), slurm), "TD310")[0].message
    assert hits(facts_for(report(V100), env), "TD310", CheckOptions(nproc_per_node=4)) == []


def test_td311_driver_older_than_torch_cuda() -> None:
    major = hits(facts_for(report(V100)), "TD311")  # torch CUDA 12.4, driver CUDA 11.2
    assert major[0].severity is Severity.ERROR and "found version 11020" in major[0].message
    minor = hits(facts_for(report(A100)), "TD311")  # torch CUDA 12.4, driver CUDA 12.2
    assert minor[0].severity is Severity.WARNING and "minor-version compatibility" in minor[0].message
    assert hits(facts_for(report(A100), torch=dict(TORCH_CUDA, cuda="12.2")), "TD311") == []
    assert hits(facts_for(report(A100), torch=dict(TORCH_CUDA, cuda="11.8")), "TD311") == []


def test_td312_indices_on_mixed_gpus() -> None:
    # Edit: GPU 1 of the V100S report renamed to another model, making the machine mixed.
    rep = _edited(V100, d1={"name": "NVIDIA GeForce GTX 1050"})
    assert hits(facts_for(rep, {"CUDA_VISIBLE_DEVICES": "1"}), "TD312")[0].severity is Severity.WARNING
    assert hits(facts_for(rep, {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}), "TD312") == []
    assert hits(facts_for(rep, {"CUDA_VISIBLE_DEVICES": "GPU-bbf7a241"}), "TD312") == []
    assert hits(facts_for(report(V100), {"CUDA_VISIBLE_DEVICES": "1"}), "TD312") == []


def test_td313_uncorrectable_ecc() -> None:
    rep = _edited(V100, d6={"ecc": {"enabled": True, "volatile_uncorrected": 2}})  # edit: 2 errors on GPU 6
    assert "GPU 6 (Tesla V100S-PCIE-32GB): 2" in hits(facts_for(rep), "TD313")[0].message
    assert hits(facts_for(rep, {"CUDA_VISIBLE_DEVICES": "0"}), "TD313") == []
    assert hits(facts_for(report(V100)), "TD313") == []


# -- the recorded Slurm node and the catalogue -----------------------------------------------------------

SLURM = FIXTURES / "facts" / "slurm-4gpu-node.json"


def test_slurm_snapshot_gpu_section_is_the_parser_output_of_the_real_report() -> None:
    snap = json.loads(SLURM.read_text())
    rebuilt = build_section(report(V100), "nvidia-smi", None, snap["host"]["env"])
    assert snap["gpu"] == json.loads(json.dumps(rebuilt))
    assert snap["host"]["env"]["SLURM_PROCID"] == "0" and "nvsmi-8x-v100s-busy.xml" in snap["meta"]["provenance"]


def test_slurm_snapshot_check_reports_the_full_gpus() -> None:
    proc = run_cli("check", "--facts", str(SLURM.relative_to(REPO)), "--format", "json", cwd=REPO)
    assert proc.returncode == 1, proc.stderr
    by_code = {f["code"]: f for f in json.loads(proc.stdout)["findings"] if f["code"].startswith("TD3")}
    assert by_code["TD305"]["severity"] == "error" and "4 of 4 visible GPU(s)" in by_code["TD305"]["message"]
    assert {"TD303", "TD307", "TD308", "TD309", "TD310"}.isdisjoint(by_code)


def test_gpu_codes_are_in_range_and_related_codes_exist() -> None:
    codes = {c.code: c for c in all_codes()}
    gpu = [
        c for c in codes.values() if c.area == "gpu" and c.check is not None
    ]  # preflight codes; log codes are TD350+
    assert len(gpu) >= 10
    for c in gpu:
        assert 301 <= int(c.code[2:]) <= 349
        assert c.family in ("gpu-unavailable", "cuda-oom", "nccl")
        assert c.related and all(r in codes for r in c.related), c.code


def test_uuids_stay_when_asked_and_the_environment_is_left_alone(tmp_path: Path) -> None:
    env = _fake_smi(tmp_path, f"cat '{GPU_DIR / GTX}'\n")
    before = dict(os.environ)
    section = gather(GatherContext(env=env, show_uuids=True), sections=["gpu"]).data["gpu"]
    assert section["devices"][0]["uuid"] == "GPU-06e04616-0ed5-4069-5ebc-345349a0d4f3"
    assert section["uuids_anonymised"] is False
    assert dict(os.environ) == before
