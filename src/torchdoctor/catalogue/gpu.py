"""TD30x: GPUs: is there one, can this process have it, how much of it is left, and does the
driver fit the torch build. Judged from the ``gpu`` section (NVML / nvidia-smi), ``torch`` and the
launcher's variables in ``host.env`` (the processes on this node, in gpu_visible.py, through
:func:`._processes.local_processes`); nothing here creates a CUDA context."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ..facts import Facts
from ..facts.schema import GpuDevice, GpuProcess
from ..model import Evidence, Severity
from ..options import CheckOptions
from ..registry import Code, Hit, register
from ._util import ev, human_bytes

LOW_FREE = 0.5
"""A visible GPU with less than this fraction of its memory free is reported (warning)."""
VERY_LOW_FREE = 0.1
"""Below this fraction the report is an error: almost any model will hit CUDA out of memory."""
BUSY_PERCENT = 50
NVSMI = "nvidia-smi / NVML"
_LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")


# -- helpers (pure) --------------------------------------------------------------------------------


def _visible(facts: Facts) -> list[GpuDevice]:
    """The devices CUDA will enumerate for this process, in CUDA's order."""
    devices = list(facts.gpu.devices)
    vis = facts.gpu.visible
    if not vis.env_set:
        return devices
    by_index = {d.index: d for d in devices}
    return [by_index[i] for i in vis.visible_indices if i in by_index]


def _label(dev: GpuDevice) -> str:
    return f"GPU {dev.index} ({dev.name or 'unknown model'})"


def _foreign(facts: Facts, dev: GpuDevice, compute_only: bool = True) -> list[GpuProcess]:
    own = facts.host.pid
    return [p for p in dev.processes if p.pid != own and (not compute_only or "C" in (p.type or "C"))]


def _procs_text(procs: list[GpuProcess]) -> str:
    parts = []
    for p in procs[:4]:
        mem = f", {human_bytes(p.used_memory_bytes)}" if p.used_memory_bytes is not None else ""
        parts.append(f"pid {p.pid} {p.name or '?'}{mem}")
    more = f" and {len(procs) - 4} more" if len(procs) > 4 else ""
    return "; ".join(parts) + more


def _env_int(facts: Facts, *names: str) -> tuple[int | None, str | None]:
    """The first of ``names`` set to an integer in the environment, and its name."""
    for name in names:
        raw = facts.host.env.get(name)
        if raw is None:
            continue
        try:
            return int(raw.strip()), name
        except ValueError:
            continue
    return None, None


def _cuda_visible_ev(facts: Facts) -> Evidence:
    vis = facts.gpu.visible
    return ev("CUDA_VISIBLE_DEVICES", vis.value if vis.env_set else "(not set: all GPUs)", "environment")


def _version(text: Any) -> tuple[int, int] | None:
    m = re.match(r"^\s*(\d+)\.(\d+)", str(text or ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


# -- TD301 -----------------------------------------------------------------------------------------


def _check_no_gpu(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    gpu = facts.gpu
    if not gpu:
        why = facts.why_unknown("gpu")
        if why:
            yield Hit({"reason": f"the GPU facts could not be read ({why})"}, (ev("gpu facts", "unknown", why),))
        return
    if gpu.available:
        return
    reason = gpu.reason or "no GPU found"
    evidence = [ev("NVML / nvidia-smi", reason, gpu.source or "nvmlInit, nvidia-smi on PATH")]
    if facts.torch.cuda_build:
        evidence.append(ev("torch build", f"CUDA {facts.torch.cuda}", "torch/version.py"))
    yield Hit({"reason": reason}, tuple(evidence))


TD301 = register(
    Code(
        code="TD301",
        name="gpu-not-found",
        family="gpu-unavailable",
        severity=Severity.INFO,
        area="gpu",
        title="No NVIDIA GPU is usable on this machine",
        message="No NVIDIA GPU is usable here: {reason}. CUDA code will run on CPU or fail with "
        "'Found no NVIDIA driver on your system' / 'No CUDA GPUs are available'.",
        fix="Nothing to do for a CPU-only run. If this machine should have a GPU: `nvidia-smi` must list it; in Docker "
        "start the container with `--gpus all` (NVIDIA Container Toolkit), in Kubernetes request `nvidia.com/gpu`, "
        "under Slurm request GPUs (`--gpus-per-node=N` or `--gres=gpu:N`).",
        meaning="NVML, the NVIDIA management library that nvidia-smi uses, could not be loaded or reports no GPU, so "
        "no CUDA program in this environment can use one.",
        why="No NVIDIA driver is installed, the kernel module is not loaded, or the container was started without the "
        "NVIDIA runtime so neither the library nor /dev/nvidia* are inside it.",
        false_positives="Machines with only AMD (ROCm) or other accelerators are reported as having no NVIDIA GPU.",
        related=("TD302", "TD308"),
        check=_check_no_gpu,
    )
)


# -- TD302 -----------------------------------------------------------------------------------------


def _check_cpu_build(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    torch = facts.torch
    if not facts.gpu.available or not torch.installed:
        return
    if torch.cuda_build is not False or torch.hip:
        return
    count, driver = facts.gpu.device_count or 0, facts.gpu.cuda_driver_version or "unknown"
    yield Hit(
        {"version": torch.version or "?", "count": count, "driver_cuda": driver},
        (
            ev("torch", f"{torch.version} (no CUDA libraries)", "torch/version.py, torch/lib"),
            ev("GPUs", count, NVSMI),
            ev("driver supports CUDA", driver, NVSMI),
        ),
    )


TD302 = register(
    Code(
        code="TD302",
        name="torch-cpu-build-with-gpu",
        family="gpu-unavailable",
        severity=Severity.WARNING,
        area="gpu",
        title="torch is a CPU-only build on a machine with GPUs",
        message="torch {version} has no CUDA support but this machine has {count} NVIDIA GPU(s) (driver supports CUDA "
        "{driver_cuda}); torch.cuda.is_available() is False and `.cuda()` raises 'Torch not compiled with CUDA "
        "enabled'.",
        fix="Install a CUDA build of torch for CUDA {driver_cuda} or older: `pip install torch --index-url "
        "https://download.pytorch.org/whl/cu<NNN>` with a cu<NNN> listed on https://pytorch.org/get-started/locally/, "
        "then check `python -c 'import torch; print(torch.version.cuda, torch.cuda.is_available())'`.",
        meaning="The installed torch wheel contains no CUDA kernels, so every model stays on the CPU.",
        why="`pip install torch` from an index or platform that serves CPU wheels, a CPU-only conda package, or a "
        "requirements file pinned to a `+cpu` version.",
        false_positives="Jobs that deliberately run on CPU (data preparation, evaluation) on a GPU node.",
        related=("TD301", "TD311"),
        check=_check_cpu_build,
    )
)


# -- TD303 / TD304 compute modes --------------------------------------------------------------------


def _check_exclusive_busy(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    visible = _visible(facts)
    busy = [(d, _foreign(facts, d)) for d in visible if d.compute_mode == "Exclusive_Process"]
    busy = [(d, procs) for d, procs in busy if procs]
    if not busy:
        return
    every = len(busy) == len(visible)
    yield Hit(
        {
            "gpus": ", ".join(_label(d) for d, _ in busy),
            "n_busy": len(busy),
            "n_visible": len(visible),
            "effect": "so the first CUDA call fails" if every else "so using one of them fails",
            "index": busy[0][0].index,
            "pids": ", ".join(str(p.pid) for _, ps in busy for p in ps[:4]),
        },
        tuple(ev(f"{_label(d)} compute mode", f"Exclusive_Process, held by {_procs_text(ps)}", NVSMI) for d, ps in busy)
        + (_cuda_visible_ev(facts),),
    )


TD303 = register(
    Code(
        code="TD303",
        name="gpu-exclusive-busy",
        family="gpu-unavailable",
        severity=Severity.ERROR,
        area="gpu",
        title="A GPU in Exclusive_Process mode is already held by another process",
        message="{n_busy} of {n_visible} visible GPU(s) are in Exclusive_Process compute mode and already have a CUDA "
        "context from another process ({gpus}), {effect} with 'all CUDA-capable devices are busy or unavailable' "
        "(newer CUDA: 'CUDA-capable device(s) is/are busy or unavailable').",
        fix="Use GPUs nobody holds: list them with `nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name "
        "--format=csv` and set `CUDA_VISIBLE_DEVICES` accordingly; or stop the holder (pid {pids}) if it is yours; "
        "or have an admin allow sharing: `sudo nvidia-smi -i {index} -c DEFAULT`.",
        meaning="In Exclusive_Process mode a GPU accepts CUDA contexts from one process at a time; every other process "
        "is refused.",
        why="Clusters set exclusive mode so that jobs cannot share a GPU by accident; a leftover or concurrent process "
        "(another user's job, a notebook, a zombie from a killed run) still owns the GPU.",
        false_positives="NVML lists processes by host PID; inside a container the holder may be one of your own "
        "processes under another PID. A process that exits before the run starts frees the GPU.",
        related=("TD304", "TD305"),
        check=_check_exclusive_busy,
    )
)


def _check_prohibited(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    bad = [d for d in _visible(facts) if d.compute_mode == "Prohibited"]
    if bad:
        yield Hit(
            {"gpus": ", ".join(_label(d) for d in bad), "indices": ",".join(str(d.index) for d in bad)},
            tuple(ev(f"{_label(d)} compute mode", "Prohibited", NVSMI) for d in bad) + (_cuda_visible_ev(facts),),
        )


TD304 = register(
    Code(
        code="TD304",
        name="gpu-compute-prohibited",
        family="gpu-unavailable",
        severity=Severity.ERROR,
        area="gpu",
        title="A visible GPU is in Prohibited compute mode",
        message="{gpus} in Prohibited compute mode: no process may create a CUDA context on it, so CUDA calls fail "
        "with 'CUDA-capable device(s) is/are busy or unavailable'.",
        fix="Hide it (`CUDA_VISIBLE_DEVICES` without index {indices}) or have an admin re-enable it: "
        "`sudo nvidia-smi -i {indices} -c DEFAULT`.",
        meaning="Prohibited compute mode disables CUDA on the GPU entirely (display or maintenance use).",
        why="An administrator drained the GPU, or a node health script took it out of service.",
        false_positives="None known: while the mode is set, CUDA cannot use the GPU.",
        related=("TD303",),
        check=_check_prohibited,
    )
)


# -- TD305 / TD306 memory and utilisation held by others ---------------------------------------------


def _check_memory_taken(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    low: list[tuple[GpuDevice, float]] = []
    own = facts.host.pid
    for dev in _visible(facts):
        total, free = dev.memory.total_bytes, dev.memory.free_bytes
        if not total or free is None:
            continue
        # Memory this very process holds (torchdoctor called from inside a run) is not taken by others.
        free += sum(p.used_memory_bytes or 0 for p in dev.processes if p.pid == own)
        if free / total < LOW_FREE:
            low.append((dev, free / total))
    if not low:
        return
    worst = min(frac for _, frac in low)
    evidence = []
    for dev, frac in low:
        mem, procs = dev.memory, _foreign(facts, dev, compute_only=False)
        held = _procs_text(procs) if procs else "no process listed (other container, or MIG/vGPU)"
        evidence.append(
            ev(
                f"{_label(dev)} free",
                f"{human_bytes(mem.free_bytes)} of {human_bytes(mem.total_bytes)} ({frac:.0%}); held by {held}",
                NVSMI,
            )
        )
    first = low[0][0].memory
    yield Hit(
        {
            "n_low": len(low),
            "n_visible": len(_visible(facts)),
            "worst": f"{worst:.0%}",
            "example": f"{_label(low[0][0])} has {human_bytes(first.free_bytes)} free of {human_bytes(first.total_bytes)}",
        },
        tuple(evidence) + (_cuda_visible_ev(facts),),
        severity=Severity.ERROR if worst < VERY_LOW_FREE else None,
    )


TD305 = register(
    Code(
        code="TD305",
        name="gpu-memory-held-by-others",
        family="cuda-oom",
        severity=Severity.WARNING,
        area="gpu",
        title="Most of a visible GPU's memory is already taken",
        message="{n_low} of {n_visible} visible GPU(s) have less than half their memory free (lowest {worst}); {example}. "
        "Allocations beyond that fail with 'CUDA out of memory. Tried to allocate ...'.",
        fix="Choose GPUs with free memory (`nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv`) through "
        "`CUDA_VISIBLE_DEVICES`, stop the processes listed in the evidence if they are yours (stale runs, notebooks), "
        "or shrink the run to fit (smaller batch, activation checkpointing, mixed precision).",
        meaning="Memory other processes hold on a GPU is not available to this run; CUDA does not wait for it.",
        why="Several jobs or users share the GPUs, a previous run left a process behind, or the scheduler does not "
        "isolate GPUs (no cgroup device constraint), so CUDA_VISIBLE_DEVICES points at a GPU in use.",
        false_positives="A small model may still fit in what is left. Memory NVML attributes to this process is not "
        "counted as taken; inside a container NVML may not list other containers' processes at all.",
        related=("TD303", "TD306", "TD310"),
        check=_check_memory_taken,
    )
)


def _check_busy(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    busy = [
        (d, _foreign(facts, d))
        for d in _visible(facts)
        if d.utilization.gpu_percent is not None and d.utilization.gpu_percent >= BUSY_PERCENT
    ]
    busy = [(d, ps) for d, ps in busy if ps]
    if busy:
        yield Hit(
            {"n_busy": len(busy), "gpus": ", ".join(f"{_label(d)} at {d.utilization.gpu_percent}%" for d, _ in busy)},
            tuple(
                ev(f"{_label(d)} utilisation", f"{d.utilization.gpu_percent}% with {_procs_text(ps)}", NVSMI)
                for d, ps in busy
            ),
        )


TD306 = register(
    Code(
        code="TD306",
        name="gpu-busy-with-others",
        family="gpu-unavailable",
        severity=Severity.INFO,
        area="gpu",
        title="Visible GPUs are busy with other processes' work",
        message="{n_busy} visible GPU(s) are computing for other processes ({gpus}); this run will share their time "
        "and be slower than expected.",
        fix="Pick idle GPUs via `CUDA_VISIBLE_DEVICES` (`nvidia-smi --query-gpu=index,utilization.gpu --format=csv`) "
        "or wait for the listed processes to finish.",
        meaning="GPU time is shared between all processes with a context on the GPU.",
        why="A shared workstation or a scheduler without GPU isolation.",
        false_positives="Utilisation is a sample of the last second or so; a bursty neighbour may be idle a moment later.",
        related=("TD305",),
        check=_check_busy,
    )
)


# -- TD311 driver vs build, TD312 device order, TD313 ECC ------------------------------------------------


def _check_driver_too_old(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    gpu, torch_cuda = facts.gpu, facts.torch.cuda
    built, driver = _version(torch_cuda), _version(gpu.cuda_driver_version)
    if not gpu.available or built is None or driver is None or driver >= built:
        return
    major = driver[0] < built[0]
    yield Hit(
        {
            "torch_cuda": torch_cuda,
            "driver_cuda": gpu.cuda_driver_version,
            "driver": gpu.driver_version,
            "effect": (
                "CUDA initialisation fails with 'The NVIDIA driver on your system is too old (found version "
                f"{driver[0] * 1000 + driver[1] * 10})'"
            )
            if major
            else (
                "CUDA minor-version compatibility usually lets it run, but kernels needing the newer driver "
                "(PTX JIT, some library features) can fail"
            ),
        },
        (
            ev("torch built with CUDA", torch_cuda, "torch/version.py"),
            ev("driver", f"{gpu.driver_version} (supports CUDA {gpu.cuda_driver_version})", NVSMI),
        ),
        severity=None if major else Severity.WARNING,
    )


TD311 = register(
    Code(
        code="TD311",
        name="cuda-driver-too-old",
        family="gpu-unavailable",
        severity=Severity.ERROR,
        area="gpu",
        title="The NVIDIA driver is older than torch's CUDA build",
        message="torch was built for CUDA {torch_cuda} but driver {driver} supports CUDA {driver_cuda}: {effect}.",
        fix="Update the NVIDIA driver to one that supports CUDA {torch_cuda}, or install a torch build for CUDA "
        "{driver_cuda} or older (https://pytorch.org/get-started/locally/ and the previous-versions page).",
        meaning="A CUDA program needs a driver at least as new as its CUDA major version; within a major version, minor "
        "version compatibility covers most but not all features.",
        why="pip installs the newest CUDA build of torch while cluster drivers are updated rarely.",
        false_positives="The driver version comes from NVML; a CUDA forward-compatibility package (cuda-compat) in the "
        "container can make a newer CUDA work on an older datacenter driver.",
        related=("TD302",),
        check=_check_driver_too_old,
    )
)


def _check_device_order(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    vis = facts.gpu.visible
    models = sorted({str(d.name) for d in facts.gpu.devices})
    uses_index = any(e.kind == "index" for e in vis.entries)
    if len(models) > 1 and vis.env_set and uses_index and vis.device_order != "PCI_BUS_ID":
        yield Hit(
            {"models": ", ".join(models), "value": vis.value, "order": vis.device_order or "FASTEST_FIRST (default)"},
            (
                _cuda_visible_ev(facts),
                ev("CUDA_DEVICE_ORDER", vis.device_order or "not set", "environment"),
                ev("GPU models", ", ".join(models), NVSMI),
            ),
        )


TD312 = register(
    Code(
        code="TD312",
        name="cuda-device-order-mixed",
        family="gpu-unavailable",
        severity=Severity.WARNING,
        area="gpu",
        title="CUDA_VISIBLE_DEVICES uses indices on a machine with mixed GPU models",
        message="CUDA_VISIBLE_DEVICES={value} uses indices, CUDA_DEVICE_ORDER is {order} and the GPUs differ ({models}): "
        "CUDA's index may name another GPU than nvidia-smi's.",
        fix="`export CUDA_DEVICE_ORDER=PCI_BUS_ID` so CUDA numbers GPUs like nvidia-smi, or name GPUs by UUID "
        "(`nvidia-smi -L`).",
        meaning="By default CUDA numbers the fastest GPU 0; nvidia-smi and NVML number GPUs by PCI bus.",
        why="Workstations with two GPU generations, or a display GPU next to compute GPUs.",
        false_positives="When the fastest GPU also has the lowest PCI bus id, both orders agree.",
        related=("TD307",),
        check=_check_device_order,
    )
)


def _check_ecc(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    bad = [d for d in _visible(facts) if (d.ecc.volatile_uncorrected or 0) > 0]
    if bad:
        yield Hit(
            {"gpus": ", ".join(f"{_label(d)}: {d.ecc.volatile_uncorrected}" for d in bad), "index": bad[0].index},
            tuple(
                ev(f"{_label(d)} uncorrectable ECC errors since driver load", d.ecc.volatile_uncorrected, NVSMI)
                for d in bad
            ),
        )


TD313 = register(
    Code(
        code="TD313",
        name="gpu-ecc-uncorrectable",
        family="gpu-unavailable",
        severity=Severity.WARNING,
        area="gpu",
        title="A visible GPU has uncorrectable ECC memory errors",
        message="Uncorrectable ECC errors since the driver loaded ({gpus}); kernels touching the bad memory fail with "
        "'uncorrectable ECC error encountered'.",
        fix="Exclude the GPU through `CUDA_VISIBLE_DEVICES` and report it to the admin; inspect with "
        "`nvidia-smi -q -d ECC,PAGE_RETIREMENT -i {index}` and reset it when idle (`sudo nvidia-smi -r -i {index}`).",
        meaning="The GPU's memory returned data ECC could not correct; the driver retires or remaps the page, often only "
        "after a reset.",
        why="Ageing or faulty HBM/GDDR memory, overheating.",
        false_positives="Counters persist until the driver reloads; a GPU already reset and remapped may be healthy.",
        related=("TD303",),
        check=_check_ecc,
    )
)
