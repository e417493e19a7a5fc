"""Paths a run will write (checkpoint, log and data directories given with ``--path``).

For each path: does it exist, is it a directory, can it be created, can this process really write
in it (a temp file is created and removed: root ignores mode bits, so asking is not enough), how
much space and how many inodes are free, and which mount and file-system type it lives on.

Observe, never mutate: no directory is ever created, and the only file ever written is one
uniquely named probe file that is removed again at once. Each path is examined in its own
thread with a deadline, so one hung network mount does not hide the others.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import threading
import time
from pathlib import Path
from typing import Any

from .context import GatherContext
from .mounts import Mount, mount_for, parse_mountinfo

PROBE_PREFIX = ".torchdoctor-write-test-"

#: File systems whose data lives on (or is coordinated by) other machines.
NETWORK_FS = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "cifs",
        "smb3",
        "smbfs",
        "gpfs",
        "beegfs",
        "9p",
        "ceph",
        "afs",
        "panfs",
        "orangefs",
        "pvfs2",
        "wekafs",
        "glusterfs",
        "virtiofs",
        "gfs2",
        "ocfs2",
        "davfs",
    }
)
#: Union file systems: a container's writable layer.
OVERLAY_FS = frozenset({"overlay", "aufs", "fuse.fuse-overlayfs"})
#: Memory-backed file systems.
MEMORY_FS = frozenset({"tmpfs", "ramfs"})

_FS_KEYS = ("free_bytes", "total_bytes", "inodes_free", "inodes_total", "read_only", "fsid")


def fs_kind(fstype: str | None) -> str | None:
    """``local``, ``network``, ``fuse``, ``overlay`` or ``memory`` (None when the type is unknown)."""
    if not fstype:
        return None
    if fstype in OVERLAY_FS:
        return "overlay"
    if fstype in NETWORK_FS:
        return "network"
    if fstype == "fuse" or fstype.startswith("fuse."):
        return "fuse"
    if fstype in MEMORY_FS:
        return "memory"
    return "local"


def _os_error(exc: OSError, step: str) -> dict[str, Any]:
    num = exc.errno
    return {
        "step": step,
        "errno": errno.errorcode.get(num, str(num)) if num is not None else None,
        "errno_num": num,
        "message": exc.strerror or str(exc),
    }


def write_probe(directory: Path) -> dict[str, Any]:
    """Create, write one byte to, fsync, close and remove a uniquely named file in ``directory``.

    Returns ``{"ok": True}`` or ``{"ok": False, "step", "errno", "errno_num", "message"}``; if the
    probe file could not be removed again its path is in ``left_behind``. Nothing else is touched.
    """
    target = directory / f"{PROBE_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    result: dict[str, Any] = {"ok": True}
    fd: int | None = None
    created = False
    step = "open"
    try:
        fd = os.open(target, flags, 0o600)
        created = True
        step = "write"
        if os.write(fd, b"\0") != 1:
            raise OSError(errno.EIO, "short write")
        step = "fsync"
        os.fsync(fd)
        step = "close"
        closing, fd = fd, None
        os.close(closing)  # NFS reports EDQUOT/ENOSPC only here on some servers
        step = "unlink"
        os.unlink(target)
        created = False
    except OSError as exc:
        result = {"ok": False, **_os_error(exc, step)}
    finally:
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
        if created:
            try:
                os.unlink(target)
            except OSError:
                result["left_behind"] = str(target)
    return result


def _statvfs(local: Path) -> dict[str, Any]:
    st = os.statvfs(local)
    inodes_known = st.f_files > 0  # btrfs and some network file systems report no inode count
    blocks_known = st.f_blocks > 0  # pseudo file systems (proc, sysfs) report no size at all
    return {
        "free_bytes": st.f_bavail * st.f_frsize if blocks_known else None,
        "total_bytes": st.f_blocks * st.f_frsize if blocks_known else None,
        "inodes_free": st.f_favail if inodes_known else None,
        "inodes_total": st.f_files if inodes_known else None,
        "read_only": bool(st.f_flag & os.ST_RDONLY),
        "fsid": st.f_fsid,
    }


def _to_host(ctx: GatherContext, local: str) -> str:
    """A path under ``ctx.root`` as the host (or recorded machine) names it."""
    root = os.path.realpath(ctx.root)
    if root == "/":
        return local
    rel = os.path.relpath(local, root)
    if rel.startswith(".."):
        return local
    return "/" if rel == "." else "/" + rel


def _nearest_existing(local: Path) -> tuple[Path, int]:
    """The closest ancestor that exists (without following a dangling last link), and the levels missing."""
    current, levels = local, 0
    while not os.path.lexists(current) and current != current.parent:
        current, levels = current.parent, levels + 1
    return current, levels


def _owner(st: os.stat_result) -> dict[str, Any]:
    return {"uid": st.st_uid, "gid": st.st_gid, "mode": f"{stat.S_IMODE(st.st_mode):04o}"}


def _mount_facts(ctx: GatherContext, local: Path, mounts: list[Mount] | None) -> dict[str, Any]:
    if mounts is None:
        return {"mount": None, "fstype": None, "fs_kind": None, "mount_read_only": None}
    host_real = _to_host(ctx, os.path.realpath(local))
    mount = mount_for(host_real, mounts)
    if mount is None:
        return {"mount": None, "fstype": None, "fs_kind": None, "mount_read_only": None}
    return {
        "mount": mount.to_dict(),
        "fstype": mount.fstype,
        "fs_kind": fs_kind(mount.fstype),
        "mount_read_only": mount.read_only,
    }


def examine(ctx: GatherContext, raw: str, index: int, mounts: list[Mount] | None) -> dict[str, Any]:
    """Everything about one ``--path`` (see the module docstring)."""
    fact = f"paths.entries[{index}]"
    abspath = os.path.abspath(raw)
    local = ctx.path(abspath)
    entry: dict[str, Any] = {
        "path": raw,
        "abspath": abspath,
        "exists": None,
        "is_dir": None,
        "is_symlink": os.path.islink(local),
        "writable": None,
        "creatable": None,
        "nearest_existing": None,
        "missing_levels": 0,
        "write_test": None,
        "owner": None,
        "stat_error": None,
        "fs": None,
        "timed_out": False,
    }
    try:
        st = os.stat(local)
    except (FileNotFoundError, NotADirectoryError):
        entry["exists"] = False
    except OSError as exc:
        entry["stat_error"] = _os_error(exc, "stat")
        entry["write_test"] = {"ok": False, "where": abspath, **entry["stat_error"]}
        ctx.unknown(f"{fact}.exists", f"stat({abspath}) failed: {exc.strerror or exc}")
        return {**entry, **_mount_facts(ctx, local, mounts)}
    else:
        entry["exists"], entry["is_dir"], entry["owner"] = True, stat.S_ISDIR(st.st_mode), _owner(st)

    probe_dir = local
    if entry["exists"]:
        if entry["is_dir"]:
            entry["write_test"] = {"where": abspath, **write_probe(local)}
            entry["writable"] = entry["write_test"]["ok"]
    else:
        probe_dir, levels = _nearest_existing(local)
        entry["nearest_existing"] = _to_host(ctx, str(probe_dir))
        entry["missing_levels"] = levels
        try:
            anc = os.stat(probe_dir)
            entry["owner"] = _owner(anc)
            if stat.S_ISDIR(anc.st_mode):
                entry["write_test"] = {"where": entry["nearest_existing"], **write_probe(probe_dir)}
            else:
                not_dir = OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
                entry["write_test"] = {"ok": False, "where": entry["nearest_existing"], **_os_error(not_dir, "mkdir")}
            entry["creatable"] = entry["write_test"]["ok"]
        except OSError as exc:  # a dangling symlink as the nearest entry, or no search permission
            entry["write_test"] = {"ok": False, "where": entry["nearest_existing"], **_os_error(exc, "stat")}
            entry["creatable"] = False

    try:
        entry["fs"] = {"checked_at": _to_host(ctx, str(probe_dir)), **_statvfs(probe_dir)}
    except OSError as exc:
        ctx.unknown(f"{fact}.fs", f"statvfs({_to_host(ctx, str(probe_dir))}) failed: {exc.strerror or exc}")
    return {**entry, **_mount_facts(ctx, probe_dir, mounts)}


def _timed_out(raw: str, seconds: float) -> dict[str, Any]:
    return {
        "path": raw,
        "abspath": os.path.abspath(raw),
        "timed_out": True,
        "timeout_seconds": round(seconds, 2),
        "exists": None,
        "is_dir": None,
        "writable": None,
        "creatable": None,
        "write_test": None,
        "fs": None,
        "mount": None,
        "fstype": None,
        "fs_kind": None,
        "mount_read_only": None,
    }


def gather(ctx: GatherContext) -> dict[str, Any]:
    out: dict[str, Any] = {"euid": os.geteuid(), "egid": os.getegid(), "probe_prefix": PROBE_PREFIX, "entries": []}
    if not ctx.paths:
        return out
    text = ctx.read_text("/proc/self/mountinfo", fact="paths.mounts")
    mounts = parse_mountinfo(text) if text is not None else None

    results: dict[int, dict[str, Any]] = {}
    errors: dict[int, str] = {}

    def work(i: int, raw: str) -> None:
        try:
            results[i] = examine(ctx, raw, i, mounts)
        except Exception as exc:  # noqa: BLE001 - one odd path must not lose the others
            errors[i] = f"{type(exc).__name__}: {exc}"

    budget = max(0.5, ctx.section_timeout * 0.75)  # finish inside the section's own timeout
    started = time.monotonic()
    threads = [
        threading.Thread(target=work, args=(i, raw), name=f"torchdoctor-path-{i}", daemon=True)
        for i, raw in enumerate(ctx.paths)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, started + budget - time.monotonic()))
    for i, raw in enumerate(ctx.paths):
        if i in results:
            out["entries"].append(results[i])
        elif i in errors:
            ctx.unknown(f"paths.entries[{i}]", errors[i])
            out["entries"].append({**_timed_out(raw, 0), "timed_out": False, "error": errors[i]})
        else:
            ctx.unknown(f"paths.entries[{i}]", f"examining {raw} did not finish within {budget:.1f} s")
            out["entries"].append(_timed_out(raw, budget))
    return out
