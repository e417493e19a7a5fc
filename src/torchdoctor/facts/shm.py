"""/dev/shm: is it mounted, how big, how full, and what torch left behind in it."""

from __future__ import annotations

import os
from typing import Any

from .context import GatherContext
from .mounts import mount_for, parse_mountinfo

SHM = "/dev/shm"
_SCAN_LIMIT = 20000


def gather(ctx: GatherContext) -> dict[str, Any]:
    out: dict[str, Any] = {"path": SHM, "exists": ctx.path(SHM).is_dir()}
    mountinfo = ctx.read_text("/proc/self/mountinfo", fact="shm.mount")
    mount = None
    if mountinfo is not None:
        mount = mount_for(SHM, parse_mountinfo(mountinfo))
    out["mounted"] = bool(mount and mount.mount_point == SHM)
    out["mount"] = mount.to_dict() if mount else None
    out["fstype"] = mount.fstype if mount else None
    out["mount_size_option"] = mount.option("size") if mount else None
    if not out["exists"]:
        for key in ("size_bytes", "free_bytes", "used_bytes", "inodes_free"):
            out[key] = None
        ctx.unknown("shm.size_bytes", f"{SHM} does not exist")
        return out
    try:
        st = os.statvfs(ctx.path(SHM))
        out["size_bytes"] = st.f_blocks * st.f_frsize
        out["free_bytes"] = st.f_bavail * st.f_frsize
        out["used_bytes"] = (st.f_blocks - st.f_bfree) * st.f_frsize
        out["inodes_free"] = st.f_favail
    except OSError as exc:
        for key in ("size_bytes", "free_bytes", "used_bytes", "inodes_free"):
            out[key] = None
        ctx.unknown("shm.size_bytes", f"statvfs({SHM}) failed: {exc.strerror}")
    out["torch_segments"] = _torch_segments(ctx)
    return out


def _torch_segments(ctx: GatherContext) -> dict[str, Any] | None:
    """Count ``torch_*`` segments (file_system strategy) lying in /dev/shm, and their bytes."""
    count = size = 0
    owners: set[str] = set()
    try:
        with os.scandir(ctx.path(SHM)) as it:
            for i, entry in enumerate(it):
                if i >= _SCAN_LIMIT:
                    break
                if entry.name.startswith("torch_"):
                    count += 1
                    try:
                        size += entry.stat(follow_symlinks=False).st_blocks * 512
                    except OSError:
                        pass
                    parts = entry.name.split("_")
                    if len(parts) > 1 and parts[1].isdigit():
                        owners.add(parts[1])
    except OSError as exc:
        ctx.unknown("shm.torch_segments", f"cannot list {SHM}: {exc.strerror}")
        return None
    alive = sorted(int(p) for p in owners if ctx.path(f"/proc/{p}").exists())
    return {
        "count": count,
        "bytes": size,
        "owner_pids": sorted(int(p) for p in owners)[:50],
        "owners_alive": alive[:50],
    }
