"""One sample of a process tree and of the host it runs on.

Per process: RSS (and PSS every few samples: it costs a page-table walk), open descriptors against
its own RLIMIT_NOFILE, memory maps (against ``vm.max_map_count``), threads, CPU, and GPU memory
through NVML when there is a GPU. Host-wide: ``/dev/shm`` used and torch's segments in it, the
cgroup's memory against its limit, and MemAvailable. Every reader is :mod:`torchdoctor.facts`'s.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..facts.procs import (
    Stat,
    cmdline,
    count_fds,
    count_maps,
    proc_dir,
    proc_memory,
    read_stat,
    soft_limits,
    tree,
)
from ..facts.redact import redact_argv

SHM = "/dev/shm"


@dataclass
class HostLimits:
    """Limits read once at the start."""

    max_map_count: int | None
    shm_size: int | None
    cgroup_memory_max: int | None
    cgroup_memory_file: str | None
    mem_total: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "max_map_count": self.max_map_count,
            "shm_bytes": self.shm_size,
            "cgroup_memory_bytes": self.cgroup_memory_max,
            "mem_total_bytes": self.mem_total,
        }


def host_limits() -> HostLimits:
    from ..facts import GatherContext, cgroups, shm

    ctx = GatherContext(torch=False)
    try:
        mmc: int | None = int(Path("/proc/sys/vm/max_map_count").read_text().split()[0])
    except (OSError, ValueError):
        mmc = None
    shm_now = shm.gather(ctx)
    cg = cgroups.gather(ctx).get("memory") or {}
    limited = cg.get("limited") and cg.get("max_bytes")
    return HostLimits(
        max_map_count=mmc,
        shm_size=shm_now.get("size_bytes"),
        cgroup_memory_max=cg.get("max_bytes") if limited else None,
        cgroup_memory_file=(str(ctx.path(cg["current_source"])) if limited and cg.get("current_source") else None),
        mem_total=_meminfo().get("MemTotal"),
    )


def _meminfo() -> dict[str, int]:
    from ..facts.memory import parse_meminfo

    try:
        return parse_meminfo(Path("/proc/meminfo").read_text())
    except OSError:
        return {}


#: PSS costs a page-table walk (about 4 ms for a DataLoader worker): once a minute at 1 Hz.
PSS_EVERY = 60
#: /proc/PID/limits changes rarely (a job may lower a limit at its start): re-read every few samples.
LIMITS_EVERY = 5
#: Memory maps of a quiet process far from vm.max_map_count are counted every few samples only.
MAPS_EVERY = 5
#: ...but at every sample once it is past this share of the limit or grew since it was last counted.
MAPS_BUSY = 0.05


@dataclass
class Sampler:
    """Samples ``root`` and its descendants (new ones are picked up at each sample)."""

    root: int
    limits: HostLimits = field(default_factory=host_limits)
    pss_every: int = PSS_EVERY
    exclude: frozenset[int] = frozenset()
    _n: int = 0
    _last_cpu: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)
    _names: dict[tuple[int, int], str] = field(default_factory=dict)
    _rlimits: dict[tuple[int, int], tuple[int, dict[str, int | None]]] = field(default_factory=dict)
    _maps: dict[tuple[int, int], tuple[int, int | None]] = field(default_factory=dict)
    _grew: dict[tuple[int, int], bool] = field(default_factory=dict)
    _gpu: Any = None

    def sample(self) -> dict[str, Any]:
        self._n += 1
        now = time.time()
        gpu = self._gpu_memory()
        procs = []
        for pid in tree(self.root):
            if pid in self.exclude:
                continue
            st = read_stat(proc_dir(pid))
            if st is None or st.state == "Z":
                continue
            procs.append(self._process(pid, st, now, gpu))
        return {"t": round(now, 3), "processes": procs, **self._host()}

    def _process(self, pid: int, st: Stat, now: float, gpu: dict[int, int]) -> dict[str, Any]:
        proc = proc_dir(pid)
        key = (pid, st.start_ticks)
        last = self._last_cpu.get(key)
        cpu = None if last is None else max(0.0, (st.cpu_seconds - last[1]) / max(now - last[0], 1e-3) * 100)
        self._last_cpu[key] = (now, st.cpu_seconds)
        pss = None
        if self.pss_every <= 1 or self._n % self.pss_every == 1:
            mem = proc_memory(pid)
            pss = mem["pss"] if mem else None
        limits = self._soft_limits(key, proc)
        return {
            "pid": pid,
            "ppid": st.ppid,
            "name": self._name(key, proc, st),
            "rss": st.rss_bytes,
            "pss": pss,
            "vsize": st.vsize_bytes,
            "as_limit": limits.get("as"),
            "fds": count_fds(proc),
            "nofile": limits.get("nofile"),
            "maps": self._count_maps(key, proc),
            "threads": st.threads,
            "uid": _uid(proc),
            "nproc": limits.get("nproc"),
            "cpu_percent": None if cpu is None else round(cpu, 1),
            "gpu_bytes": gpu.get(pid),
        }

    def _soft_limits(self, key: tuple[int, int], proc: Path) -> dict[str, int | None]:
        seen = self._rlimits.get(key)
        if seen is None or self._n - seen[0] >= LIMITS_EVERY:
            seen = (self._n, soft_limits(proc))
            self._rlimits[key] = seen
        return seen[1]

    def _count_maps(self, key: tuple[int, int], proc: Path) -> int | None:
        """Counted at every sample when it matters (near the limit, or growing), else every few."""
        seen = self._maps.get(key)
        limit = self.limits.max_map_count or 65530
        if seen is not None and seen[1] is not None:
            quiet = seen[1] < MAPS_BUSY * limit and not self._grew.get(key, False)
            if quiet and self._n - seen[0] < MAPS_EVERY:
                return seen[1]
        n = count_maps(proc)
        self._grew[key] = seen is not None and n is not None and seen[1] is not None and n > seen[1]
        self._maps[key] = (self._n, n)
        return n

    def _name(self, key: tuple[int, int], proc: Path, st: Stat) -> str:
        """``comm`` and a short, redacted command line, read once per process."""
        name = self._names.get(key)
        if name is None:
            argv = cmdline(proc)
            role = _role(argv)
            short = redact_argv([os.path.basename(argv[0]), *argv[1:3]])[:60] if argv else ""
            name = f"{role or st.comm}: {short}" if short else st.comm
            self._names[key] = name
        return name

    def shm_path(self) -> str:
        """/dev/shm as the job sees it: through its root's mount namespace (a container's, or a private
        tmpfs mounted after it started), else this process's own."""
        mine = f"/proc/{self.root}/root{SHM}"
        return mine if os.path.isdir(mine) else SHM

    def _host(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "shm_used": None,
            "shm_size": None,
            "torch_segments": None,
            "cgroup_memory": None,
            "mem_available": None,
        }
        shm = self.shm_path()
        try:
            vfs = os.statvfs(shm)
            out["shm_used"] = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
            out["shm_size"] = vfs.f_blocks * vfs.f_frsize
        except OSError:
            pass
        try:
            with os.scandir(shm) as entries:
                out["torch_segments"] = sum(1 for e in entries if e.name.startswith("torch_"))
        except OSError:
            pass
        if self.limits.cgroup_memory_file:
            try:
                out["cgroup_memory"] = int(Path(self.limits.cgroup_memory_file).read_text().split()[0])
            except (OSError, ValueError):
                pass
        out["mem_available"] = _meminfo().get("MemAvailable")
        return out

    def _gpu_memory(self) -> dict[int, int]:
        """GPU memory per pid through NVML (nothing when there is no NVIDIA driver)."""
        if self._gpu is False:
            return {}
        try:
            import pynvml as nvml

            from ..facts.gpu import read_nvml

            data = read_nvml(nvml)
        except Exception:  # noqa: BLE001 - no driver, no library: no GPU column, once and for all
            self._gpu = False
            return {}
        out: dict[int, int] = {}
        for dev in data.get("devices", []):
            for p in dev.get("processes") or []:
                if p.get("pid") is not None and p.get("used_memory_bytes") is not None:
                    out[int(p["pid"])] = out.get(int(p["pid"]), 0) + int(p["used_memory_bytes"])
        return out


def _uid(proc: Path) -> int | None:
    try:
        return proc.stat().st_uid
    except OSError:
        return None


def _role(argv: list[str]) -> str | None:
    """What a process of a training job is, from its command line."""
    text = " ".join(argv)
    if "multiprocessing.spawn" in text or "multiprocessing.forkserver" in text:
        return "spawned child"
    if "torch.distributed.run" in text or "torchrun" in text:
        return "torchrun"
    if "torch_shm_manager" in text:
        return "torch_shm_manager"
    return None
