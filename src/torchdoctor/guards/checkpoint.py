"""Crash-safe checkpoints: :func:`save` never leaves a half-written file where a checkpoint was.

``save(obj, path)`` checks the directory first (created if missing, free space against the size of
the tensors in ``obj``), writes into a temporary file in the same directory, flushes and fsyncs it,
renames it onto ``path`` with :func:`os.replace` (atomic on POSIX file systems) and fsyncs the
directory. Whatever goes wrong, ``path`` holds either the previous checkpoint or the new one, never a
mix, and the error is a :class:`CheckpointError` that names the catalogue code and its fix.

Temporary files are named ``.{name}.tmp-{host}-{pid}-{hex8}``: hidden, never ending in the
checkpoint's suffix, never matching the ``keep_last`` pattern. The writer holds an exclusive
``flock`` on its temporary file while it writes. A writer killed outright (SIGKILL, OOM killer, node
loss) leaves its temporary file behind; the next :func:`save` into the same directory removes such
files when they are provably dead: written from this host, by a pid that no longer exists, and not
locked by anyone.

``load(path)`` is :func:`torch.load` whose failures on missing, unreadable or truncated files come
back as :class:`CheckpointError` with the code and fix (the original exception chained).
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import socket
import sys
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

from ..errors import TorchDoctorError, UsageError
from ..stopping import pid_alive

__all__ = ["CheckpointError", "load", "save", "current_rank", "estimate_nbytes", "rotation_pattern"]

# errno -> catalogue code of the checkpoint-io family
_ERRNO_CODES = {
    errno.ENOSPC: "TD654",
    errno.EDQUOT: "TD654",
    errno.EROFS: "TD652",
    errno.EACCES: "TD653",
    errno.EPERM: "TD651",
    errno.ENOENT: "TD650",
    errno.EIO: "TD658",
    errno.ENOTDIR: "TD603",
    errno.EEXIST: "TD603",  # mkdir -p over an existing file
}
_MARGIN = 1 << 20  # zip headers, pickled structure, metadata blocks: refuse when not even this is free
_TMP_RE = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<host>[^/]+)-(?P<pid>\d+)-[0-9a-f]{8}$")


class CheckpointError(TorchDoctorError):
    """A checkpoint could not be saved or loaded. ``code`` is the catalogue code (``None`` when no code
    fits, e.g. a checkpoint that does not exist), ``fix`` its fix text, ``path`` the file."""

    def __init__(self, code: str | None, problem: str, path: str | os.PathLike[str], fix: str | None = None) -> None:
        self.code = code
        self.path = Path(path)
        if fix is None and code is not None:
            fix = _fix(code)
        self.fix = fix or ""
        name = _name(code) if code else None
        head = f"{code} {name}: " if code else ""
        super().__init__(f"{head}{problem}" + (f" Fix: {self.fix}" if self.fix else ""))


def _fix(code: str) -> str:
    from ..registry import lookup

    if code == "TD603":  # its catalogue fix has a placeholder only the preflight check fills
        return (
            "Point the checkpoint path at a directory, not at a file: move or rename the file in the way, or save "
            "elsewhere. Then test it with `torchdoctor check --path DIR`."
        )
    return lookup(code).plain_fix


def _name(code: str) -> str:
    from ..registry import lookup

    return lookup(code).name


def _os_error(exc: BaseException) -> OSError | None:
    """The first OSError in ``exc`` or what it was raised from/while (torch wraps write errors)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, OSError) and cur.errno is not None:
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def _error_for(exc: BaseException, path: Path, doing: str, saving: bool = True) -> CheckpointError:
    after = "; the previous checkpoint is untouched." if saving else "."
    oserr = _os_error(exc)
    if oserr is not None:
        code = _ERRNO_CODES.get(oserr.errno or 0, "TD655")
        what = os.strerror(oserr.errno) if oserr.errno else str(oserr)
        where = f" ({oserr.filename})" if oserr.filename else ""
        problem = f"{doing} {path} failed: {what} (errno {oserr.errno}){where}{after}"
    else:
        code = "TD655"
        problem = f"{doing} {path} failed: {type(exc).__name__}: {exc}{after}"
    return CheckpointError(code, problem, path)


# --- ranks -------------------------------------------------------------------------------------------


def current_rank() -> int:
    """This process's global rank: ``torch.distributed.get_rank()`` when a process group is initialised,
    else the ``RANK`` environment variable (torchrun, Slurm launchers that set it), else 0."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank())
        except Exception:  # a half-torn-down process group: fall back to the environment
            pass
    for var in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(var, "").strip()
        if value.isdigit():
            return int(value)
    return 0


# --- what is being saved -----------------------------------------------------------------------------


def _tensors(obj: Any, depth: int = 0, seen: set[int] | None = None) -> Iterator[tuple[str, Any]]:
    """(where, tensor) for every tensor reachable through dicts, lists, tuples and modules, in order."""
    import torch

    if seen is None:
        seen = set()
    if depth > 64 or id(obj) in seen:
        return
    if isinstance(obj, torch.Tensor):
        yield "", obj
        return
    if isinstance(obj, torch.nn.Module):
        seen.add(id(obj))
        for key, value in obj.state_dict(keep_vars=True).items():
            yield f".{key}", value
        return
    if isinstance(obj, dict):
        seen.add(id(obj))
        for key, value in obj.items():
            for where, t in _tensors(value, depth + 1, seen):
                yield f"[{key!r}]{where}", t
    elif isinstance(obj, (list, tuple)):
        seen.add(id(obj))
        for i, value in enumerate(obj):
            for where, t in _tensors(value, depth + 1, seen):
                yield f"[{i}]{where}", t


def estimate_nbytes(obj: Any) -> int:
    """Bytes of tensor data ``torch.save(obj)`` writes: each storage once (views share theirs)."""
    total = 0
    storages: set[tuple[str, int]] = set()
    for _, t in _tensors(obj):
        try:
            storage = t.untyped_storage()
            key = (str(t.device), storage.data_ptr())
            if key in storages and storage.data_ptr() != 0:
                continue
            storages.add(key)
            total += int(storage.nbytes())
        except Exception:  # sparse, meta, or tensor subclasses without one storage
            total += int(t.numel() * t.element_size())
    return total


def _summary(obj: Any) -> list[tuple[str, tuple[int, ...], str, int | None]]:
    out = []
    for where, t in _tensors(obj):
        try:
            data = t.detach().cpu().contiguous().reshape(-1).view(__import__("torch").uint8).numpy()
            crc: int | None = zlib.crc32(memoryview(data))
        except Exception:  # sparse/quantized/bool views that cannot be read as bytes: shape and dtype only
            crc = None
        out.append((where, tuple(t.shape), str(t.dtype), crc))
    return out


# --- file-system steps -------------------------------------------------------------------------------


def _free_bytes(directory: Path) -> int | None:
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return int(blocks) * int(st.f_frsize)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:  # some file systems (and FUSE) do not fsync directories
        if exc.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP, errno.EROFS):
            raise
    finally:
        os.close(fd)


def _durable(f: IO[bytes]) -> None:
    """Flush Python's buffer and the kernel's: the data is on the disk before the rename makes it visible."""
    f.flush()
    os.fsync(f.fileno())


class _Writeback:
    """The temp file as torch.save sees it: every :attr:`STEP` bytes, the kernel is asked to start
    writing the range just written (``sync_file_range(SYNC_FILE_RANGE_WRITE)``, asynchronous, pages
    stay cached), so the final fsync waits for the tail only, not the whole file. Measured here on a
    256 MiB state dict: fsync-included save time down by about a quarter. Where the call is missing
    (not Linux/glibc) it is plain writes."""

    STEP = 32 << 20

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self._fd = f.fileno()
        self._pos = 0
        self._started = 0

    def write(self, data: Any) -> int:
        n = self._f.write(data)
        self._pos += n
        if self._pos - self._started >= self.STEP and _SYNC_FILE_RANGE is not None:
            self._f.flush()
            _SYNC_FILE_RANGE(self._fd, self._started, self._pos - self._started, 2)  # SYNC_FILE_RANGE_WRITE
            self._started = self._pos
        return n

    def flush(self) -> None:
        self._f.flush()


def _sync_file_range() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
        fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        fn.restype = ctypes.c_int
        return fn
    except (OSError, AttributeError):
        return None


_SYNC_FILE_RANGE = _sync_file_range()


def clean_stale_temps(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove temporary files of writers that died in ``directory``; returns what was removed.

    A file is removed only when its name is one of ours (``.{name}.tmp-{host}-{pid}-{hex8}``), it was
    written from this host by a pid that is gone, and nobody holds its lock. Anything else is left."""
    import fcntl

    host = _host()
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        m = _TMP_RE.match(entry.name)
        if not m or m["host"] != host or pid_alive(int(m["pid"])):
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        try:
            os.unlink(entry.path)
            removed.append(Path(entry.path))
        except OSError:
            pass
        finally:
            os.close(fd)  # releases the lock
    return removed


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"


# --- keep_last ---------------------------------------------------------------------------------------


def rotation_pattern(path: str | os.PathLike[str]) -> re.Pattern[str]:
    """The names ``keep_last`` may delete next to ``path``: its name with its LAST run of digits
    replaced by any run of digits (``ckpt-000120.pt`` -> ``ckpt-<digits>.pt``). A name without digits
    cannot be rotated (:class:`UsageError`)."""
    name = Path(path).name
    m = re.fullmatch(r"(?P<prefix>.*?)(?P<num>\d+)(?P<suffix>\D*)", name, re.S)
    if not m:
        raise UsageError(
            f"keep_last needs a step number in the file name to know which files are checkpoints of this run; "
            f"{name!r} has none: save as e.g. 'ckpt-{{step}}.pt'"
        )
    # the prefix may itself end in digits only if the digit run is the last one: `.*?` + `\d+` + `\D*`
    return re.compile(re.escape(m["prefix"]) + r"(\d+)" + re.escape(m["suffix"]))


def _rotate(path: Path, keep_last: int) -> list[Path]:
    pattern = rotation_pattern(path)
    found: list[tuple[int, str, Path]] = []
    for entry in os.scandir(path.parent):
        m = pattern.fullmatch(entry.name)
        if not m or not entry.is_file(follow_symlinks=False):  # never a directory or a symlink
            continue
        found.append((int(m.group(1)), entry.name, Path(entry.path)))
    found.sort(reverse=True)
    keep = {p.name for _, _, p in found[:keep_last]} | {path.name}  # the file just written always stays
    removed = []
    for _, name, p in found:
        if name in keep:
            continue
        try:
            p.unlink()
            removed.append(p)
        except FileNotFoundError:
            pass
        except OSError as exc:
            warnings.warn(f"keep_last could not remove {p}: {exc}", RuntimeWarning, stacklevel=3)
    return removed


# --- the API -----------------------------------------------------------------------------------------


def save(
    obj: Any,
    path: str | os.PathLike[str],
    *,
    rank0_only: bool = False,
    keep_last: int | None = None,
    verify: bool = False,
    durable: bool = True,
) -> Path | None:
    """``torch.save(obj, path)``, atomically: ``path`` is either the old checkpoint or the complete new one.

    ``rank0_only``: only the process of global rank 0 (:func:`current_rank`) writes; the others return
    ``None`` at once without touching the disk (no barrier: call ``dist.barrier()`` yourself if other
    ranks must wait for the file). ``keep_last=N``: after a successful save, delete all but the N
    highest-numbered files of :func:`rotation_pattern`; nothing else is ever deleted. ``verify``:
    read the written file back before it replaces ``path`` and compare every tensor's shape, dtype and
    CRC32 (TD656 on a mismatch; the old checkpoint stays). ``durable=False`` skips the two fsyncs: the
    swap stays atomic for every way a *process* ends (SIGKILL, the OOM killer, preemption), since the
    kernel keeps what was written; only a crash of the machine itself (power, kernel panic) soon after
    can leave the new name pointing at incomplete data. It makes the save as fast as a plain
    ``torch.save`` (which never fsyncs); the default pays for the data reaching the disk.

    Returns the path written, or ``None`` when this rank did not write. Raises :class:`CheckpointError`
    (a :class:`~torchdoctor.TorchDoctorError`) naming the code and fix; KeyboardInterrupt and SystemExit
    pass through unchanged after the temporary file is removed.
    """
    if rank0_only and current_rank() != 0:
        return None
    target = Path(os.fspath(path))
    if keep_last is not None:
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise UsageError(f"keep_last must be a positive integer, got {keep_last!r}")
        rotation_pattern(target)  # refuse before writing anything
    directory = target.parent if str(target.parent) else Path(".")

    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _error_for(exc, target, "creating the directory for") from exc
    if not directory.is_dir():
        raise CheckpointError("TD603", f"{directory} exists but is not a directory; cannot save {target}.", target)

    clean_stale_temps(directory)

    need = estimate_nbytes(obj)
    free = _free_bytes(directory)
    if free is not None and need + _MARGIN > free:
        raise CheckpointError(
            "TD654",
            f"not enough free space to save {target}: its tensors alone need {_mib(need)}, "
            f"{directory} has {_mib(free)} free; nothing was written and the previous checkpoint is untouched.",
            target,
        )

    import fcntl

    import torch

    tmp = directory / f".{target.name}.tmp-{_host()}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as exc:
        raise _error_for(exc, target, "creating a file to save") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            torch.save(obj, cast(IO[bytes], _Writeback(f) if durable else f))
            if durable:
                _durable(f)
            else:
                f.flush()
            if verify:
                _verify(tmp, obj, target)
            os.replace(tmp, target)  # under the lock: a cleaner never sees an unlocked live temp file
        if durable:
            _fsync_dir(directory)
    except BaseException as exc:
        _unlink_quietly(tmp)
        if isinstance(exc, CheckpointError) or not isinstance(exc, Exception):
            raise  # ours already, or KeyboardInterrupt/SystemExit: the temp file is gone, pass it on
        raise _error_for(exc, target, "saving") from exc

    if keep_last is not None:
        _rotate(target, keep_last)
    return target


def _verify(tmp: Path, obj: Any, target: Path) -> None:
    import torch

    expected = _summary(obj)
    try:
        # the file was written by this process a moment ago: unpickling it is no new trust
        back = torch.load(tmp, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise CheckpointError(
            "TD656",
            f"verify: reading back the new checkpoint for {target} failed ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); it was not installed, the previous one is untouched.",
            target,
        ) from exc
    got = _summary(back)
    if got != expected:
        diff = next(
            (f"{e[0] or 'tensor'}: wrote {e[1:]}, read {g[1:]}" for e, g in zip(expected, got) if e != g),
            f"{len(expected)} tensors written, {len(got)} read",
        )
        raise CheckpointError(
            "TD656",
            f"verify: the new checkpoint for {target} does not read back as written ({diff}); it was not "
            "installed, the previous one is untouched.",
            target,
        )


def _unlink_quietly(p: Path) -> None:
    try:
        os.unlink(p)
    except OSError:
        pass


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def load(path: str | os.PathLike[str], **torch_load_kwargs: Any) -> Any:
    """``torch.load(path, **torch_load_kwargs)`` whose file-level failures are :class:`CheckpointError`.

    Missing file (code ``None``; the message lists checkpoints that do exist next to it), permission
    (TD653/TD651), I/O error (TD658), truncated or damaged file (TD656, recognised by the catalogue's
    own TD656 signatures, plus an empty file). Everything else, e.g. ``weights_only`` refusing a
    class, is raised unchanged."""
    import torch

    p = Path(os.fspath(path))
    try:
        return torch.load(p, **torch_load_kwargs)
    except FileNotFoundError as exc:
        raise CheckpointError(None, f"no checkpoint at {p}.", p, fix=_nearby(p)) from exc
    except IsADirectoryError as exc:
        raise CheckpointError(None, f"{p} is a directory, not a checkpoint file.", p, fix=_nearby(p)) from exc
    except OSError as exc:
        if exc.errno in _ERRNO_CODES and exc.errno != errno.ENOENT:
            raise _error_for(exc, p, "loading", saving=False) from exc
        raise
    except EOFError as exc:
        raise CheckpointError("TD656", f"{p} ended before any data could be read (empty or cut short).", p) from exc
    except RuntimeError as exc:
        reason = _truncated_reason(str(exc))
        if reason is None:
            raise
        raise CheckpointError("TD656", f"{p} cannot be read: {reason}.", p) from exc


def _truncated_reason(text: str) -> str | None:
    from ..registry import lookup

    for sig in lookup("TD656").signatures:
        m = re.search(sig.pattern, text)
        if m:
            return m.groupdict().get("reason") or sig.values.get("reason") or m.group(0)
    return None


def _nearby(p: Path) -> str:
    try:
        names = sorted(e.name for e in os.scandir(p.parent) if e.is_file() and not e.name.startswith("."))
    except OSError:
        return f"the directory {p.parent} cannot be listed either: check the path (and the mount) first."
    if not names:
        return f"{p.parent} holds no files: check the path, or whether checkpoints were written on another node."
    shown = ", ".join(names[-5:])
    return f"check the path; {p.parent} holds: {shown}" + (" ..." if len(names) > 5 else "")
