"""GPUs: what NVML (or ``nvidia-smi -q -x``) reports, and which devices CUDA_VISIBLE_DEVICES exposes.

NVML never creates a CUDA context, so reading it leaves the process fit to fork and leaves the
GPUs' compute-mode locks alone. torch is never imported here. ``nvmlShutdown`` always runs.
A wedged driver can make NVML hang: this runs in the facts gatherer's thread, whose section
timeout bounds it (the section then becomes unknown with the reason).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from typing import Any

from .context import GatherContext
from .nvsmi import COMPUTE_MODES, NvsmiParseError, parse_xml
from .redact import anonymise

#: Values of CUDA_VISIBLE_DEVICES that hide every GPU on purpose ("NoDevFiles": Slurm, job without GPUs).
HIDE_ALL = ("", "-1", "NoDevFiles")

_NVML_REASONS = {
    "NVMLError_LibraryNotFound": "the NVIDIA driver library libnvidia-ml.so.1 is not installed (no NVIDIA driver on this "
    "host, or a container started without GPU support)",
    "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded",
    "NVMLError_NoPermission": "no permission to open the NVIDIA device files (/dev/nvidia*)",
    "NVMLError_LibRmVersionMismatch": "the NVIDIA driver library and the loaded kernel module have different versions "
    "(driver upgraded without a reboot?)",
}


# -- CUDA_VISIBLE_DEVICES ---------------------------------------------------------------------


def _match_uuid(text: str, devices: list[dict[str, Any]]) -> tuple[int | None, str]:
    """Physical index of the only GPU whose UUID starts with ``text`` (CUDA accepts unique prefixes)."""
    hits = [d["index"] for d in devices if d.get("uuid") and str(d["uuid"]).lower().startswith(text.lower())]
    if len(hits) == 1:
        return hits[0], "ok"
    return None, "ambiguous" if hits else "unknown"


def _match_mig(text: str, devices: list[dict[str, Any]]) -> tuple[int | None, bool | None]:
    """A MIG identifier: ``MIG-<uuid>`` (driver R470+) or ``MIG-GPU-<uuid>/<gi>/<ci>`` (older)."""
    body = text[4:]
    if body.upper().startswith("GPU-"):
        parent, _, rest = body.partition("/")
        index, how = _match_uuid(parent, devices)
        if index is None:
            return None, False if how == "unknown" and devices else None
        parts = rest.split("/")
        migs = devices[index].get("mig", {}).get("devices") or []
        if len(parts) == 2 and all(p.isdigit() for p in parts) and migs:
            gi, ci = int(parts[0]), int(parts[1])
            found = any(m.get("gpu_instance_id") == gi and m.get("compute_instance_id") == ci for m in migs)
            return index, found
        return index, None
    for dev in devices:
        for mig in dev.get("mig", {}).get("devices") or []:
            if mig.get("uuid") and str(mig["uuid"]).lower() == text.lower():
                return dev["index"], True
    known_uuids = any(m.get("uuid") for d in devices for m in d.get("mig", {}).get("devices") or [])
    return None, False if known_uuids else None


def _classify(text: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    entry: dict[str, Any] = {"text": text, "kind": "invalid", "physical_index": None, "valid": False}
    if text.isascii() and text.isdigit():
        number = int(text)
        ok = number < len(devices)
        entry.update(kind="index", physical_index=number if ok else None, valid=ok)
    elif text.upper().startswith("GPU-") and len(text) > 4:
        found, how = _match_uuid(text, devices)
        entry.update(kind="uuid", physical_index=found, valid=found is not None)
        if how == "ambiguous":
            entry["problem"] = "prefix matches several GPUs"
    elif text.upper().startswith("MIG-") and len(text) > 4:
        parent, valid = _match_mig(text, devices)
        entry.update(kind="mig", physical_index=parent, valid=valid)
    return entry


def resolve_visible(
    value: str | None, devices: list[dict[str, Any]], device_order: str | None = None
) -> dict[str, Any]:
    """What CUDA will enumerate for a CUDA_VISIBLE_DEVICES value, given NVML's devices (real UUIDs).

    CUDA's rules: entries are indices, UUIDs (or unique UUID prefixes) or MIG identifiers, in the
    order given; enumeration stops at the first invalid entry; an empty value hides every GPU.
    Never raises, whatever the value.
    """
    out: dict[str, Any] = {
        "env_set": value is not None,
        "value": value,
        "entries": [],
        "hides_all": False,
        "visible_indices": [d["index"] for d in devices],
        "count": len(devices),
        "invalid": [],
        "ignored": [],
        "duplicates": [],
        "device_order": device_order,
    }
    if value is None:
        return out
    stripped = value.strip()
    out["hides_all"] = stripped in HIDE_ALL
    texts = [t.strip() for t in stripped.split(",")] if stripped else []
    visible: list[int] = []
    stopped = False
    unknown_mig = 0
    for text in texts:
        entry = _classify(text, devices)
        out["entries"].append(entry)
        if stopped:
            out["ignored"].append(text)
            continue
        if entry["valid"] is False:
            out["invalid"].append(text)
            stopped = True
            continue
        index = entry["physical_index"]
        if index is None:  # a MIG id NVML could not resolve: assume CUDA accepts it
            unknown_mig += 1
        elif index in visible and entry["kind"] != "mig":
            out["duplicates"].append(text)
        else:
            visible.append(index)
    out["visible_indices"] = visible
    out["count"] = len(visible) + unknown_mig
    return out


def anonymise_visible(visible: dict[str, Any]) -> dict[str, Any]:
    """The same record with UUIDs in CUDA_VISIBLE_DEVICES replaced by stable stand-ins."""

    def hide(text: str) -> str:
        upper = text.upper()
        return anonymise(text) if upper.startswith(("GPU-", "MIG-")) else text

    out = dict(visible)
    out["entries"] = [dict(e, text=hide(e["text"])) for e in visible["entries"]]
    for key in ("invalid", "ignored", "duplicates"):
        out[key] = [hide(t) for t in visible[key]]
    if visible.get("value"):
        out["value"] = ",".join(hide(t.strip()) for t in str(visible["value"]).split(","))
    return out


# -- NVML ---------------------------------------------------------------------------------------


def _decode(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _call(nvml: Any, name: str, *args: Any) -> Any:
    """One NVML query; ``None`` when this GPU or driver does not support it."""
    try:
        return _decode(getattr(nvml, name)(*args))
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported & co.: the field is unknown
        return None


def _nvml_processes(nvml: Any, handle: Any) -> list[dict[str, Any]]:
    by_pid: dict[int, dict[str, Any]] = {}
    for kind, fn in (("C", "nvmlDeviceGetComputeRunningProcesses"), ("G", "nvmlDeviceGetGraphicsRunningProcesses")):
        for proc in _call(nvml, fn, handle) or []:
            used = getattr(proc, "usedGpuMemory", None)
            rec = by_pid.setdefault(
                int(proc.pid),
                {
                    "pid": int(proc.pid),
                    "type": kind,
                    "name": None,
                    "used_memory_bytes": int(used) if isinstance(used, int) else None,
                    "gpu_instance_id": None,
                    "compute_instance_id": None,
                },
            )
            if rec["type"] != kind:
                rec["type"] = "C+G"
            gi = getattr(proc, "gpuInstanceId", None)
            ci = getattr(proc, "computeInstanceId", None)
            rec["gpu_instance_id"] = gi if isinstance(gi, int) and gi < 0xFFFFFFFF else None
            rec["compute_instance_id"] = ci if isinstance(ci, int) and ci < 0xFFFFFFFF else None
    return list(by_pid.values())


def _nvml_mig(nvml: Any, handle: Any) -> dict[str, Any]:
    modes = _call(nvml, "nvmlDeviceGetMigMode", handle)
    names = {0: "Disabled", 1: "Enabled"}
    current, pending = modes if isinstance(modes, (list, tuple)) and len(modes) == 2 else (-1, -1)
    devices = []
    if current == 1:
        for i in range(_call(nvml, "nvmlDeviceGetMaxMigDeviceCount", handle) or 0):
            mig = _call(nvml, "nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
            if mig is None:
                continue
            mem = _call(nvml, "nvmlDeviceGetMemoryInfo", mig)
            devices.append(
                {
                    "index": i,
                    "uuid": _call(nvml, "nvmlDeviceGetUUID", mig),
                    "gpu_instance_id": _call(nvml, "nvmlDeviceGetGpuInstanceId", mig),
                    "compute_instance_id": _call(nvml, "nvmlDeviceGetComputeInstanceId", mig),
                    "memory_total_bytes": getattr(mem, "total", None),
                    "memory_used_bytes": getattr(mem, "used", None),
                }
            )
    return {"current": names.get(current), "pending": names.get(pending), "devices": devices}


def nvml_device(nvml: Any, index: int) -> dict[str, Any]:
    """One GPU through NVML, in the same schema as :func:`torchdoctor.facts.nvsmi.parse_device`."""
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    mem = _call(nvml, "nvmlDeviceGetMemoryInfo", h)
    util = _call(nvml, "nvmlDeviceGetUtilizationRates", h)
    pci = _call(nvml, "nvmlDeviceGetPciInfo", h)
    mode = _call(nvml, "nvmlDeviceGetComputeMode", h)
    persistence = _call(nvml, "nvmlDeviceGetPersistenceMode", h)
    ecc = _call(nvml, "nvmlDeviceGetCurrentEccMode", h)
    return {
        "index": index,
        "name": _call(nvml, "nvmlDeviceGetName", h),
        "uuid": _call(nvml, "nvmlDeviceGetUUID", h),
        "pci_bus_id": _decode(getattr(pci, "busId", None)),
        "minor_number": _call(nvml, "nvmlDeviceGetMinorNumber", h),
        "memory": {
            "total_bytes": getattr(mem, "total", None),
            "used_bytes": getattr(mem, "used", None),
            "free_bytes": getattr(mem, "free", None),
        },
        "utilization": {"gpu_percent": getattr(util, "gpu", None), "memory_percent": getattr(util, "memory", None)},
        "compute_mode": COMPUTE_MODES.get(mode) if isinstance(mode, int) else None,
        "persistence_mode": None if persistence is None else bool(persistence),
        "mig": _nvml_mig(nvml, h),
        "ecc": {
            "enabled": None if ecc is None else bool(ecc),
            "volatile_uncorrected": _call(nvml, "nvmlDeviceGetTotalEccErrors", h, 1, 0) if ecc else None,
        },
        "processes": _nvml_processes(nvml, h),
    }


def read_nvml(nvml: Any) -> dict[str, Any]:
    """Driver, CUDA driver version and every device; raises the NVML error of a failed init."""
    nvml.nvmlInit()
    try:
        cuda = _call(nvml, "nvmlSystemGetCudaDriverVersion_v2")
        count = int(nvml.nvmlDeviceGetCount())
        return {
            "driver_version": _call(nvml, "nvmlSystemGetDriverVersion"),
            "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
            "attached_gpus": count,
            "devices": [nvml_device(nvml, i) for i in range(count)],
        }
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a half-initialised NVML must not mask the result
            pass


def _nvml_reason(exc: BaseException) -> str:
    return _NVML_REASONS.get(type(exc).__name__, f"NVML failed: {exc}")


# -- the section ---------------------------------------------------------------------------------


def _name_processes(devices: list[dict[str, Any]]) -> None:
    """Fill in process names NVML does not give, for the processes this PID namespace can see."""
    procs = [p for d in devices for p in d["processes"] if not p.get("name")]
    if not procs:
        return
    import psutil  # lazily: only when a GPU has processes

    for proc in procs:
        try:
            proc["name"] = psutil.Process(proc["pid"]).name()
        except (psutil.Error, OSError):
            proc["name"] = None


def build_section(
    report: dict[str, Any] | None,
    source: str | None,
    reason: str | None,
    env: Mapping[str, str],
    show_uuids: bool = False,
) -> dict[str, Any]:
    """The ``gpu`` facts section from a parsed report (NVML or nvidia-smi), or from a failure."""
    devices = list(report["devices"]) if report else []
    visible = resolve_visible(env.get("CUDA_VISIBLE_DEVICES"), devices, env.get("CUDA_DEVICE_ORDER"))
    if not show_uuids:
        visible = anonymise_visible(visible)
        for dev in devices:
            if dev.get("uuid"):
                dev["uuid"] = anonymise(str(dev["uuid"]))
            for mig in dev.get("mig", {}).get("devices") or []:
                if mig.get("uuid"):
                    mig["uuid"] = anonymise(str(mig["uuid"]))
    if report is not None and not devices:
        reason = reason or f"{source} reports no GPUs"
    return {
        "available": bool(devices),
        "source": source,
        "reason": None if devices else reason,
        "driver_version": report.get("driver_version") if report else None,
        "cuda_driver_version": report.get("cuda_driver_version") if report else None,
        "device_count": len(devices),
        "devices": devices,
        "uuids_anonymised": not show_uuids,
        "visible": visible,
    }


def _from_nvidia_smi(ctx: GatherContext) -> tuple[dict[str, Any] | None, str]:
    exe = shutil.which("nvidia-smi", path=ctx.env.get("PATH", os.defpath))
    if exe is None:
        return None, "nvidia-smi is not on PATH"
    result = ctx.run([exe, "-q", "-x"])
    if not result.ok:
        lines = (result.stderr.strip() or result.stdout.strip()).splitlines()
        detail = result.error or (lines[0] if lines else f"exit status {result.returncode}")
        return None, f"nvidia-smi failed: {detail}"
    try:
        return parse_xml(result.stdout), ""
    except NvsmiParseError as exc:
        return None, str(exc)


def gather(ctx: GatherContext) -> dict[str, Any]:
    report, source, reasons = None, None, []
    try:
        import pynvml
    except ImportError:
        reasons.append("nvidia-ml-py (pynvml) is not installed")
    else:
        try:
            report, source = read_nvml(pynvml), "nvml"
        except Exception as exc:  # noqa: BLE001 - any NVML failure is a reason, never a crash
            reasons.append(_nvml_reason(exc))
    if report is None:
        report, why = _from_nvidia_smi(ctx)
        source = "nvidia-smi" if report is not None else None
        if why:
            reasons.append(why)
    if report is not None:
        _name_processes(report["devices"])
    reason = "; ".join(reasons) if report is None else None
    return build_section(report, source, reason, ctx.env, ctx.show_uuids)
