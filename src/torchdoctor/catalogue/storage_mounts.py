"""TD610-TD613: what kind of file system a run writes to (locks, atomic rename, persistence, hangs)."""

from __future__ import annotations

from collections.abc import Iterator

from ..facts import Facts
from ..facts.schema import Mount, PathEntry
from ..model import Severity
from ..options import CheckOptions
from ..registry import Code, Hit, register
from ._util import ev, human_bytes
from .storage import _entries, _ev_mount, _ev_space, _name


# -- TD610-TD612: what kind of file system ------------------------------------------------------
def lock_note(fstype: str, options: list[str]) -> str:
    """What file locks do on this mount, from its type and options (nfs(5), the Lustre client README)."""
    opts = set(options)
    if fstype.startswith("nfs"):
        if "nolock" in opts or "local_lock=all" in opts:
            return "file locks are local to this node (nolock/local_lock=all): a lock taken here does not exclude other nodes"
        if "local_lock=flock" in opts:
            return "flock() locks, which filelock.FileLock uses, are local to this node (local_lock=flock)"
        return (
            "locks go through the NFS server and are lost when it restarts; other nodes see a renamed or rewritten "
            "file only after their attribute cache expires, and files deleted while open linger as .nfsXXXX "
            "(`rmtree` then fails with EBUSY)"
        )
    if fstype == "lustre":
        if "localflock" in opts:
            return "locks are local to this node (localflock): they do not exclude other nodes"
        if "noflock" in opts:
            return "flock()/fcntl() locks fail with ENOSYS (noflock)"
        if "flock" in opts:
            return "locks are coherent across nodes (flock), but many ranks creating or opening files hammer the metadata server"
        return "the mount options do not show flock: locks may be refused (ENOSYS) or only local to this node"
    if fstype == "fuse" or fstype.startswith("fuse."):
        return (
            "its FUSE daemon decides what locks, rename and fsync do; object-store mounts (s3fs, gcsfuse, "
            "mountpoint-s3, blobfuse) rename by copy and delete or not at all and may refuse appends"
        )
    return "whether locks and renames are coherent across nodes depends on this file system's client"


def _by_mount(facts: Facts, kinds: tuple[str, ...]) -> Iterator[tuple[Mount, list[PathEntry]]]:
    groups: dict[str, list[PathEntry]] = {}
    for e in _entries(facts):
        if e.fs_kind in kinds and e.mount.mount_point:
            groups.setdefault(e.mount.mount_point, []).append(e)
    for entries in groups.values():
        yield entries[0].mount, entries


def _check_network(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    for m, entries in _by_mount(facts, ("network", "fuse")):
        note = lock_note(m.fstype or "", list(m.options))
        kind = "FUSE" if entries[0].fs_kind == "fuse" else "network"
        yield Hit(
            {
                "paths": ", ".join(_name(e) for e in entries),
                "fstype": m.fstype,
                "kind": kind,
                "source": m.source,
                "mount_point": m.mount_point,
                "lock_note": note,
            },
            (_ev_mount(entries[0]), ev("locks", note, "mount type and options")),
        )


TD610 = register(
    Code(
        code="TD610",
        name="path-network-filesystem",
        family="concurrent-write",
        severity=Severity.WARNING,
        area="storage",
        title="A path the run writes is on a network or FUSE file system",
        message="{paths} on {fstype} ({kind}) from {source} at {mount_point}: {lock_note}.",
        fix="Write each file from one process (rank 0, or per-rank file names); save to a temporary name and "
        "`os.replace(tmp, final)` in the same directory, or to local disk and copy; use torch.distributed.checkpoint "
        "for sharded saves. `filelock.FileLock` excludes other nodes only where locks are coherent; `SoftFileLock` "
        "(an O_EXCL marker file) works more widely but a crashed job leaves the marker behind.",
        meaning="Several nodes or ranks writing, locking or renaming the same files on a shared file system is where "
        "checkpoints get corrupted or lost, and where file locks silently stop excluding anyone.",
        why="Network clients cache attributes and data (NFS close-to-open consistency), lock support depends on mount "
        "options, object-store FUSE mounts are not POSIX, and a hard-mounted server outage hangs every writer.",
        false_positives="A single process writing its own files on a healthy network mount is usually fine; the risk "
        "is concurrent writers, locks and renames.",
        related=("TD613", "TD611"),
        check=_check_network,
    )
)


def _check_overlay(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    container = facts.host.container
    in_container = container.in_container
    for m, entries in _by_mount(facts, ("overlay",)):
        yield Hit(
            {
                "paths": ", ".join(_name(e) for e in entries),
                "fstype": m.fstype,
                "mount_point": m.mount_point,
                "where": "this container's writable layer" if in_container else "an overlay (union) file system",
            },
            (_ev_mount(entries[0]), ev("container", container.kind or bool(in_container), "host.container")),
        )


TD611 = register(
    Code(
        code="TD611",
        name="path-overlay-filesystem",
        family="checkpoint-io",
        severity=Severity.WARNING,
        area="storage",
        title="A path the run writes is on a container's overlay layer",
        message="{paths} is on {where} ({fstype} at {mount_point}): what is written there is lost when the container is "
        "removed and fills the node's container storage.",
        fix="Mount a volume for checkpoints and logs and write there: `docker run -v /data/ckpt:/ckpt ...`, a "
        "Kubernetes PersistentVolumeClaim (or hostPath/emptyDir with a sizeLimit), or the job's scratch directory.",
        meaning="The directory is not on a volume but in the container's copy-on-write upper layer.",
        why="Images that write to their working directory; Kubernetes evicts pods whose writable layer passes their "
        "ephemeral-storage limit; renaming a directory that came from an image layer can fail with EXDEV.",
        false_positives="Small logs and scratch files that may be lost are fine on the overlay layer.",
        related=("TD612", "TD610"),
        check=_check_overlay,
    )
)


def _check_memory(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    for m, entries in _by_mount(facts, ("memory",)):
        yield Hit(
            {
                "paths": ", ".join(_name(e) for e in entries),
                "fstype": m.fstype,
                "mount_point": m.mount_point,
                "total": human_bytes(entries[0].fs.total_bytes),
            },
            (_ev_mount(entries[0]), _ev_space(entries[0])),
        )


TD612 = register(
    Code(
        code="TD612",
        name="path-memory-filesystem",
        family="checkpoint-io",
        severity=Severity.INFO,
        area="storage",
        title="A path the run writes is held in RAM (tmpfs)",
        message="{paths} is on {fstype} at {mount_point} (at most {total}): files there live in RAM, count against the "
        "memory limit of the writing container, and are gone after a reboot.",
        fix="Write checkpoints to a disk-backed volume; keep tmpfs for scratch data you can afford to lose.",
        meaning="tmpfs and ramfs keep file contents in memory (or swap).",
        why="/tmp is a tmpfs on many distributions, and /dev/shm is one everywhere; tmpfs pages are charged to the "
        "cgroup of the process that wrote them.",
        false_positives="Intentional RAM staging of small or throw-away files.",
        related=("TD611",),
        check=_check_memory,
    )
)


def _check_unresponsive(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    for e in _entries(facts):
        if e.timed_out:
            yield Hit(
                {"path": _name(e), "seconds": e.timeout_seconds},
                (ev("examining the path", f"no answer within {e.timeout_seconds} s", "stat, statvfs, write test"),),
            )


TD613 = register(
    Code(
        code="TD613",
        name="path-unresponsive",
        family="checkpoint-io",
        severity=Severity.WARNING,
        area="storage",
        title="A path the run writes does not answer",
        message="{path}: stat, statvfs and a one-byte write did not finish within {seconds} s.",
        fix="Check the mount with a timeout: `timeout 10 stat -f {path}`, `dmesg | grep -i 'not responding'`; fix the "
        "server or network, or remount, before starting the run.",
        meaning="Something under the path blocks: typically a hard-mounted network file system whose server does not "
        "answer, which leaves every process touching it in uninterruptible sleep (D state).",
        why="NFS/Lustre server outages, network partitions, stale FUSE daemons.",
        false_positives="A very slow but healthy file system under heavy load can exceed the deadline once.",
        related=("TD610",),
        check=_check_unresponsive,
    )
)
