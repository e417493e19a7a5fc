"""Per-process facts from ``/proc/<pid>``: the one reader of them (limits, supervise, the loader probe
and ``watch`` all use these). Each takes the process's ``/proc`` directory, so a replayed root works
(``ctx.path("/proc/self")``), and returns None when the process is gone or unreadable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def proc_dir(pid: int | str) -> Path:
    return Path(f"/proc/{pid}")


def count_fds(proc: Path, listing_self: bool = False) -> int | None:
    """Open descriptors (entries of ``fd/``); ``listing_self``: less the one listing it opens."""
    try:
        n = len(os.listdir(proc / "fd"))
    except OSError:
        return None
    return max(n - 1, 0) if listing_self else n


def count_maps(proc: Path) -> int | None:
    """Memory mappings (lines of ``maps``): what ``vm.max_map_count`` bounds."""
    try:
        with open(proc / "maps", "rb") as fh:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    except OSError:
        return None


def read_limits(proc: Path) -> str | None:
    try:
        return (proc / "limits").read_text()
    except OSError:
        return None


def soft_limits(proc: Path) -> dict[str, int | None]:
    """The process's soft rlimits by key (``nofile``, ``as``, ...); None: unlimited. Empty: unreadable."""
    from .limits import parse_proc_limits

    text = read_limits(proc)
    return {key: row["soft"] for key, row in parse_proc_limits(text).items()} if text else {}


@dataclass(frozen=True)
class Stat:
    """What ``/proc/<pid>/stat`` says, in useful units."""

    pid: int
    comm: str
    state: str
    ppid: int
    cpu_seconds: float
    """User plus system time."""
    threads: int
    start_ticks: int
    """Start time in clock ticks since boot (with the pid, identifies the process)."""
    rss_bytes: int
    vsize_bytes: int
    """Virtual memory size: what RLIMIT_AS bounds."""


def read_stat(proc: Path) -> Stat | None:
    try:
        raw = (proc / "stat").read_bytes().decode(errors="replace")
    except OSError:
        return None
    try:
        head, _, rest = raw.rpartition(")")
        pid_text, _, comm = head.partition(" (")
        f = rest.split()
        return Stat(
            pid=int(pid_text),
            comm=comm,
            state=f[0],
            ppid=int(f[1]),
            cpu_seconds=(int(f[11]) + int(f[12])) / CLOCK_TICKS,
            threads=int(f[17]),
            start_ticks=int(f[19]),
            rss_bytes=int(f[21]) * PAGE_SIZE,
            vsize_bytes=int(f[20]),
        )
    except (ValueError, IndexError):
        return None


def proc_memory(pid: int) -> dict[str, int] | None:
    """RSS, PSS and USS (private clean + dirty) of a process, in bytes, from smaps_rollup."""
    fields: dict[str, int] = {}
    try:
        with open(proc_dir(pid) / "smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if rest.strip().endswith("kB"):
                    fields[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        return None
    uss = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
    return {"rss": fields.get("Rss", 0), "pss": fields.get("Pss", fields.get("Rss", 0)), "uss": uss}


def cmdline(proc: Path) -> list[str]:
    try:
        raw = (proc / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def children_map() -> dict[int, list[int]]:
    """ppid -> pids, for every process on the host (one pass over ``/proc``)."""
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                raw = fh.read()
            ppid = int(raw[raw.rindex(b")") + 2 :].split(None, 2)[1])
        except (OSError, ValueError):
            continue
        out.setdefault(ppid, []).append(int(name))
    return out


def tree(root: int) -> list[int]:
    """``root`` and every descendant still alive, parents before children."""
    kids = children_map()
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo.extend(sorted(kids.get(pid, [])))
    return out
