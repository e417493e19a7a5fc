"""TD650-TD699: checkpoint and log files failing at the file-system level, and concurrent writers, in logs.

torch.save(obj, path) reports open failures from C++ (``open file failed with strerror: ...``,
``Parent directory ... does not exist.``) and write failures without an errno (``unexpected pos``);
torch.save(obj, file_object) and every other writer report Python's ``OSError: [Errno N] ...``. Both
forms are recognised, as is torch's own read/write loop of the pre-1.6 format (``write(): fd N
failed with <strerror>``). Concurrent writers (TD657, TD659, TD660) are recognised by what they
leave behind: glued records, lost renames, storages at the wrong offsets. Fixtures:
``tests/fixtures/logs/<CODE>/`` (lab: ``lab/scenarios/storage.py``, ``lab/scenarios/writes.py``).
"""

from __future__ import annotations

from ..model import Severity
from ..registry import Code, register
from ..signature import Role, Signature

_ATOMIC = (
    "save atomically so a failed save never replaces a good checkpoint: `torch.save(obj, tmp)` into the same "
    "directory, then `os.replace(tmp, path)`"
)
_PREFLIGHT = "`torchdoctor check --path DIR` tests a directory for this before the run starts."

TD650 = register(
    Code(
        code="TD650",
        name="save-dir-missing",
        family="checkpoint-io",
        severity=Severity.ERROR,
        area="storage",
        title="torch.save was given a path whose directory does not exist",
        message="torch.save could not create its file: the parent directory {directory} does not exist.",
        fix="Create it before the first save: `os.makedirs(os.path.dirname(path), exist_ok=True)` (on every node that "
        "saves, after the path is final: a typo or a per-run subdirectory is the usual cause). " + _PREFLIGHT,
        meaning="torch.save (zip format) checks the parent directory before opening the file and raises instead of "
        "creating directories.",
        why="The run directory is created on another node or by rank 0 only, a path is built with a run name that "
        "changed, or a relative path is resolved from an unexpected working directory.",
        false_positives="None known.",
        related=("TD601", "TD602"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("Parent directory",),
                pattern=r"Parent directory (?P<directory>.+?) does not exist\.?\s*$",
                confidence=0.95,
            ),
            # torch < 1.6 (and the legacy format, or a file object) opened the path with Python's open(): a
            # generic FileNotFoundError, told apart by torch.save's frames (a torch.load of a missing file is not it)
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("[Errno 2] No such file or directory",),
                pattern=r"(?:FileNotFoundError|IOError|OSError): \[Errno 2\] No such file or ?directory: ?"
                r"['\"](?P<directory>.*[/\\])[^/\\]*['\"]",
                exclude=(r"' -> '", r"tmp-checkpoint-\d+"),
                context=(
                    "torch.save(",
                    '_with_file_like(f, "wb"',
                    "_with_file_like(f, 'wb'",
                    "_open_file_like(f, 'wb')",
                    '_open_file_like(f, "wb")',
                ),
                confidence=0.75,
            ),
        ),
    )
)

TD651 = register(
    Code(
        code="TD651",
        name="write-not-permitted",
        family="checkpoint-io",
        severity=Severity.ERROR,
        area="storage",
        title="a write was refused with EPERM (immutable/append-only attribute or a security module)",
        message="Opening a file for writing failed with `Operation not permitted` (EPERM){where}: mode bits do not "
        "explain this one (even root gets it).",
        fix="`lsattr -d DIR` (and `lsattr FILE`): if it shows `i` (immutable) or `a` (append-only), "
        "`sudo chattr -i -a DIR`; otherwise look for an SELinux/AppArmor denial (`ls -Zd DIR`, `ausearch -m avc`; "
        "Docker bind mounts need `:z` under SELinux). " + _PREFLIGHT,
        meaning="EPERM on open() for writing comes from file attributes or a security module, not from ownership "
        "(that is EACCES, TD653).",
        why="A directory protected with `chattr +i` (datasets, shared results), append-only log directories, "
        "SELinux labels on bind mounts, some FUSE and network file systems.",
        false_positives="Other system calls (chown, setuid) also fail with EPERM; the torch form names the open.",
        related=("TD604", "TD653"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("open file failed with strerror: Operation not permitted",),
                pattern=r"open file failed with strerror: Operation not permitted",
                values={"where": " (torch.save)"},
                confidence=0.9,
            ),
        ),
    )
)

TD652 = register(
    Code(
        code="TD652",
        name="write-read-only-fs",
        family="checkpoint-io",
        severity=Severity.ERROR,
        area="storage",
        title="a write went to a read-only file system",
        message="Writing failed with `Read-only file system` (EROFS){where}: the directory lies on a read-only mount.",
        fix="Write to a writable volume (a checkpoint or output directory that is mounted read-write), or make the "
        "mount writable: Docker `-v SRC:DST` without `:ro`, Kubernetes `readOnly: false`; if the kernel remounted "
        "the file system read-only after I/O errors (`dmesg`), repair it first. " + _PREFLIGHT,
        meaning="Every write under a read-only mount fails with EROFS, for root too.",
        why="Read-only bind mounts and container volumes, code or dataset directories used as the output directory, "
        "ConfigMap/Secret volumes, a file system switched to read-only after errors.",
        false_positives="None known.",
        related=("TD605",),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("strerror: Read-only file system",),
                pattern=r"open file failed with strerror: Read-only file system",
                values={"where": " (torch.save)"},
                confidence=0.9,
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("[Errno 30]",),
                pattern=r"\[Errno 30\] Read-only file system(?:: '(?P<path>[^']*)')?",
                values={"where": ""},
                confidence=0.85,
            ),
        ),
    )
)

TD653 = register(
    Code(
        code="TD653",
        name="write-permission-denied",
        family="checkpoint-io",
        severity=Severity.ERROR,
        area="storage",
        title="a file could not be opened: permission denied (EACCES)",
        message="Opening a file failed with `Permission denied` (EACCES){where}: the user the run runs as may not "
        "write (or read) there.",
        fix="Give the training user its own output directory (`sudo chown $(id -u):$(id -g) DIR` for a directory you "
        "created for the run, never a system one; or `chmod u+w DIR`), run the "
        "container as the volume's owner (`docker run --user UID:GID`, Kubernetes `securityContext.fsGroup`), or "
        "write elsewhere. " + _PREFLIGHT,
        meaning="Mode bits or ACLs refuse the user: typical when the directory was created by root (in an image, by an "
        "earlier job run as root) and the job runs unprivileged. Root itself ignores mode bits, so tests run as "
        "root do not see it.",
        why="Directories created by another user, container images built as root, shared volumes with another "
        "owner, NFS root squashing.",
        false_positives="A permission error on a device or socket (e.g. /dev/nvidia*) is not a file-system problem "
        "of the run's own files.",
        related=("TD604", "TD651"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("open file failed with strerror: Permission denied",),
                pattern=r"open file failed with strerror: Permission denied",
                values={"where": " (torch.save)"},
                confidence=0.9,
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("[Errno 13]",),
                pattern=r"PermissionError: \[Errno 13\] Permission denied(?:: '(?P<path>[^']*)')?",
                exclude=(r"'/dev/",),
                values={"where": ""},
                confidence=0.75,
            ),
            Signature(  # Windows: ERROR_ACCESS_DENIED, in the system's language
                role=Role.ROOT_CAUSE,
                triggers=("[WinError 5]",),
                pattern=r"PermissionError: \[WinError 5\] (?:Access is denied|拒绝访问|Zugriff verweigert|Accès refusé)",
                values={"where": " (Windows: access denied)"},
                confidence=0.7,
            ),
        ),
    )
)

TD654 = register(
    Code(
        code="TD654",
        name="disk-full",
        family="checkpoint-io",
        severity=Severity.ERROR,
        area="storage",
        title="a write failed: no space left on the device or quota exceeded",
        message="A write failed with `{strerror}` (errno {errno}): the file system (or the user's quota) is full. A "
        "checkpoint being written is left truncated.",
        fix="Free space (`df -h DIR`, `du -xsh DIR/* | sort -h | tail`; keep only the last few checkpoints: Lightning "
        "`save_top_k`, Hugging Face `save_total_limit`) or write to a larger volume; quota: `quota -s` (Lustre "
        "`lfs quota -u $USER MOUNT`). Then " + _ATOMIC + ". " + _PREFLIGHT,
        meaning="ENOSPC (28) when blocks or inodes run out, EDQUOT (122) when a quota does. Python names the errno "
        "(`OSError: [Errno 28] ...`); torch's own write loop (storages of the pre-1.6 format, "
        "`_use_new_zipfile_serialization=False`) says `write(): fd N failed with No space left on device`. The "
        "failed file stays on disk with whatever was written, and a later torch.load fails on it (TD656).",
        why="Checkpoints with optimizer state every epoch, growing logs and caches, several ranks saving full copies.",
        false_positives="'No space left on device' about /dev/shm is shared memory (shm-exhausted), not the checkpoint "
        "disk; those lines are excluded.",
        related=("TD606", "TD607", "TD655", "TD656"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("[Errno 28]", "[Errno 122]"),
                pattern=r"\[Errno (?P<errno>28|122)\] (?P<strerror>No space left on device|Disk quota exceeded)"
                r"(?:: '(?P<path>[^']*)')?",
                exclude=(r"/dev/shm", r"shared memory"),
                confidence=0.9,
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("failed with No space left on device",),
                pattern=r"write\(\): fd (?P<fd>\d+) failed with (?P<strerror>No space left on device)",
                values={"errno": "28"},
                confidence=0.9,
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("failed with Disk quota exceeded",),
                pattern=r"write\(\): fd (?P<fd>\d+) failed with (?P<strerror>Disk quota exceeded)",
                values={"errno": "122"},
                confidence=0.9,
            ),
            Signature(  # Python's tempfile tried every candidate directory and could write in none: nearly always full
                role=Role.ROOT_CAUSE,
                triggers=("No usable temporary directory found",),
                pattern=r"(?P<strerror>No usable temporary directory found)(?: in \[)?",
                values={"errno": "2 from tempfile, after every temporary directory refused a file"},
                confidence=0.7,
            ),
        ),
    )
)

TD655 = register(
    Code(
        code="TD655",
        name="save-write-failed",
        family="checkpoint-io",
        severity=Severity.ERROR,
        area="storage",
        title="torch.save stopped in the middle of writing the checkpoint",
        message="torch.save's zip writer failed while writing ({detail}): the write was cut short, most often because "
        "the disk or quota was full (torch.save to a path reports no errno). The file left behind is truncated.",
        fix="Check space first (`df -h DIR`, `quota -s`), free it or write to a larger volume, and "
        + _ATOMIC
        + ". "
        + _PREFLIGHT,
        meaning="torch.save(obj, path) writes through a C++ stream: when a write fails it reports 'basic_ios::clear: "
        "iostream error' or 'file write failed', and closing the archive then finds fewer bytes than expected "
        "('unexpected pos A vs B').",
        why="Disk full or quota exceeded in the middle of a large checkpoint; more rarely an I/O error or a network "
        "file system going away.",
        false_positives="'unexpected pos' also follows other write errors in the same save; read the first error of "
        "the traceback.",
        related=("TD654", "TD656", "TD606"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("PytorchStreamWriter failed writing file",),
                pattern=r"PytorchStreamWriter failed writing file (?P<record>\S+?): file write failed",
                values={"detail": "PytorchStreamWriter: file write failed"},
                confidence=0.8,
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("unexpected pos",),
                pattern=r"inline_container\.cc:\d+\] \. unexpected pos (?P<pos>\d+) vs (?P<expected>\d+)",
                values={"detail": "unexpected position at the end of the archive"},
                confidence=0.7,
            ),
            Signature(
                role=Role.CONFIRMATION,
                triggers=("basic_ios::clear: iostream error",),
                pattern=r"basic_ios::clear: iostream error",
                values={"detail": "basic_ios::clear: iostream error"},
                confidence=0.5,
            ),
        ),
    )
)

TD656 = register(
    Code(
        code="TD656",
        name="checkpoint-truncated",
        family="checkpoint-io",
        severity=Severity.ERROR,
        area="storage",
        title="torch.load found a truncated or corrupted checkpoint",
        message="Loading the checkpoint failed ({reason}): the file is incomplete or damaged, typically a "
        "save that was interrupted (disk full, job killed) or a copy/download that did not finish.",
        fix="Compare the file size with a good checkpoint (`ls -l`), resume from an earlier checkpoint or download it "
        "again; to stop it recurring, " + _ATOMIC + ", check free space before saving, and when several ranks run "
        "the saving code, save from one (`if dist.get_rank() == 0:` or `trainer.is_global_zero`).",
        meaning="A torch.save file is a zip archive whose central directory is written last; a file cut short has none "
        "('failed finding central directory'), a damaged one fails on a record ('invalid header or archive is "
        "corrupted'). Files of the pre-1.6 format (still what many downloads are) fail while reading a storage: "
        "'unexpected EOF, expected N more bytes. The file might be corrupted.'",
        why="The process saving it died or ran out of space half-way and the path already held the new, partial file; "
        "two ranks wrote the same path; an interrupted copy or download.",
        false_positives="A file that is not a torch checkpoint at all (an HTML error page saved as .pt, a Git LFS pointer) "
        "gives the same message; for a .safetensors file that is what HeaderTooLarge almost always means (`head -c 200 "
        "FILE` shows `version https://git-lfs...` or HTML: fetch the real file with `git lfs pull` or download it "
        "again).",
        related=("TD655", "TD654", "TD660"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("PytorchStreamReader failed reading",),
                pattern=r"PytorchStreamReader failed reading (?:zip archive|file (?P<record>\S+?)): "
                r"(?P<reason>failed finding central directory|invalid header or archive is corrupted)",
                confidence=0.9,
            ),
            Signature(  # the same without its reason (a title, a screenshot's caption)
                role=Role.ROOT_CAUSE,
                triggers=("PytorchStreamReader failed reading zip archive",),
                pattern=r"PytorchStreamReader failed reading zip archive(?!: (?:failed finding central directory|invalid "
                r"header|(?i:not a zip archive)))",
                values={"reason": "failed reading the zip archive"},
                confidence=0.85,
            ),
            Signature(  # the pre-1.6 format (and torch.hub's cached downloads): a storage cut short
                role=Role.ROOT_CAUSE,
                triggers=("The file might be corrupted",),
                pattern=r"unexpected EOF(?:, expected (?P<missing>\d+) more bytes)?\. The file might be corrupted",
                values={"reason": "unexpected end of file: storage data missing"},
                confidence=0.9,
            ),
            Signature(  # safetensors: the first 8 bytes (the header's length) are not a safetensors header: a Git LFS
                # pointer, an HTML page or a cut download. safetensors >= 0.6 says "header too large" for a real one
                role=Role.ROOT_CAUSE,
                triggers=("Error while deserializing header",),
                pattern=r"Error while deserializing header: (?P<reason>HeaderTooLarge|MetadataIncompleteBuffer|"
                r"InvalidHeaderDeserialization)",
                confidence=0.8,
            ),
        ),
    )
)

TD658 = register(
    Code(
        code="TD658",
        name="io-error",
        family="checkpoint-io",
        severity=Severity.ERROR,
        area="storage",
        title="a read or write failed with an I/O error (EIO)",
        message="A file operation failed with `Input/output error` (EIO){where}: the storage under the file could not "
        "complete the request: a network file system (NFS, Lustre, GPFS, a FUSE or cloud-bucket mount) that lost "
        "its server or ran out of space or quota, or a failing disk.",
        fix="Check space and quota first (`df -h DIR`, `quota -s`): network and FUSE file systems often report a full "
        "disk as EIO. Then look for storage errors: `dmesg -T | tail -50` (disk, NFS 'server not responding'), the "
        "mount (`findmnt -T DIR`). Save to a local disk and copy afterwards, retry a failed save, and " + _ATOMIC + ".",
        meaning="EIO (errno 5) is the kernel's answer when the device or the remote server fails a request. torch's own "
        "read/write loop (storages of the pre-1.6 checkpoint format) says `write(): fd N failed with Input/output "
        "error`; Python says `OSError: [Errno 5] Input/output error`, often at close(), when a network file "
        "system flushes the data.",
        why="Checkpoints written to NFS/Lustre/FUSE mounts (Colab's Google Drive, gcsfuse, s3fs) that run out of space, "
        "time out or disconnect during a large save; disks with bad sectors.",
        false_positives="Python also raises `[Errno 5]` when printing to a terminal that went away (an ssh session "
        "closed under nohup): then the traceback ends in print(), not in a file operation.",
        related=("TD654", "TD655", "TD610", "TD613"),
        signatures=(
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("failed with Input/output error",),
                pattern=r"(?P<call>write|read)\(\): fd (?P<fd>\d+) failed with Input/output error",
                values={"where": " (torch's checkpoint read/write loop)"},
                confidence=0.85,
            ),
            Signature(
                role=Role.ROOT_CAUSE,
                triggers=("[Errno 5] Input/output error",),
                pattern=r"\[Errno 5\] Input/output error(?:: '(?P<path>[^']*)')?",
                exclude=(r"'/dev/",),
                values={"where": ""},
                confidence=0.65,
            ),
        ),
    )
)
