"""CPU: cores, the cores this process may use, thread-count variables, and the thread pools that
torch and OpenCV will size from them, all without importing either library here.

Counts come from the files ``psutil`` and the kernel expose (``/sys/devices/system/cpu``,
``/proc/self/status``), read through the context so a fixture root can stand in for a machine;
the CPU quota comes from the cgroup files (see :mod:`.cgroups`).

torch's intra-op thread count is *estimated* by :func:`estimate_torch_threads`; the rule is
checked against ``torch.get_num_threads()`` of the installed torch in the test suite.
"""

from __future__ import annotations

import glob
import importlib.util
import math
import os
import platform
import sys
from typing import Any

import psutil

from . import cgroups
from .context import GatherContext

#: Variables that size native thread pools (OpenMP, MKL, OpenBLAS, numexpr, BLIS, Accelerate).
THREAD_ENV = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "NUMEXPR_MAX_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "BLIS_NUM_THREADS",
    "OMP_THREAD_LIMIT",
    "MKL_DYNAMIC",
)

_CV2_PROBE = "import cv2; print(cv2.getNumThreads()); print(cv2.getNumberOfCPUs()); print(cv2.__version__)"


def env_threads(value: str | None) -> int | None:
    """The thread count a variable asks for: its leading positive integer (``"4"``, ``"4,2"``)."""
    if value is None:
        return None
    head = value.strip().split(",")[0].strip()
    return int(head) if head.isdigit() and int(head) > 0 else None


def estimate_torch_threads(
    env: dict[str, str], physical: int | None, affinity: int | None, machine: str
) -> tuple[int | None, str]:
    """``torch.get_num_threads()`` of a fresh process, without importing torch, and the rule used.

    ATen (``aten/src/ATen/ParallelCommon.cpp``, ``ParallelOpenMP.cpp``) sizes its OpenMP pool from
    ``MKL_NUM_THREADS``, else ``OMP_NUM_THREADS``, else the physical core count. x86-64 wheels link
    MKL, whose default dynamic mode never runs more threads than the physical cores the process
    may use (its affinity mask), so larger requests are cut down unless ``MKL_DYNAMIC=FALSE``.
    The cgroup CPU quota is not consulted by either library.
    """
    requested = env_threads(env.get("MKL_NUM_THREADS")) or env_threads(env.get("OMP_NUM_THREADS"))
    which = "MKL_NUM_THREADS" if env_threads(env.get("MKL_NUM_THREADS")) else "OMP_NUM_THREADS"
    cores = min(c for c in (physical, affinity) if c) if (physical or affinity) else None
    if machine.lower() not in ("x86_64", "amd64"):
        if requested:
            return requested, f"{which}={requested}"
        return physical, "physical cores (non-x86 build without MKL; rule not verified on this architecture)"
    dynamic = env.get("MKL_DYNAMIC", "").strip().lower() not in ("false", "0", "no")
    if requested and (not dynamic or cores is None):
        return requested, f"{which}={requested}" + ("" if dynamic else " with MKL_DYNAMIC=FALSE")
    if requested and cores is not None:
        if requested <= cores:
            return requested, f"{which}={requested}"
        return cores, f"{which}={requested} capped by MKL to {cores} physical cores the process may use"
    return cores, "physical cores the process may use (min of physical cores and affinity)"


def _logical(ctx: GatherContext) -> tuple[int | None, str]:
    text = ctx.read_text("/sys/devices/system/cpu/online")
    if text is not None:
        try:
            return len(cgroups.parse_ranges(text)), "/sys/devices/system/cpu/online"
        except ValueError:
            pass
    if str(ctx.root) == "/" and os.cpu_count():
        return os.cpu_count(), "os.cpu_count()"
    ctx.unknown("cpu.logical_cores", "cannot read /sys/devices/system/cpu/online")
    return None, ""


def _physical(ctx: GatherContext, online: list[int]) -> int | None:
    """Distinct cores: the sibling lists of the online CPUs (how psutil counts them on Linux)."""
    cores: set[str] = set()
    for n in online:
        base = f"/sys/devices/system/cpu/cpu{n}/topology"
        text = ctx.read_text(f"{base}/core_cpus_list") or ctx.read_text(f"{base}/thread_siblings_list")
        if text is not None:
            cores.add(text.strip())
    if cores:
        return len(cores)
    if str(ctx.root) == "/":
        count = psutil.cpu_count(logical=False)  # how psutil counts elsewhere
        return int(count) if count else None
    ctx.unknown("cpu.physical_cores", "no /sys/devices/system/cpu/cpu*/topology files")
    return None


def _affinity(ctx: GatherContext) -> tuple[str | None, int | None]:
    text = ctx.read_text("/proc/self/status", fact="cpu.affinity_cores")
    for line in (text or "").splitlines():
        if line.startswith("Cpus_allowed_list:"):
            value = line.split(":", 1)[1].strip()
            return value, len(cgroups.parse_ranges(value))
    if str(ctx.root) == "/" and hasattr(os, "sched_getaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        return ",".join(map(str, cpus)), len(cpus)
    return None, None


def _online(ctx: GatherContext) -> list[int]:
    text = ctx.read_text("/sys/devices/system/cpu/online")
    if text is not None:
        return cgroups.parse_ranges(text)
    found = glob.glob(str(ctx.path("/sys/devices/system/cpu")) + "/cpu[0-9]*")
    return sorted(int(p.rsplit("cpu", 1)[1]) for p in found)


def cv2_threads(ctx: GatherContext) -> dict[str, Any]:
    """OpenCV's thread count, read in a bounded child: cv2 is never imported in this process."""
    if importlib.util.find_spec("cv2") is None:
        return {"installed": False}
    if not ctx.torch:
        ctx.unknown("cpu.cv2.threads", "skipped (--no-torch skips child interpreters)")
        return {"installed": True, "threads": None}
    res = ctx.run([sys.executable, "-c", _CV2_PROBE])
    lines = res.stdout.split()
    if not res.ok or len(lines) < 3 or not lines[0].lstrip("-").isdigit():
        ctx.unknown("cpu.cv2.threads", res.error or f"cv2 probe failed: {res.stderr.strip()[-200:]}")
        return {"installed": True, "threads": None}
    return {
        "installed": True,
        "threads": int(lines[0]),
        "cpus": int(lines[1]),
        "version": lines[2],
        "source": f"{sys.executable} -c 'import cv2; cv2.getNumThreads()'",
    }


def gather(ctx: GatherContext) -> dict[str, Any]:
    logical, logical_source = _logical(ctx)
    physical = _physical(ctx, _online(ctx))
    affinity_list, affinity = _affinity(ctx)
    limits = cgroups.cpu_limits(ctx, cgroups.locate(ctx), record=False) or {}
    quota = limits.get("quota_cpus")
    candidates = [
        (float(v), why) for v, why in ((logical, "logical"), (affinity, "affinity"), (quota, "cgroup-quota")) if v
    ]
    usable, limited_by = min(candidates, key=lambda c: c[0]) if candidates else (None, None)
    env = {name: ctx.env[name] for name in THREAD_ENV if name in ctx.env}
    machine = platform.machine()
    estimate, rule = estimate_torch_threads(env, physical, affinity, machine)
    return {
        "logical_cores": logical,
        "logical_source": logical_source,
        "physical_cores": physical,
        "affinity_cores": affinity,
        "affinity_list": affinity_list,
        "cgroup_quota_cpus": quota,
        "cgroup_quota_source": limits.get("quota_source"),
        "cgroup_cpuset_cores": limits.get("cpuset_count"),
        "usable_cores": usable if usable is None or not usable.is_integer() else int(usable),
        "usable_threads": max(1, math.ceil(usable)) if usable else None,
        "usable_limited_by": limited_by,
        "machine": machine,
        "thread_env": env,
        "torch_threads_estimate": estimate,
        "torch_threads_rule": rule,
        "cv2": cv2_threads(ctx),
    }
