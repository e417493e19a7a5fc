"""Process limits: rlimits, the kernel limits behind them, and what this process already uses.

Section ``limits`` (typed in :mod:`.schema` as ``LimitsFacts``; summary)::

    rlimits:          {nofile|as|data|memlock|nproc|stack: RLimit | None}
        RLimit = {"soft": int | None, "hard": int | None,
                  "soft_unlimited": bool, "hard_unlimited": bool}
        An unlimited value (RLIM_INFINITY) is ``null`` with its ``*_unlimited`` flag true; a limit
        that could not be read is ``null`` as a whole, with the reason under ``unknown``. So
        ``facts.limits.rlimits.nofile.soft is None`` means "no number to compare with" either
        way; look at the flag to tell unlimited from unknown (``as`` is ``rlimits.as_``).
    rlimits_source:   "resource.getrlimit" (live) or "/proc/self/limits" (a replayed root)
    sysctl:           {"vm": {"max_map_count", "overcommit_memory", "overcommit_ratio"},
                       "fs": {"file-max", "nr_open"}, "kernel": {"shmmax", "shmall"}}
        Keys are the sysctl names split at the first dot, read from /proc/sys; each int or None.
    process:          {"open_fds": int | None, "map_count": int | None,
                       "page_size": int | None, "cap_sys_resource": bool | None}
        ``open_fds`` counts /proc/self/fd, less the descriptor used to list it (a replayed root's
        entries are counted as they are);
        ``map_count`` counts the lines of /proc/self/maps, the number ``vm.max_map_count`` bounds;
        ``cap_sys_resource``: whether this process may raise a hard rlimit (CapEff bit 24).

These describe the torchdoctor process, which inherits the limits of the shell or job that starts
it; a training process started the same way has the same limits but more open files and mappings.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .context import GatherContext
from .procs import count_fds, count_maps

#: rlimit key -> (name of the resource constant, row title in /proc/self/limits).
RLIMITS: dict[str, tuple[str, str]] = {
    "nofile": ("RLIMIT_NOFILE", "Max open files"),
    "as": ("RLIMIT_AS", "Max address space"),
    "data": ("RLIMIT_DATA", "Max data size"),
    "memlock": ("RLIMIT_MEMLOCK", "Max locked memory"),
    "nproc": ("RLIMIT_NPROC", "Max processes"),
    "stack": ("RLIMIT_STACK", "Max stack size"),
}

SYSCTLS: dict[str, tuple[str, ...]] = {
    "vm": ("max_map_count", "overcommit_memory", "overcommit_ratio"),
    "fs": ("file-max", "nr_open"),
    "kernel": ("shmmax", "shmall"),
}

CAP_SYS_RESOURCE = 24


def rlimit(soft: int | None, hard: int | None, infinity: int | None) -> dict[str, Any]:
    """One RLimit record; ``infinity`` is the value that means unlimited (RLIM_INFINITY)."""
    soft_unl, hard_unl = soft is not None and soft == infinity, hard is not None and hard == infinity
    return {
        "soft": None if soft_unl else soft,
        "hard": None if hard_unl else hard,
        "soft_unlimited": soft_unl,
        "hard_unlimited": hard_unl,
    }


def _live_rlimits(ctx: GatherContext) -> dict[str, Any]:
    import resource

    out: dict[str, Any] = {}
    for key, (const, _) in RLIMITS.items():
        which = getattr(resource, const, None)
        if which is None:
            out[key] = None
            ctx.unknown(f"limits.rlimits.{key}", f"resource.{const} does not exist on this platform")
            continue
        try:
            soft, hard = resource.getrlimit(which)
        except (OSError, ValueError) as exc:
            out[key] = None
            ctx.unknown(f"limits.rlimits.{key}", f"getrlimit({const}) failed: {exc}")
            continue
        out[key] = rlimit(soft, hard, resource.RLIM_INFINITY)
    return out


def _limit_value(text: str) -> int | None:
    return None if text == "unlimited" else int(text)


def parse_proc_limits(text: str) -> dict[str, dict[str, Any]]:
    """The rows of /proc/<pid>/limits we use (``Max open files  1024  4096  files``)."""
    rows: dict[str, dict[str, Any]] = {}
    titles = {title: key for key, (_, title) in RLIMITS.items()}
    for line in text.splitlines():
        for title, key in titles.items():
            if not line.startswith(title + " "):
                continue
            fields = line[len(title) :].split()
            if len(fields) < 2:
                continue
            try:
                soft, hard = _limit_value(fields[0]), _limit_value(fields[1])
            except ValueError:
                continue
            rows[key] = {"soft": soft, "hard": hard, "soft_unlimited": soft is None, "hard_unlimited": hard is None}
    return rows


def _replayed_rlimits(ctx: GatherContext) -> dict[str, Any]:
    text = ctx.read_text("/proc/self/limits", fact="limits.rlimits")
    rows = parse_proc_limits(text) if text is not None else {}
    out: dict[str, Any] = {}
    for key in RLIMITS:
        out[key] = rows.get(key)
        if out[key] is None and text is not None:
            ctx.unknown(f"limits.rlimits.{key}", f"no {RLIMITS[key][1]!r} row in /proc/self/limits")
    return out


def _sysctls(ctx: GatherContext) -> dict[str, dict[str, int | None]]:
    out: dict[str, dict[str, int | None]] = {}
    for group, names in SYSCTLS.items():
        out[group] = {
            name: ctx.read_int(f"/proc/sys/{group}/{name}", fact=f"limits.sysctl.{group}.{name}") for name in names
        }
    return out


def _open_fds(ctx: GatherContext) -> int | None:
    # listing /proc/self/fd opens a descriptor that shows up in the listing itself
    n = count_fds(ctx.path("/proc/self"), listing_self=_is_live(ctx))
    if n is None:
        ctx.unknown("limits.process.open_fds", "cannot list /proc/self/fd")
    return n


def _map_count(ctx: GatherContext) -> int | None:
    n = count_maps(ctx.path("/proc/self"))
    if n is None:
        ctx.unknown("limits.process.map_count", "cannot read /proc/self/maps")
    return n


def parse_cap_eff(status: str) -> int | None:
    """The effective capability mask from /proc/<pid>/status (``CapEff:\\t000001ffffffffff``)."""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            try:
                return int(line.split(":", 1)[1].strip(), 16)
            except ValueError:
                return None
    return None


def _cap_sys_resource(ctx: GatherContext) -> bool | None:
    status = ctx.read_text("/proc/self/status", fact="limits.process.cap_sys_resource")
    mask = parse_cap_eff(status) if status is not None else None
    if mask is None:
        if status is not None:
            ctx.unknown("limits.process.cap_sys_resource", "no CapEff line in /proc/self/status")
        return None
    return bool(mask >> CAP_SYS_RESOURCE & 1)


def _page_size() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _is_live(ctx: GatherContext) -> bool:
    return Path(ctx.root) == Path("/")


def gather(ctx: GatherContext) -> dict[str, Any]:
    live = _is_live(ctx)
    return {
        "rlimits": _live_rlimits(ctx) if live else _replayed_rlimits(ctx),
        "rlimits_source": "resource.getrlimit" if live else "/proc/self/limits",
        "sysctl": _sysctls(ctx),
        "process": {
            "open_fds": _open_fds(ctx),
            "map_count": _map_count(ctx),
            "page_size": _page_size(),
            "cap_sys_resource": _cap_sys_resource(ctx),
        },
    }
