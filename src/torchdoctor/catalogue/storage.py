"""TD60x: the paths a run reads and writes (checkpoint, log and data directories given with --path)."""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from typing import Any

from ..facts import Facts
from ..facts.schema import FsInfo, Mount, PathEntry, WriteTest
from ..model import Evidence, Severity
from ..options import CheckOptions
from ..registry import Code, Hit, register
from ._util import OWN_DIRECTORY, ev, human_bytes, is_system_path, system_root

GiB = 1024**3
#: With no --expect-bytes, less than this free is worth a warning: one checkpoint with optimizer state is often more.
LOW_SPACE_FLOOR = 1 * GiB
#: Inodes are "nearly exhausted" below both of these.
INODES_LOW_ABS, INODES_LOW_FRACTION = 50_000, 0.05
_SPACE_ERRNOS = ("ENOSPC", "EDQUOT")


# -- reading the facts --------------------------------------------------------------------------
def _entries(facts: Facts) -> list[PathEntry]:
    return list(facts.paths.entries)


def _name(e: PathEntry) -> str:
    return str(e.abspath or e.path)


def _failed(e: PathEntry) -> WriteTest | None:
    """The failed write test (in the directory, or in its nearest ancestor when missing), if any."""
    return e.write_test if e.write_test.ok is False else None


def _errno(e: PathEntry) -> str | None:
    wt = _failed(e)
    return wt.errno if wt else None


def _mount(e: PathEntry) -> Mount:
    return e.mount


def _fs(e: PathEntry) -> FsInfo:
    return e.fs


def _ev_write(e: PathEntry) -> Evidence:
    wt = e.write_test
    where = wt.where or _name(e)
    if wt.ok:
        return ev("write test", f"created and removed a file in {where}", "open(O_CREAT|O_EXCL), write, fsync, unlink")
    return ev("write test", f"{wt.errno} at {wt.step}(): {wt.message}", f"probe file in {where}")


def _ev_mount(e: PathEntry) -> Evidence:
    m = e.mount
    value = f"{m.mount_point} ({m.fstype} from {m.source}; {','.join(m.options[:8])})"
    return ev("mount", value, "/proc/self/mountinfo")


def _ev_space(e: PathEntry) -> Evidence:
    fs = e.fs
    return ev(
        "free space", f"{human_bytes(fs.free_bytes)} of {human_bytes(fs.total_bytes)}", f"statvfs({fs.checked_at})"
    )


def _groups(entries: list[PathEntry]) -> list[list[PathEntry]]:
    """Entries grouped by the file system they live on (they share its free space)."""
    groups: dict[Any, list[PathEntry]] = {}
    for e in entries:
        fs = e.fs
        key = (
            ("fsid", fs.fsid, fs.total_bytes)
            if fs.fsid
            else ("mount", e.mount.mount_point or fs.checked_at or _name(e))
        )
        groups.setdefault(key, []).append(e)
    return list(groups.values())


def _untouchable(e: PathEntry, where: str) -> str | None:
    """Why a fix must not change ``where`` (owner, mode, attributes), or None when it may.

    System paths are never changed, and neither is a symbolic link: chown and chattr act on its target.
    """
    if is_system_path(where):
        return f"{where} belongs to the system"
    if e.is_symlink and where == _name(e):
        return f"{where} is a symbolic link (a change would apply to whatever it points to)"
    return None


def _remedy(code: str | None, e: PathEntry, where: str) -> str:
    """The errno-specific part of a fix. Never destructive: nothing is moved, deleted or changed recursively,
    and a system path or a symbolic link is never changed at all (see :func:`_untouchable`)."""
    owner = e.owner
    mp = e.mount.mount_point or "the mount"
    hands_off = _untouchable(e, where)
    uid = owner.uid if owner.uid is not None else "UID"
    gid = owner.gid if owner.gid is not None else "GID"
    container = (
        f"in a container run as the volume's owner (`docker run --user {uid}:{gid}`, Kubernetes "
        "`securityContext.fsGroup`)"
    )
    if hands_off:
        eacces = f"{hands_off}: leave its owner and mode as they are and write under {OWN_DIRECTORY}, or {container}"
        eperm = (
            f"`lsattr -d {where}` shows an immutable (`i`) or append-only (`a`) attribute, `ls -Zd {where}` and "
            f"`ausearch -m avc` an SELinux/AppArmor denial; {hands_off}, so leave them as they are and write "
            f"under {OWN_DIRECTORY}"
        )
    else:
        eacces = (
            f"`sudo chown $(id -u):$(id -g) {where}` (this directory only; or `chmod u+w {where}` if you own it), "
            f"or {container}"
        )
        eperm = (
            f"`lsattr -d {where}`: if it shows `i` (immutable) or `a` (append-only), `sudo chattr -i -a {where}`; "
            f"otherwise look for an SELinux/AppArmor denial (`ls -Zd {where}`, `ausearch -m avc`; Docker volumes "
            "need the `:z` suffix under SELinux)"
        )
    return {
        "EACCES": eacces,
        "EPERM": eperm,
        "EROFS": f"{mp} is mounted read-only (see TD605): write to a writable volume",
        "ENOSPC": "the file system is full (see TD606)",
        "EDQUOT": "your quota is used up (see TD606)",
        "ESTALE": f"the NFS file handle is stale (the directory was removed or re-exported on the server): leave the "
        f"directory, remount {mp} or recreate the directory",
        "ENOTDIR": f"{where} is a file, not a directory: choose another path (and leave {where} as it is)",
    }.get(code or "", f"choose a directory on a writable, disk-backed file system instead of {where}")


# -- TD601-TD603: existence ---------------------------------------------------------------------
def _check_not_creatable(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    for e in _entries(facts):
        if e.exists is not False or e.creatable is not False:
            continue
        wt = _failed(e) or WriteTest()
        where = str(e.nearest_existing or wt.where)
        yield Hit(
            {
                "path": _name(e),
                "ancestor": where,
                "errno": wt.errno,
                "strerror": wt.message,
                "remedy": _remedy(wt.errno, e, where),
                "handover": _handover(e, wt.errno),
            },
            (ev("path", "does not exist", _name(e)), ev("nearest existing ancestor", where, "lstat"), _ev_write(e)),
        )


def _handover(e: PathEntry, errno_name: str | None) -> str:
    """TD601: how to create the directory for the training user, unless it would be under a system tree."""
    path = _name(e)
    root = system_root(path)
    if root is not None:
        return f"Do not create {path}: {root} belongs to the system. "
    if errno_name == "ENOTDIR":
        return ""
    return (
        f"Or create it as someone who may, and hand it over: `sudo mkdir -p {path} && sudo chown $(id -u):$(id -g) "
        f"{path}`. "
    )


TD601 = register(
    Code(
        code="TD601",
        name="path-not-creatable",
        family="checkpoint-io",
        severity=Severity.ERROR,
        area="storage",
        title="A path the run writes does not exist and cannot be created",
        message="{path} does not exist and cannot be created: writing in its nearest existing ancestor {ancestor} "
        "fails with {errno} ({strerror}).",
        fix="Point the run at a directory you can write (under $HOME, or the job's scratch directory). {handover}"
        "Here: {remedy}.",
        meaning="The directory is missing, and the process could not create a file in the closest directory that does "
        "exist, so neither `os.makedirs` nor the first `torch.save` will succeed.",
        why="A path typed for another machine or user, a parent owned by root, a read-only or full parent mount, or a "
        "file where a directory was expected.",
        false_positives="A job that runs as a different user (or in a container with another uid) than this check may "
        "have the permission this process lacks.",
        related=("TD602", "TD604", "TD605"),
        check=_check_not_creatable,
    )
)


def _check_missing(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    for e in _entries(facts):
        if e.exists is False and e.creatable is True:
            yield Hit(
                {"path": _name(e), "ancestor": e.nearest_existing, "levels": e.missing_levels},
                (
                    ev("path", "does not exist", _name(e)),
                    ev("nearest existing ancestor", e.nearest_existing, "lstat"),
                    _ev_write(e),
                ),
            )


TD602 = register(
    Code(
        code="TD602",
        name="path-missing",
        family="checkpoint-io",
        severity=Severity.INFO,
        area="storage",
        title="A path the run writes does not exist yet (but can be created)",
        message="{path} does not exist yet ({levels} level(s) below {ancestor}, which is writable); torch.save() does not "
        "create directories and raises FileNotFoundError.",
        fix='Create it before the first save: `os.makedirs("{path}", exist_ok=True)` (on rank 0 followed by a barrier '
        "when ranks share it), or `mkdir -p {path}`.",
        meaning="The directory can be created, but nothing in torch creates it for you.",
        why='`torch.save(obj, "ckpt/epoch1.pt")` opens the file directly; a missing parent is FileNotFoundError, '
        "often hours into a run at the first checkpoint.",
        false_positives="Lightning's ModelCheckpoint, the Hugging Face Trainer and most loggers create their own "
        "output directory; plain torch.save does not.",
        related=("TD601",),
        check=_check_missing,
    )
)


def _check_not_a_directory(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    for e in _entries(facts):
        if e.exists is True and e.is_dir is False:
            yield Hit(
                {"path": _name(e), "choice": _another_path(_name(e))},
                (ev("path", "exists, not a directory", f"stat({_name(e)})"),),
            )


def _another_path(path: str) -> str:
    """TD603: what to pass instead of a file. The file itself is never moved or replaced."""
    if is_system_path(path):
        return f"{path} belongs to the system, so leave it alone and choose {OWN_DIRECTORY}"
    parent = posixpath.dirname(path.rstrip("/")) or "/"
    return (
        f"if {path} is a checkpoint or log file, pass the directory it is in ({parent}); otherwise choose another "
        f"name for the directory and leave {path} as it is"
    )


TD603 = register(
    Code(
        code="TD603",
        name="path-not-a-directory",
        family="checkpoint-io",
        severity=Severity.ERROR,
        area="storage",
        title="A path given as a directory is a file",
        message="{path} exists but is not a directory; saving `{path}/<name>.pt` fails with NotADirectoryError.",
        fix="Point --path and the run at a directory, not at a file: {choice}. Then test it with "
        "`torchdoctor check --path DIR`.",
        meaning="--path names the directories a run writes into; this one is an existing file (or a link to one).",
        why="A checkpoint file name passed where a directory was expected, or an earlier run that wrote a file there.",
        false_positives="None when the path really is meant as a directory.",
        related=("TD601",),
        check=_check_not_a_directory,
    )
)


# -- TD604-TD605: writability -------------------------------------------------------------------
def _check_not_writable(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    euid = facts.paths.euid if facts.paths.euid is not None else "?"
    for e in _entries(facts):
        exists_dir = e.exists is True and e.is_dir is True
        if not (exists_dir or e.stat_error):
            continue
        wt = _failed(e)
        if not wt or wt.errno in ("EROFS", *_SPACE_ERRNOS):
            continue
        owner = e.owner
        evidence = [_ev_write(e), ev("process uid", euid, "geteuid()")]
        if owner:
            evidence.append(ev("owner and mode", f"{owner.uid}:{owner.gid} {owner.mode}", f"stat({_name(e)})"))
        yield Hit(
            {
                "path": _name(e),
                "euid": euid,
                "step": wt.step,
                "errno": wt.errno,
                "strerror": wt.message,
                "remedy": _remedy(wt.errno, e, _name(e)),
            },
            tuple(evidence),
        )


TD604 = register(
    Code(
        code="TD604",
        name="path-not-writable",
        family="checkpoint-io",
        severity=Severity.ERROR,
        area="storage",
        title="This process cannot write in a path the run writes",
        message="{path} is not writable by uid {euid}: creating a file there failed at {step}() with {errno} ({strerror}).",
        fix="Make the directory writable for the user that trains, or write elsewhere. Here: {remedy}.",
        meaning="A real write test (create, write, fsync and remove a uniquely named file) failed. Root ignores mode "
        "bits, so only a real write tells; EACCES is a permission problem, EPERM even for root means an "
        "immutable/append-only attribute or a security module.",
        why="Directories created by another user or by root in a container image, volumes mounted with another owner, "
        "`chattr +i`, SELinux labels on bind mounts, stale NFS handles.",
        false_positives="The training job may run as another user than this check (e.g. root here, a service account in "
        "the job).",
        related=("TD601", "TD605", "TD606"),
        check=_check_not_writable,
    )
)


def _read_only_how(e: PathEntry) -> str | None:
    if e.mount and e.mount_read_only:
        return "its mount options include ro"
    if e.fs.read_only:
        return "statvfs() reports ST_RDONLY"
    if _errno(e) == "EROFS":
        return "a write failed with EROFS (Read-only file system)"
    return None


def _check_read_only(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    for e in _entries(facts):
        how = _read_only_how(e)
        if how is None:
            continue
        m = e.mount
        mp = m.mount_point
        if not mp:
            volume, remount = "DIR", ""
        elif is_system_path(mp):
            volume, remount = (
                "DIR",
                (
                    f"; {mp} is a system mount, read-only on purpose (`docker run --read-only`, "
                    "Kubernetes `readOnlyRootFilesystem`, a read-only OS image): leave it so and "
                    "write to a volume mounted for the run"
                ),
            )
        else:
            volume, remount = (
                mp,
                (
                    f"; on a host `sudo mount -o remount,rw {mp}` (after `dmesg` and fsck if the "
                    "kernel remounted it read-only because of I/O errors)"
                ),
            )
        yield Hit(
            {
                "path": _name(e),
                "how": how,
                "mount_point": mp or "its mount",
                "fstype": m.fstype or "unknown type",
                "volume": volume,
                "remount": remount,
            },
            (_ev_mount(e), _ev_write(e)) if m else (_ev_write(e),),
        )


TD605 = register(
    Code(
        code="TD605",
        name="path-read-only-mount",
        family="checkpoint-io",
        severity=Severity.ERROR,
        area="storage",
        title="A path the run writes is on a read-only mount",
        message="{path} is on a read-only mount ({mount_point}, {fstype}): {how}.",
        fix="Write to a writable volume, or make this one writable: Docker `-v SRC:{volume}` without `:ro`; "
        "Kubernetes `readOnly: false` on the volumeMount (ConfigMap, Secret and projected volumes are always "
        "read-only){remount}.",
        meaning="Every write under this mount fails with EROFS (OSError: [Errno 30] Read-only file system).",
        why="Read-only bind mounts and container volumes, dataset mounts shared read-only, or a file system the kernel "
        "switched to read-only after errors (`errors=remount-ro`).",
        false_positives="A data directory that is only read is fine on a read-only mount; pass --path only for "
        "directories the run writes.",
        related=("TD604", "TD601"),
        check=_check_read_only,
    )
)


# -- TD606-TD609: space and inodes --------------------------------------------------------------
def _check_disk_full(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    for e in _entries(facts):
        wt = _failed(e)
        if not wt or wt.errno not in _SPACE_ERRNOS:
            continue
        fs = e.fs
        if wt.errno == "EDQUOT":
            detail = "the disk quota of this user, group or project on this file system is used up"
        elif fs.inodes_free == 0:
            detail = f"no inodes are left (0 of {fs.inodes_total}) although {human_bytes(fs.free_bytes)} is free"
        else:
            detail = f"{human_bytes(fs.free_bytes)} of {human_bytes(fs.total_bytes)} is free"
        yield Hit(
            {
                "path": _name(e),
                "where": wt.where,
                "errno": wt.errno,
                "strerror": wt.message,
                "detail": detail,
                **{k: v for k, v in _group_values([e]).items() if k in ("mount_point", "top")},
            },
            (_ev_write(e), _ev_space(e), ev("inodes free", fs.inodes_free, f"statvfs({fs.checked_at})")),
        )


TD606 = register(
    Code(
        code="TD606",
        name="path-disk-full",
        family="checkpoint-io",
        severity=Severity.ERROR,
        area="storage",
        title="A path the run writes has no space left (or its quota is used up)",
        message="{path}: writing one byte in {where} failed with {errno} ({strerror}); {detail}.",
        fix="Free space first: `du -xsh {top} | sort -h | tail`, delete old checkpoints and keep only the last "
        "few (Lightning `save_top_k`, Hugging Face `save_total_limit`), or write to a larger volume. EDQUOT: "
        "`quota -s` (Lustre: `lfs quota -u $USER {mount_point}`). No inodes: `df -i {mount_point}`.",
        meaning="Not even one byte can be written: torch.save fails with `OSError: [Errno 28] No space left on device` "
        "(or 122, quota exceeded) and may leave an empty or truncated file that later fails to load with "
        "`PytorchStreamReader failed reading zip archive: failed finding central directory`.",
        why="Checkpoints accumulate (every epoch, with optimizer state), logs and caches grow, quotas are per user or "
        "project, and many small files can use up the inodes before the space.",
        false_positives="A directory that is only read is unaffected.",
        related=("TD607", "TD609"),
        check=_check_disk_full,
    )
)


def _group_values(group: list[PathEntry]) -> dict[str, Any]:
    fs = group[0].fs
    mp = group[0].mount.mount_point or fs.checked_at or "/"
    return {
        "paths": ", ".join(_name(e) for e in group),
        "free": human_bytes(fs.free_bytes),
        "total": human_bytes(fs.total_bytes),
        "mount_point": mp,
        "top": mp.rstrip("/") + "/*",
    }


def _space_groups(facts: Facts) -> Iterator[tuple[int, list[PathEntry]]]:
    """(free bytes, directories) per file system the directories (existing or to be created) are on,
    skipping those TD606 reports as full."""
    for group in _groups([e for e in _entries(facts) if e.is_dir is not False]):
        free = group[0].fs.free_bytes
        if free is None or any(_errno(e) in _SPACE_ERRNOS for e in group):
            continue
        yield free, group


def _check_below_expected(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    if not opts.expect_bytes:
        return
    for free, group in _space_groups(facts):
        need = opts.expect_bytes * len(group)
        if free >= need:
            continue
        arithmetic = f"--expect-bytes {human_bytes(opts.expect_bytes)}" + (
            f" × {len(group)} paths on this file system" if len(group) > 1 else ""
        )
        yield Hit(
            {
                **_group_values(group),
                "need": human_bytes(need),
                "arithmetic": arithmetic,
                "short": human_bytes(need - free),
            },
            (_ev_space(group[0]), ev("expected writes", arithmetic, "--expect-bytes")),
        )


TD607 = register(
    Code(
        code="TD607",
        name="path-space-below-expected",
        family="checkpoint-io",
        severity=Severity.ERROR,
        area="storage",
        title="Less space is free than the run expects to write",
        message="{paths}: {free} free of {total} on {mount_point}, but the run will write {need} ({arithmetic}).",
        fix="Free at least {short} on {mount_point} (`du -xsh {top} | sort -h | tail`), keep fewer "
        "checkpoints (Lightning `save_top_k`, Hugging Face `save_total_limit`), or use a volume with {need} free.",
        meaning="The space the run is expected to write (--expect-bytes per --path, summed over the paths that share a "
        "file system) does not fit in what is free now.",
        why="The disk fills part-way through training; the checkpoint being written is truncated and later fails to load "
        "with `PytorchStreamReader failed reading zip archive`.",
        false_positives="--expect-bytes is your estimate; other jobs may free or take space meanwhile. Free space is "
        "what unprivileged users may use (root may also use the reserved blocks).",
        related=("TD606", "TD608"),
        check=_check_below_expected,
    )
)


def _check_space_low(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    if opts.expect_bytes:
        return
    for free, group in _space_groups(facts):
        if free < LOW_SPACE_FLOOR:
            yield Hit({**_group_values(group), "floor": human_bytes(LOW_SPACE_FLOOR)}, (_ev_space(group[0]),))


TD608 = register(
    Code(
        code="TD608",
        name="path-space-low",
        family="checkpoint-io",
        severity=Severity.WARNING,
        area="storage",
        title="Little space is free where the run writes",
        message="{paths}: only {free} free of {total} on {mount_point} (below {floor}); one checkpoint with optimizer "
        "state is often larger.",
        fix="Tell torchdoctor what the run writes with `--expect-bytes` (e.g. 3 × one checkpoint) to get a precise "
        "check, then free space (`du -xsh {top} | sort -h | tail`) or choose another volume.",
        meaning="No --expect-bytes was given, and free space is below a floor that a single modern checkpoint exceeds.",
        why="Leftover checkpoints, caches and logs; small root disks and container layers.",
        false_positives="Jobs that save small models or only logs need far less; pass --expect-bytes to judge exactly.",
        related=("TD607", "TD606"),
        check=_check_space_low,
    )
)


def _check_inodes(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    for group in _groups([e for e in _entries(facts) if e.is_dir is not False]):
        fs = group[0].fs
        free, total = fs.inodes_free, fs.inodes_total
        if free is None or not total or any(_errno(e) in _SPACE_ERRNOS for e in group):
            continue
        if free > 0 and (free >= INODES_LOW_ABS or free >= total * INODES_LOW_FRACTION):
            continue
        yield Hit(
            {**_group_values(group), "inodes_free": free, "inodes_total": total, "pct": f"{100 * free / total:.1f}%"},
            (ev("inodes free", f"{free} of {total}", f"statvfs({fs.checked_at})"),),
            severity=Severity.ERROR if free == 0 else None,
        )


TD609 = register(
    Code(
        code="TD609",
        name="path-inodes-low",
        family="checkpoint-io",
        severity=Severity.WARNING,
        area="storage",
        title="A file system the run writes has almost no free inodes",
        message="{paths}: {inodes_free} of {inodes_total} inodes free ({pct}) on {mount_point}; creating files fails "
        "with ENOSPC when they run out, however much space is free.",
        fix="Find the directories with many small files (`du --inodes -x {mount_point} | sort -n | tail`), remove them "
        "or pack them into archives or shards (tar, WebDataset, one LMDB/HDF5 file).",
        meaning="Every file and directory takes an inode; a file system created with a fixed inode count can run out "
        "while `df -h` still shows space.",
        why="Datasets unpacked as millions of small files, per-step log or image dumps, package caches.",
        false_positives="Fires only below both 50,000 free inodes and 5% of the total; a run that creates few files "
        "may still fit.",
        related=("TD606",),
        check=_check_inodes,
    )
)
