"""Host memory: RAM, swap and the commit charge, from ``/proc/meminfo``.

Read through the context (so a fixture root can stand in for a machine); on the live host the
numbers are those ``psutil`` reports, which reads the same file. Field meanings: kernel
``Documentation/filesystems/proc.rst`` (meminfo) and ``Documentation/mm/overcommit-accounting.rst``
(CommitLimit, Committed_AS). The overcommit policy itself is a sysctl, gathered in the ``limits``
section (``limits.sysctl.vm.overcommit_memory``).
"""

from __future__ import annotations

from typing import Any

from .context import GatherContext

#: /proc/meminfo key → fact name (values there are in kB, i.e. KiB).
_MEMINFO = {
    "MemTotal": "total_bytes",
    "MemAvailable": "available_bytes",
    "MemFree": "free_bytes",
    "SwapTotal": "swap_total_bytes",
    "SwapFree": "swap_free_bytes",
    "Shmem": "shmem_bytes",
    "CommitLimit": "commit_limit_bytes",
    "Committed_AS": "committed_bytes",
}


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` as key → bytes (``MemTotal:  24684084 kB`` → 25276502016)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if not parts or not parts[0].isdigit():
            continue
        unit = parts[1].lower() if len(parts) > 1 else ""
        out[key.strip()] = int(parts[0]) * (1024 if unit == "kb" else 1)
    return out


def gather(ctx: GatherContext) -> dict[str, Any]:
    out: dict[str, Any] = {"source": "/proc/meminfo"}
    text = ctx.read_text("/proc/meminfo", fact="memory")
    info = parse_meminfo(text) if text is not None else {}
    for key, name in _MEMINFO.items():
        out[name] = info.get(key)
        if out[name] is None and text is not None:
            ctx.unknown(f"memory.{name}", f"/proc/meminfo has no {key} line")
    return out
