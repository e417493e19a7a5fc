"""checkpoint-io: torch.save / torch.load against the file system (missing, immutable, read-only, full, EIO).

Every directory is a fresh temporary one. Mounts (a read-only bind mount, a small tmpfs, an ext4
image on a loop device that detaches itself when unmounted) are made in a private mount namespace
of the lab child only (``unshare(CLONE_NEWNS)`` then ``mount --make-rprivate /``): they vanish
with the child and are never visible to the host.
An immutable attribute is always removed again in ``finally``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from .. import scenario

MiB = 1024 * 1024
NOBODY = 65534
#: The small tmpfs that fills up, and what the checkpoint needs (a 16 MiB tensor).
FULL_FS_SIZE = "1m"
ROOMY_FS_SIZE = "64m"
BIG_TENSOR_ELEMS = 4 * MiB  # float32: 16 MiB
CLONE_NEWNS = 0x00020000


def _state(elems: int = 1024) -> dict[str, Any]:
    import torch

    return {"step": 100, "weight": torch.arange(elems, dtype=torch.float32)}


def _tmpdir(tag: str) -> str:
    return tempfile.mkdtemp(prefix=f"torchdoctor-lab-{tag}-")


def _private_mounts() -> None:
    """Move this process into its own mount namespace whose mounts never propagate back to the host."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNS): {os.strerror(err)}")
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)


def _mount_tmpfs(where: str, size: str) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", where], check=True)


def _atomic_save(obj: object, path: str) -> None:
    """The catalogue's fix for partial writes, through the guard: torchdoctor.save (temporary file, fsync,
    os.replace)."""
    import torchdoctor

    torchdoctor.save(obj, path)


def _unmount(where: str) -> None:
    """Detach a private mount (lazily: a failed writer may still hold a file open) and remove its directory."""
    subprocess.run(["umount", "-l", where], check=False, capture_output=True)
    try:
        os.rmdir(where)
    except OSError:
        pass


def _saved(path: str) -> None:
    print(f"saved {path} ({os.path.getsize(path)} bytes)")


# -- ENOENT ----------------------------------------------------------------------------------------


@scenario(
    name="ckpt-save-missing-dir",
    family="checkpoint-io",
    code="TD650",
    summary="torch.save into a directory that does not exist: 'Parent directory ... does not exist.'",
    fix="torchdoctor.save(obj, path): it creates the directory (or os.makedirs(dirname, exist_ok=True) first)",
    seconds=2.0,
    timeout=60.0,
    memory_mb=1024,
)
def ckpt_save_missing_dir(fixed: bool) -> None:
    import torch

    root = _tmpdir("missing")
    try:
        path = os.path.join(root, "run-7", "checkpoints", "last.pt")
        if fixed:
            import torchdoctor

            torchdoctor.save(_state(), path)  # the guard: the directory is created, the write atomic
        else:
            torch.save(_state(), path)
        _saved(path)
    finally:
        shutil.rmtree(root)


# -- EPERM: immutable directory --------------------------------------------------------------------


@scenario(
    name="ckpt-save-immutable-dir",
    family="checkpoint-io",
    code="TD651",
    summary="torch.save as root into a directory with the immutable attribute (chattr +i): "
    "'open file failed with strerror: Operation not permitted'",
    fix="remove the attribute (chattr -i DIR), then save",
    needs=("torch", "root", "chattr"),
    seconds=2.0,
    timeout=60.0,
    memory_mb=1024,
)
def ckpt_save_immutable_dir(fixed: bool) -> None:
    import torch

    root = _tmpdir("immutable")
    subprocess.run(["chattr", "+i", root], check=True)
    try:
        if fixed:
            subprocess.run(["chattr", "-i", root], check=True)
        path = os.path.join(root, "last.pt")
        torch.save(_state(), path)
        _saved(path)
    finally:
        subprocess.run(["chattr", "-i", root], check=False)
        shutil.rmtree(root)


# -- EROFS: read-only bind mount -------------------------------------------------------------------


@scenario(
    name="ckpt-save-readonly-mount",
    family="checkpoint-io",
    code="TD652",
    summary="torch.save into a read-only bind mount (private mount namespace): "
    "'open file failed with strerror: Read-only file system'",
    fix="write to a writable volume instead of the read-only mount",
    needs=("torch", "root", "unshare"),
    seconds=2.0,
    timeout=60.0,
    memory_mb=1024,
)
def ckpt_save_readonly_mount(fixed: bool) -> None:
    import torch

    source, writable = _tmpdir("ro-source"), _tmpdir("writable")
    try:
        _private_mounts()
        subprocess.run(["mount", "--bind", source, source], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", source], check=True)
        path = os.path.join(writable if fixed else source, "last.pt")
        torch.save(_state(), path)
        _saved(path)
    finally:
        _unmount(source)
        shutil.rmtree(source, ignore_errors=True)
        shutil.rmtree(writable)


# -- EACCES: unprivileged user, directory owned by root ---------------------------------------------


def _rerun_as_nobody(name: str, fixed: bool, directory: str) -> int:
    argv = [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        "--",
        sys.executable,
        "-m",
        "torchdoctor.lab.child",
        name,
        *(["--fixed"] if fixed else []),
    ]
    env = {**os.environ, "TORCHDOCTOR_LAB_DIR": directory}
    rc = subprocess.run(argv, env=env, cwd="/", check=False).returncode  # noqa: S603 - argv list, no shell
    return rc if rc >= 0 else 128 - rc  # a signal: as a shell reports it


@scenario(
    name="ckpt-save-permission-denied",
    family="checkpoint-io",
    code="TD653",
    summary="torch.save as an unprivileged user (setpriv, uid 65534) into a root-owned 0755 directory: "
    "'open file failed with strerror: Permission denied' (root itself ignores mode bits)",
    fix="give the training user the directory (chown), then save",
    needs=("torch", "root", "setpriv"),
    seconds=2.0,
    timeout=60.0,
    memory_mb=1024,
)
def ckpt_save_permission_denied(fixed: bool) -> None:
    if os.geteuid() == 0:
        root = _tmpdir("eacces")
        os.chmod(root, 0o755)
        try:
            if fixed:
                os.chown(root, NOBODY, NOBODY)
            sys.exit(_rerun_as_nobody("ckpt-save-permission-denied", fixed, root))
        finally:
            shutil.rmtree(root)
    import torch

    path = os.path.join(os.environ["TORCHDOCTOR_LAB_DIR"], "last.pt")
    torch.save(_state(), path)
    _saved(path)


# -- ENOSPC: a full file system --------------------------------------------------------------------


def _full_fs_save(fixed: bool, file_object: bool, legacy: bool = False) -> None:
    import torch

    where = _tmpdir("full")
    try:
        _private_mounts()
        _mount_tmpfs(where, ROOMY_FS_SIZE if fixed else FULL_FS_SIZE)
        path = os.path.join(where, "last.pt")
        obj = _state(BIG_TENSOR_ELEMS)
        try:
            if fixed:
                _atomic_save(obj, path)
            elif file_object:
                with open(path, "wb") as f:
                    torch.save(obj, f)
            elif legacy:  # the pre-1.6 format: storages written by torch's own write() loop, which names the errno
                torch.save(obj, path, _use_new_zipfile_serialization=False)
            else:
                torch.save(obj, path)
            _saved(path)
        finally:
            if os.path.exists(path) and not fixed:
                print(f"left behind: {path} ({os.path.getsize(path)} bytes)", flush=True)
    finally:
        _unmount(where)


@scenario(
    name="ckpt-save-disk-full",
    family="checkpoint-io",
    code="TD655",
    summary=f"torch.save(obj, path) of a 16 MiB tensor onto a {FULL_FS_SIZE} private tmpfs: the writer fails "
    "mid-file ('basic_ios::clear: iostream error', 'unexpected pos') and leaves a truncated file",
    fix=f"enough space ({ROOMY_FS_SIZE} tmpfs) and an atomic save (temporary file + os.replace)",
    needs=("torch", "root", "unshare"),
    seconds=2.0,
    timeout=60.0,
    memory_mb=1024,
)
def ckpt_save_disk_full(fixed: bool) -> None:
    _full_fs_save(fixed, file_object=False)


@scenario(
    name="ckpt-save-disk-full-fileobj",
    family="checkpoint-io",
    code="TD654",
    summary=f"torch.save(obj, open(path, 'wb')) of a 16 MiB tensor onto a {FULL_FS_SIZE} private tmpfs: "
    "'OSError: [Errno 28] No space left on device'",
    fix=f"enough space ({ROOMY_FS_SIZE} tmpfs) and an atomic save (temporary file + os.replace)",
    needs=("torch", "root", "unshare"),
    seconds=2.0,
    timeout=60.0,
    memory_mb=1024,
)
def ckpt_save_disk_full_fileobj(fixed: bool) -> None:
    _full_fs_save(fixed, file_object=True)


@scenario(
    name="ckpt-legacy-save-disk-full",
    family="checkpoint-io",
    code="TD654",
    summary=f"torch.save(obj, path, _use_new_zipfile_serialization=False) (the pre-1.6 format) of a 16 MiB tensor "
    f"onto a {FULL_FS_SIZE} private tmpfs: 'write(): fd N failed with No space left on device'",
    fix=f"enough space ({ROOMY_FS_SIZE} tmpfs) and an atomic save (temporary file + os.replace)",
    needs=("torch", "root", "unshare"),
    seconds=2.0,
    timeout=60.0,
    memory_mb=1024,
)
def ckpt_legacy_save_disk_full(fixed: bool) -> None:
    _full_fs_save(fixed, file_object=False, legacy=True)


# -- EIO: a thin-provisioned disk whose backing store runs out -------------------------------------

#: The disk image's nominal size, and what backs it: the file system believes it has room the image cannot hold.
THIN_DISK_SIZE = 64 * MiB
THIN_BACKING_SIZE = "6m"


def _thin_disk(backing: str, disk: str, backing_size: str) -> None:
    """An ext4 file system on a sparse image whose backing tmpfs is smaller than the image (thin provisioning).
    Mounted ``sync`` so that the write itself, not a later flush, reports the device's error; ``-o loop`` detaches
    the loop device automatically when the mount goes away (also when this private mount namespace does)."""
    _mount_tmpfs(backing, backing_size)
    image = os.path.join(backing, "disk.img")
    with open(image, "wb") as f:
        f.truncate(THIN_DISK_SIZE)
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-E", "lazy_itable_init=1,nodiscard", image], check=True
    )
    subprocess.run(["mount", "-o", "loop,sync,errors=continue", image, disk], check=True)


@scenario(
    name="ckpt-save-io-error",
    family="checkpoint-io",
    code="TD658",
    summary=f"torch.save (pre-1.6 format) of a 16 MiB tensor onto a {THIN_DISK_SIZE // MiB} MiB ext4 image backed by "
    f"{THIN_BACKING_SIZE} only (a thin-provisioned disk running out, private mount namespace): "
    "'write(): fd N failed with Input/output error'",
    fix="a disk whose backing store has room (64m) and an atomic save (temporary file + os.replace)",
    needs=("torch", "root", "unshare", "chattr"),  # chattr: e2fsprogs, which also provides mkfs.ext4
    seconds=3.0,
    timeout=90.0,
    memory_mb=1024,
)
def ckpt_save_io_error(fixed: bool) -> None:
    import torch

    backing, disk = _tmpdir("thin-backing"), _tmpdir("thin-disk")
    try:
        _private_mounts()
        _thin_disk(backing, disk, "64m" if fixed else THIN_BACKING_SIZE)
        path = os.path.join(disk, "last.pt")
        if fixed:
            _atomic_save(_state(BIG_TENSOR_ELEMS), path)
        else:
            torch.save(_state(BIG_TENSOR_ELEMS), path, _use_new_zipfile_serialization=False)
        _saved(path)
    finally:
        _unmount(disk)
        _unmount(backing)


# -- a truncated checkpoint ------------------------------------------------------------------------


@scenario(
    name="ckpt-load-truncated",
    family="checkpoint-io",
    code="TD656",
    summary="a good checkpoint is overwritten in place by a save that fails on a full file system (that earlier "
    "job's error is not part of this log); torch.load of the result: 'PytorchStreamReader failed reading "
    "zip archive: failed finding central directory'",
    fix="torchdoctor.save (temporary file + fsync + os.replace): the failed save leaves the previous checkpoint intact",
    needs=("torch", "root", "unshare"),
    seconds=2.0,
    timeout=60.0,
    memory_mb=1024,
)
def ckpt_load_truncated(fixed: bool) -> None:
    import torch

    where = _tmpdir("truncated")
    try:
        _private_mounts()
        _mount_tmpfs(where, FULL_FS_SIZE)
        path = os.path.join(where, "last.pt")
        torch.save(_state(), path)  # the previous, good checkpoint (4 KiB)
        from torchdoctor import TorchDoctorError, save

        try:  # the earlier job: a 16 MiB save that runs out of space (guarded: refused, or undone)
            (save if fixed else torch.save)(_state(BIG_TENSOR_ELEMS), path)
        except (RuntimeError, OSError, TorchDoctorError) as exc:
            print(f"the earlier save failed: {type(exc).__name__}", flush=True)
        state = torch.load(path)  # this job: resume
        print(f"resumed from step {state['step']} ({os.path.getsize(path)} bytes)")
    finally:
        _unmount(where)
