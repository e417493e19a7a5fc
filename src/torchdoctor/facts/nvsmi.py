"""``nvidia-smi -q -x`` output parsed into the same device records that NVML gives.

Used when NVML (nvidia-ml-py) is not importable but ``nvidia-smi`` is on PATH, and to turn a
recorded XML report into a replayable facts snapshot. Pure functions: no I/O here.

Every field that the XML leaves out, or reports as ``N/A``, becomes ``None``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

MiB = 1024 * 1024
_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")

#: NVML's nvmlComputeMode_t values and the names nvidia-smi prints for them.
COMPUTE_MODES: dict[int, str] = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}


class NvsmiParseError(ValueError):
    """The text is not an ``nvidia-smi -q -x`` report."""


def _text(node: ET.Element | None, path: str) -> str | None:
    if node is None:
        return None
    found = node.find(path)
    if found is None or found.text is None:
        return None
    value = found.text.strip()
    return None if value in ("", "N/A", "[N/A]", "Not Supported", "[Not Supported]", "None") else value


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    m = _NUMBER.match(text)
    return float(m.group(1)) if m else None


def _int(text: str | None) -> int | None:
    n = _number(text)
    return None if n is None else int(n)


def _mib(text: str | None) -> int | None:
    """``"32510 MiB"`` → bytes."""
    n = _number(text)
    return None if n is None else int(n * MiB)


def _enabled(text: str | None) -> bool | None:
    if text is None:
        return None
    return text.strip().lower() in ("enabled", "on", "yes", "1")


def _memory(node: ET.Element | None) -> dict[str, int | None]:
    return {
        "total_bytes": _mib(_text(node, "total")),
        "used_bytes": _mib(_text(node, "used")),
        "free_bytes": _mib(_text(node, "free")),
    }


def _processes(gpu: ET.Element) -> list[dict[str, Any]]:
    out = []
    for proc in gpu.findall("processes/process_info"):
        pid = _int(_text(proc, "pid"))
        if pid is None:
            continue
        out.append(
            {
                "pid": pid,
                "type": _text(proc, "type"),
                "name": _text(proc, "process_name"),
                "used_memory_bytes": _mib(_text(proc, "used_memory")),
                "gpu_instance_id": _int(_text(proc, "gpu_instance_id")),
                "compute_instance_id": _int(_text(proc, "compute_instance_id")),
            }
        )
    return out


def _volatile_uncorrected(gpu: ET.Element) -> int | None:
    """Uncorrectable ECC errors since the driver loaded, across both XML layouts.

    Older reports (nvsmi_device_v11 and before) count them under ``volatile/double_bit/total``,
    newer ones (v12) under ``volatile/{sram,dram}_uncorrectable``.
    """
    volatile = gpu.find("ecc_errors/volatile")
    if volatile is None:
        return None
    total = _int(_text(volatile, "double_bit/total"))
    if total is not None:
        return total
    parts = [_int(_text(volatile, name)) for name in ("sram_uncorrectable", "dram_uncorrectable")]
    known = [p for p in parts if p is not None]
    return sum(known) if known else None


def _mig(gpu: ET.Element) -> dict[str, Any]:
    devices = []
    for dev in gpu.findall("mig_devices/mig_device"):
        mem = _memory(dev.find("fb_memory_usage"))
        devices.append(
            {
                "index": _int(_text(dev, "index")),
                "uuid": None,  # nvidia-smi -q -x does not print MIG device UUIDs; NVML does
                "gpu_instance_id": _int(_text(dev, "gpu_instance_id")),
                "compute_instance_id": _int(_text(dev, "compute_instance_id")),
                "memory_total_bytes": mem["total_bytes"],
                "memory_used_bytes": mem["used_bytes"],
            }
        )
    return {
        "current": _text(gpu, "mig_mode/current_mig"),
        "pending": _text(gpu, "mig_mode/pending_mig"),
        "devices": devices,
    }


def parse_device(gpu: ET.Element, index: int) -> dict[str, Any]:
    """One ``<gpu>`` element as a device record (the schema of :func:`torchdoctor.facts.gpu.gather`)."""
    pci = _text(gpu, "pci/pci_bus_id") or gpu.get("id")
    util_gpu = _number(_text(gpu, "utilization/gpu_util"))
    util_mem = _number(_text(gpu, "utilization/memory_util"))
    return {
        "index": index,
        "name": _text(gpu, "product_name"),
        "uuid": _text(gpu, "uuid"),
        "pci_bus_id": pci,
        "minor_number": _int(_text(gpu, "minor_number")),
        "memory": _memory(gpu.find("fb_memory_usage")),
        "utilization": {
            "gpu_percent": None if util_gpu is None else int(round(util_gpu)),
            "memory_percent": None if util_mem is None else int(round(util_mem)),
        },
        "compute_mode": _text(gpu, "compute_mode"),
        "persistence_mode": _enabled(_text(gpu, "persistence_mode")),
        "mig": _mig(gpu),
        "ecc": {
            "enabled": _enabled(_text(gpu, "ecc_mode/current_ecc")),
            "volatile_uncorrected": _volatile_uncorrected(gpu),
        },
        "processes": _processes(gpu),
    }


def parse_xml(text: str) -> dict[str, Any]:
    """The whole report: driver and CUDA versions, and one record per ``<gpu>`` in report order.

    nvidia-smi lists GPUs in PCI bus order, which is NVML's index order.
    """
    start = text.find("<")
    if start < 0:
        raise NvsmiParseError("no XML in nvidia-smi output")
    # The DOCTYPE names an external DTD that is never fetched; ElementTree ignores it.
    try:
        root = ET.fromstring(text[start:])
    except ET.ParseError as exc:
        raise NvsmiParseError(f"nvidia-smi output is not valid XML: {exc}") from None
    if root.tag != "nvidia_smi_log":
        raise NvsmiParseError(f"expected <nvidia_smi_log>, found <{root.tag}>")
    devices = [parse_device(gpu, i) for i, gpu in enumerate(root.findall("gpu"))]
    attached = _int(_text(root, "attached_gpus"))
    return {
        "driver_version": _text(root, "driver_version"),
        "cuda_driver_version": _text(root, "cuda_version"),
        "attached_gpus": attached if attached is not None else len(devices),
        "devices": devices,
    }


__all__ = ["COMPUTE_MODES", "NvsmiParseError", "parse_device", "parse_xml"]
