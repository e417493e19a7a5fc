"""Control groups: which version this process runs under, and its memory, pids and CPU limits.

The process's cgroup comes from ``/proc/self/cgroup`` and the hierarchies' mount points from
``/proc/self/mountinfo``, both read through the context so tests can replay a fixture tree.
A limit may be set on any ancestor, so each limit is the smallest found walking from the
process's cgroup up to the mount point; usage is read where that limit is set, because that
is what the kernel compares against it.

File formats (kernel ``Documentation/admin-guide/``): ``cgroup-v2.rst`` (memory.max, memory.high,
memory.swap.max, memory.current, memory.peak, memory.events, pids.max, pids.current,
pids.events, cpu.max, cpuset.cpus.effective), ``cgroup-v1/memory.rst`` (memory.limit_in_bytes,
memory.usage_in_bytes, memory.max_usage_in_bytes, memory.memsw.limit_in_bytes,
memory.oom_control, memory.failcnt), ``cgroup-v1/pids.rst`` and ``scheduler/sched-bwc.rst``
(cpu.cfs_quota_us, cpu.cfs_period_us).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .context import GatherContext

#: cgroup v1 spells "no limit" as the page counter's maximum in bytes: 9223372036854771712 with
#: 4 KiB pages (LONG_MAX rounded down to a page). Anything this large is no limit at all.
V1_UNLIMITED = 2**62


@dataclass(frozen=True)
class CgroupMount:
    root: str
    """Path inside the hierarchy that is mounted here (field 4 of mountinfo)."""
    mount_point: str
    version: int
    controllers: frozenset[str]


@dataclass(frozen=True)
class Layout:
    version: int | None
    hybrid: bool
    path: str | None
    dirs: dict[str, str]
    """Controller ("memory", "pids", "cpu", "cpuset") → the process's cgroup directory for it."""
    tops: dict[str, str]
    """Controller → the mount point its walk towards the root stops at."""
    paths: dict[str, str]
    """Controller → its path in /proc/self/cgroup (``/`` at a hierarchy's root or a namespace's)."""

    def at_root(self, controller: str) -> bool:
        """The process sits in the root cgroup of this controller, which has no limit files."""
        return self.paths.get(controller) == "/" and self.dirs.get(controller) == self.tops.get(controller)


def parse_ranges(text: str) -> list[int]:
    """A kernel CPU list (``0-3,8,10-11``) as the CPU numbers it names."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/self/cgroup`` as controller → path; the v2 entry (``0::/path``) is under ``""``."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            out[""] = path
            continue
        for name in controllers.split(","):
            out[name] = path
    return out


def parse_cgroup_mounts(mountinfo: str) -> list[CgroupMount]:
    mounts: list[CgroupMount] = []
    for line in mountinfo.splitlines():
        parts = line.split()
        if "-" not in parts:
            continue
        sep = parts.index("-")
        if sep < 5 or len(parts) < sep + 2:
            continue
        fstype = parts[sep + 1]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        version = 2 if fstype == "cgroup2" else 1
        # v1 super options name the controllers of the hierarchy: "rw,cpu,cpuacct", "rw,xattr,name=systemd"
        super_opts = parts[sep + 3].split(",") if version == 1 and len(parts) > sep + 3 else []
        controllers = frozenset(
            o for o in super_opts if o.startswith("name=") or ("=" not in o and o not in ("rw", "ro"))
        )
        mounts.append(CgroupMount(_unescape(parts[3]), _unescape(parts[4]), version, controllers))
    return mounts


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _resolve(mount: CgroupMount, path: str) -> str:
    """The directory of cgroup ``path`` under a mount of (part of) its hierarchy."""
    root = mount.root.rstrip("/")
    if path == mount.root or (root and path.startswith(root + "/")):
        return posixpath.normpath(mount.mount_point + path[len(root) :])
    if not root:
        return posixpath.normpath(mount.mount_point + path)
    return mount.mount_point  # a container that mounts only its own cgroup at the mount point


def locate(ctx: GatherContext) -> Layout:
    """Which cgroup version governs this process, and where its controllers' files are."""
    proc = parse_proc_cgroup(ctx.read_text("/proc/self/cgroup", fact="cgroup.version") or "")
    mounts = parse_cgroup_mounts(ctx.read_text("/proc/self/mountinfo", fact="cgroup.version") or "")
    v1_controllers = {name for name in proc if name and not name.startswith("name=")}
    v2_mount = next((m for m in mounts if m.version == 2), None)
    dirs: dict[str, str] = {}
    tops: dict[str, str] = {}
    paths: dict[str, str] = {}
    if v1_controllers:
        for name in ("memory", "pids", "cpu", "cpuset"):
            mount = next((m for m in mounts if m.version == 1 and name in m.controllers), None)
            if mount is None or name not in proc:
                continue
            d = _resolve(mount, proc[name])
            dirs[name] = d if ctx.path(d).is_dir() else mount.mount_point
            tops[name], paths[name] = mount.mount_point, proc[name]
        return Layout(1, v2_mount is not None, proc.get("memory", proc.get("cpu")), dirs, tops, paths)
    if v2_mount is not None and "" in proc:
        d = _resolve(v2_mount, proc[""])
        d = d if ctx.path(d).is_dir() else v2_mount.mount_point
        for name in ("memory", "pids", "cpu", "cpuset"):
            dirs[name], tops[name], paths[name] = d, v2_mount.mount_point, proc[""]
        return Layout(2, False, proc[""], dirs, tops, paths)
    return Layout(None, False, None, {}, {}, {})


# -- reading -----------------------------------------------------------------------------------
def _ancestors(leaf: str, top: str) -> list[str]:
    """``leaf`` and each parent directory up to and including ``top``."""
    out = [leaf]
    while leaf != top and leaf.startswith(top.rstrip("/") + "/"):
        leaf = posixpath.dirname(leaf)
        out.append(leaf)
    return out


def _read_raw(ctx: GatherContext, path: str) -> str | None:
    text = ctx.read_text(path)
    return None if text is None else text.strip()


def parse_limit(raw: str, v1: bool = False) -> int | None:
    """A limit file's value in its unit; None means no limit (``max``, ``-1``, v1's huge number)."""
    value = raw.split()[0] if raw.split() else raw
    if value == "max" or value == "-1":
        return None
    n = int(value)
    return None if v1 and n >= V1_UNLIMITED else n


def parse_keyed(text: str) -> dict[str, int]:
    """Flat-keyed files (``memory.events``, ``pids.events``, ``memory.oom_control``): key → int."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def parse_cpu_max(raw: str) -> tuple[int | None, int]:
    """``cpu.max`` (``"200000 100000"`` or ``"max 100000"``) → (quota µs or None, period µs)."""
    parts = raw.split()
    return (None if parts[0] == "max" else int(parts[0])), int(parts[1]) if len(parts) > 1 else 100000


@dataclass
class _Limit:
    value: int | None = None
    at: str | None = None
    files_seen: int = 0


def _smallest(ctx: GatherContext, dirs: list[str], name: str, parse: Callable[[str], int | None]) -> _Limit:
    """The smallest limit named ``name`` over ``dirs`` (None when every file says "no limit")."""
    best = _Limit()
    for d in dirs:
        raw = _read_raw(ctx, f"{d}/{name}")
        if raw is None:
            continue
        try:
            value = parse(raw)
        except (ValueError, IndexError):
            ctx.unknown(f"cgroup.{name}", f"unexpected content in {d}/{name}: {raw[:40]!r}")
            continue
        best.files_seen += 1
        if value is not None and (best.value is None or value < best.value):
            best.value, best.at = value, d
    return best


def _limited(ctx: GatherContext, lim: _Limit, fact: str, what: str, leaf: str, top: str, is_root: bool) -> bool | None:
    if lim.files_seen:
        return lim.value is not None
    if is_root:
        return False  # the root cgroup of a hierarchy has no limit files and no limits
    ctx.unknown(fact, f"no {what} file from {leaf} up to {top}: controller not enabled for this cgroup")
    return None


def _usage_int(ctx: GatherContext, d: str, name: str) -> int | None:
    raw = _read_raw(ctx, f"{d}/{name}")
    try:
        return int(raw.split()[0]) if raw else None
    except ValueError:
        return None


def _memory(ctx: GatherContext, lay: Layout) -> dict[str, Any] | None:
    leaf, top = lay.dirs.get("memory"), lay.tops.get("memory")
    if leaf is None or top is None:
        ctx.unknown("cgroup.memory", "no memory controller hierarchy is mounted")
        return None
    v1 = lay.version == 1
    dirs = _ancestors(leaf, top)
    max_name, cur_name = ("memory.limit_in_bytes", "memory.usage_in_bytes") if v1 else ("memory.max", "memory.current")
    lim = _smallest(ctx, dirs, max_name, lambda r: parse_limit(r, v1))
    at = lim.at or leaf
    out: dict[str, Any] = {
        "dir": leaf,
        "limited": _limited(ctx, lim, "cgroup.memory.max_bytes", max_name, leaf, top, is_root=lay.at_root("memory")),
        "max_bytes": lim.value,
        "max_source": f"{at}/{max_name}",
        "current_bytes": _usage_int(ctx, at, cur_name),
        "current_source": f"{at}/{cur_name}",
    }
    if v1:
        out["peak_bytes"] = _usage_int(ctx, at, "memory.max_usage_in_bytes")
        memsw = _smallest(ctx, dirs, "memory.memsw.limit_in_bytes", lambda r: parse_limit(r, True))
        out["high_bytes"] = None
        out["swap_max_bytes"] = (memsw.value - lim.value) if memsw.value is not None and lim.value is not None else None
        out["swap_accounting"] = memsw.files_seen > 0
        events_file = f"{at}/memory.oom_control"
        events = parse_keyed(ctx.read_text(events_file) or "")
        out["oom_kill_events"] = events.get("oom_kill")
        out["max_events"] = _usage_int(ctx, at, "memory.failcnt")
    else:
        out["peak_bytes"] = _usage_int(ctx, at, "memory.peak")
        out["high_bytes"] = _smallest(ctx, dirs, "memory.high", parse_limit).value
        swap = _smallest(ctx, dirs, "memory.swap.max", parse_limit)
        out["swap_max_bytes"] = swap.value
        out["swap_accounting"] = swap.files_seen > 0
        events_file = f"{at}/memory.events"
        events = parse_keyed(ctx.read_text(events_file) or "")
        out["oom_kill_events"] = events.get("oom_kill")
        out["max_events"] = events.get("max")
    out["oom_events"] = events.get("oom")
    out["events_source"] = events_file
    stat = parse_keyed(ctx.read_text(f"{at}/memory.stat") or "")
    out["inactive_file_bytes"] = stat.get("total_inactive_file" if v1 else "inactive_file")
    cur, cache = out["current_bytes"], out["inactive_file_bytes"]
    # What kubelet and the OOM killer care about: usage less the page cache the kernel can drop.
    out["working_set_bytes"] = max(0, cur - cache) if cur is not None and cache is not None else cur
    return out


def _pids(ctx: GatherContext, lay: Layout) -> dict[str, Any] | None:
    leaf, top = lay.dirs.get("pids"), lay.tops.get("pids")
    if leaf is None or top is None:
        ctx.unknown("cgroup.pids", "no pids controller hierarchy is mounted")
        return None
    lim = _smallest(ctx, _ancestors(leaf, top), "pids.max", parse_limit)
    at = lim.at or leaf
    events = parse_keyed(ctx.read_text(f"{at}/pids.events") or "")
    return {
        "dir": leaf,
        "limited": _limited(ctx, lim, "cgroup.pids.max", "pids.max", leaf, top, is_root=lay.at_root("pids")),
        "max": lim.value,
        "max_source": f"{at}/pids.max",
        "current": _usage_int(ctx, at, "pids.current"),
        "current_source": f"{at}/pids.current",
        "max_events": events.get("max"),
        "events_source": f"{at}/pids.events",
    }


def cpu_limits(ctx: GatherContext, lay: Layout, record: bool = True) -> dict[str, Any] | None:
    """CPU quota (as a number of CPUs) and cpuset of this cgroup; shared with the cpu gatherer."""
    leaf, top = lay.dirs.get("cpu"), lay.tops.get("cpu")
    if leaf is None or top is None:
        if record:
            ctx.unknown("cgroup.cpu", "no cpu controller hierarchy is mounted")
        return None
    best: tuple[float, int, int, str] | None = None
    seen = 0
    for d in _ancestors(leaf, top):
        if lay.version == 1:
            q, p = _read_raw(ctx, f"{d}/cpu.cfs_quota_us"), _read_raw(ctx, f"{d}/cpu.cfs_period_us")
            raw = f"{q} {p}" if q is not None and p is not None else None
            source = f"{d}/cpu.cfs_quota_us"
        else:
            raw, source = _read_raw(ctx, f"{d}/cpu.max"), f"{d}/cpu.max"
        if raw is None:
            continue
        try:
            quota, period = parse_cpu_max(raw)
        except (ValueError, IndexError):
            continue
        seen += 1
        if quota is not None and quota > 0 and period > 0 and (best is None or quota / period < best[0]):
            best = (quota / period, quota, period, source)
    out: dict[str, Any] = {"dir": leaf, "limited": best is not None if seen or lay.at_root("cpu") else None}
    out["quota_us"], out["period_us"] = (best[1], best[2]) if best else (None, None)
    out["quota_cpus"] = round(best[0], 3) if best else None
    out["quota_source"] = best[3] if best else None
    cpuset_dir = lay.dirs.get("cpuset", leaf)
    name = "cpuset.effective_cpus" if lay.version == 1 else "cpuset.cpus.effective"
    raw = _read_raw(ctx, f"{cpuset_dir}/{name}")
    out["cpuset"] = raw or None
    out["cpuset_count"] = len(parse_ranges(raw)) if raw else None
    out["cpuset_source"] = f"{cpuset_dir}/{name}" if raw else None
    if out["limited"] is None and record:
        ctx.unknown("cgroup.cpu.quota_cpus", f"no CPU quota file from {leaf} up to {top}")
    return out


def gather(ctx: GatherContext) -> dict[str, Any]:
    lay = locate(ctx)
    out: dict[str, Any] = {"version": lay.version, "hybrid": lay.hybrid, "path": lay.path}
    if lay.version is None:
        ctx.unknown("cgroup.version", "no cgroup hierarchy found in /proc/self/cgroup and /proc/self/mountinfo")
        out.update(memory=None, pids=None, cpu=None)
        return out
    out["memory"] = _memory(ctx, lay)
    out["pids"] = _pids(ctx, lay)
    out["cpu"] = cpu_limits(ctx, lay)
    return out
