"""TD10x: /dev/shm, the POSIX shared memory that DataLoader workers hand batches through."""

from __future__ import annotations

from collections.abc import Iterator

from ..facts import Facts
from ..model import Severity
from ..options import CheckOptions
from ..registry import Code, Hit, register
from ._processes import local_processes
from ._util import ev, human_bytes

CONTAINER_DEFAULT = 64 * 1024 * 1024


def _check_not_mounted(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    shm = facts.shm
    if shm.exists is False:
        yield Hit({"state": "does not exist"}, (ev("/dev/shm", "missing", "/dev/shm"),))
    elif shm.exists and shm.fstype not in (None, "tmpfs"):
        yield Hit(
            {"state": f"is on {shm.fstype}, not tmpfs"},
            (ev("file system", shm.fstype, "/proc/self/mountinfo"),),
            severity=Severity.WARNING,
        )


TD101 = register(
    Code(
        code="TD101",
        name="shm-not-mounted",
        family="shm-exhausted",
        severity=Severity.ERROR,
        area="shm",
        title="/dev/shm is missing or not a tmpfs",
        message="/dev/shm {state}; DataLoader workers cannot hand tensors to the main process through it.",
        fix="Mount a tmpfs on /dev/shm: in Docker `--shm-size=8g` (or `--ipc=host`), in Kubernetes an emptyDir with "
        "`medium: Memory` mounted at /dev/shm, on a bare host as root (while nothing uses /dev/shm) "
        "`mount -t tmpfs -o size=8g tmpfs /dev/shm`.",
        meaning="POSIX shared memory on Linux lives in the tmpfs mounted at /dev/shm. torch's multiprocessing puts every "
        "tensor a worker returns into a segment there (both sharing strategies use it).",
        why="Minimal container images and some sandboxes do not mount /dev/shm, or bind it to a disk directory.",
        false_positives="A job with num_workers=0 and no torch.multiprocessing never shares tensors and is unaffected.",
        related=("TD102", "TD103"),
        check=_check_not_mounted,
    )
)


def _check_too_small(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    size, free = facts.shm.size_bytes, facts.shm.free_bytes
    if size is None or free is None or opts.num_workers == 0:
        return
    procs = local_processes(facts, opts)
    need = opts.shm_need_bytes() * procs.count
    if need <= free:
        return
    arithmetic = (
        f"{procs.count} process(es) × {opts.num_workers} workers × prefetch {opts.prefetch_factor} × "
        f"{human_bytes(opts.batch_bytes)} batches = {human_bytes(need)}"
    )
    yield Hit(
        {
            "size": human_bytes(size),
            "free": human_bytes(free),
            "need": human_bytes(need),
            "arithmetic": arithmetic,
            "need_gib": max(1, -(-need * 2 // 1024**3)),
        },
        (
            ev("/dev/shm size", human_bytes(size), "statvfs(/dev/shm)"),
            ev("/dev/shm free", human_bytes(free), "statvfs(/dev/shm)"),
            ev("in-flight batches", arithmetic, "--num-workers, --prefetch-factor, --batch-bytes"),
            ev("training processes on this node", procs.count, procs.source),
        ),
    )


TD102 = register(
    Code(
        code="TD102",
        name="shm-too-small",
        family="shm-exhausted",
        severity=Severity.ERROR,
        area="shm",
        title="/dev/shm cannot hold the batches DataLoader workers keep in flight",
        message="/dev/shm has {free} free of {size}; {arithmetic} are needed.",
        fix="Give the container more shared memory (Docker `--shm-size={need_gib}g` or `--ipc=host`; Kubernetes emptyDir "
        "`medium: Memory, sizeLimit: {need_gib}Gi` at /dev/shm), or lower num_workers / prefetch_factor / batch size.",
        meaning="Every batch a worker has produced but the main process has not yet consumed sits in /dev/shm. When they "
        "do not fit, the worker dies: on current torch with `unable to allocate shared memory(shm) ... No space left "
        "on device (28)`, on older builds or non-preallocated mappings with a bus error (SIGBUS).",
        why="Container runtimes default /dev/shm to 64 MiB, far below workers × prefetch_factor × batch size for image or "
        "video batches; several training processes on one node share the same /dev/shm.",
        false_positives="The estimate assumes every worker holds prefetch_factor full batches at once, which is the worst "
        "case; pin_memory and fast consumers keep fewer in flight. --batch-bytes is your estimate.",
        related=("TD101", "TD103"),
        check=_check_too_small,
    )
)


def _check_container_default(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    size = facts.shm.size_bytes
    if size is None or size > CONTAINER_DEFAULT:
        return
    container = facts.host.container
    in_container = container.in_container
    yield Hit(
        {"size": human_bytes(size), "where": "this container" if in_container else "this machine"},
        (
            ev("/dev/shm size", human_bytes(size), "statvfs(/dev/shm)"),
            ev("mount size option", facts.shm.mount_size_option or "none", "/proc/self/mountinfo"),
            ev("container", container.kind or ("yes" if in_container else "not detected"), "host.container"),
        ),
    )


TD103 = register(
    Code(
        code="TD103",
        name="shm-container-default",
        family="shm-exhausted",
        severity=Severity.WARNING,
        area="shm",
        title="/dev/shm is at the 64 MiB container default",
        message="/dev/shm on {where} is {size}, the Docker/containerd default, enough for a few small batches only.",
        fix="Start the container with `--shm-size=8g` (or `--ipc=host`); in Kubernetes mount an emptyDir with "
        "`medium: Memory` at /dev/shm.",
        meaning="The size of /dev/shm was never raised from what the container runtime gives by default.",
        why="Docker, containerd and Podman create a 64 MiB /dev/shm for each container unless told otherwise.",
        false_positives="Jobs that load data with num_workers=0, or tiny batches, run fine in 64 MiB.",
        related=("TD102",),
        check=_check_container_default,
    )
)


def _check_leaked_segments(facts: Facts, opts: CheckOptions) -> Iterator[Hit]:
    seg = facts.shm.torch_segments
    if not seg or not seg.count:
        return
    dead = sorted(set(seg.owner_pids) - set(seg.owners_alive))
    if not dead:
        return
    yield Hit(
        {
            "count": seg.count,
            "bytes": human_bytes(seg.bytes),
            "dead": ", ".join(map(str, dead[:8])),
            "listing": " ".join(f"/dev/shm/torch_{pid}_*" for pid in dead[:8]),
        },
        (
            ev("torch_* segments", seg.count, "/dev/shm"),
            ev("their size", human_bytes(seg.bytes), "/dev/shm"),
            ev("creator pids no longer running", ", ".join(map(str, dead[:8])), "/proc"),
        ),
    )


TD104 = register(
    Code(
        code="TD104",
        name="shm-leaked-segments",
        family="shm-exhausted",
        severity=Severity.WARNING,
        area="shm",
        title="torch shared-memory segments left behind by dead processes",
        message="{count} torch_* segments ({bytes}) in /dev/shm belong to processes that are gone (pids {dead}).",
        fix="See which they are and who owns them: `ls -l {listing}` (the number after torch_ is the pid that created "
        "the segment). torchdoctor removes nothing it did not create: once you are sure no job still uses them, "
        "their owner can remove them, or a reboot frees the memory.",
        meaning="Segments created with the file_system sharing strategy are removed by torch_shm_manager; when a job is "
        "killed with SIGKILL they can stay and occupy shared memory until removed or the host reboots.",
        why="A killed job (OOM killer, `kill -9`, a preempted node) never ran the cleanup.",
        false_positives="The pid in a segment name is that of the creator; a segment whose creator exited may still be "
        "mapped by a live worker of the same job for a moment.",
        related=("TD102",),
        check=_check_leaked_segments,
    )
)
