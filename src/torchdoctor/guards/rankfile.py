"""One log file for every rank and worker, without glued or cut lines.

Many processes appending to one file with ``open(path, "a")`` and ``print()`` interleave: Python's
buffered writer flushes whenever its buffer fills, in the middle of a line, and ``print`` writes the
text and the newline separately. :class:`RankFile` buffers per process until a newline and appends the
complete lines with ONE ``os.write`` on an ``O_APPEND`` descriptor.

Limits (why it is safe and where it is not):

* On a local file system (ext4, xfs, btrfs, tmpfs) Linux serialises writes to one regular file and
  ``O_APPEND`` moves to the end and writes in one step, so each ``os.write`` lands whole, after the
  others, at any reasonable size (lines up to a few MiB; a write cut short by a full disk or a signal
  is finished with a second write, which can then be separated from the first).
* NFS does not make ``O_APPEND`` atomic across clients (hosts): each client computes the end of file
  itself. Pass ``lock=True`` to take a POSIX record lock (``fcntl.lockf``, forwarded to the NFS server
  by the lock manager) around each append. Ranks on one host do not need it.
* A line without its newline waits in the process until the next newline, :meth:`flush` (which
  writes complete lines only), or :meth:`close` (which writes the rest). A partial line longer than
  :attr:`RankFile.MAX_PENDING` characters is written as it is, to bound memory.
* After ``fork()`` the child starts with an empty buffer: a partial line belongs to the parent.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar, overload

from .checkpoint import current_rank

__all__ = ["RankFile", "RankFileHandler", "rank0_only"]

F = TypeVar("F", bound=Callable[..., Any])


class RankFile(io.TextIOBase):
    """A text file many processes append lines to: ``print(..., file=RankFile(path))``.

    ``prefix`` (e.g. ``"[rank {rank}] "``, ``{rank}`` and ``{pid}`` filled in) starts every line."""

    MAX_PENDING = 1 << 20

    def __init__(
        self, path: str | os.PathLike[str], *, lock: bool = False, prefix: str = "", encoding: str = "utf-8"
    ) -> None:
        super().__init__()
        self.path = Path(os.fspath(path))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(
            self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666
        )
        self._lock_file = lock
        self._encoding = encoding
        self._prefix_template = prefix
        self._pending = ""
        self._pid = os.getpid()
        self._mutex = threading.Lock()

    # --- io.TextIOBase ------------------------------------------------------------------------------

    @property  # typeshed declares a plain attribute; at run time TextIOBase's is read-only
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding

    @property
    def closed(self) -> bool:
        return self._fd is None

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        if self._fd is None:
            raise ValueError("I/O operation on closed RankFile")
        return self._fd

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        with self._mutex:
            self._check_open()
            if self._pid != os.getpid():  # forked: the parent's partial line is not ours to write
                self._pid, self._pending = os.getpid(), ""
            self._pending += s
            cut = self._pending.rfind("\n") + 1
            if cut:
                done, self._pending = self._pending[:cut], self._pending[cut:]
                self._append(done)
            elif len(self._pending) > self.MAX_PENDING:
                done, self._pending = self._pending, ""
                self._append(done)
        return len(s)

    def flush(self) -> None:
        """Complete lines are written by :meth:`write` already; a partial line stays until its newline."""
        with self._mutex:
            if self._fd is None:
                return

    def close(self) -> None:
        with self._mutex:
            if self._fd is None:
                return
            try:
                if self._pending and self._pid == os.getpid():
                    self._append(self._pending + "\n")
            finally:
                self._pending = ""
                os.close(self._fd)
                self._fd = None
        super().close()

    def __enter__(self) -> RankFile:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # --- internals ----------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._fd is None:
            raise ValueError("I/O operation on closed RankFile")

    def _append(self, text: str) -> None:
        if self._prefix_template:
            prefix = self._prefix_template.format(rank=current_rank(), pid=os.getpid())
            lines = text.splitlines(keepends=True)
            text = "".join(prefix + line for line in lines)
        data = text.encode(self._encoding, "backslashreplace")
        assert self._fd is not None
        if self._lock_file:
            import fcntl

            fcntl.lockf(self._fd, fcntl.LOCK_EX)
            try:
                _write_all(self._fd, data)
            finally:
                fcntl.lockf(self._fd, fcntl.LOCK_UN)
        else:
            _write_all(self._fd, data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)  # one call for the whole batch; only a short write needs another
        view = view[n:]


class RankFileHandler(logging.Handler):
    """A :class:`logging.Handler` appending each formatted record (tracebacks included) with one write."""

    def __init__(
        self, path: str | os.PathLike[str], *, lock: bool = False, level: int = logging.NOTSET, prefix: str = ""
    ) -> None:
        super().__init__(level)
        self.file = RankFile(path, lock=lock, prefix=prefix)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.file.write(self.format(record) + "\n")
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        try:
            self.file.close()
        finally:
            super().close()


class _Rank0Only:
    """``with rank0_only():`` silences the body's stdout on every rank but 0 (the body still runs)."""

    def __init__(self) -> None:
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> bool:
        self._stack = contextlib.ExitStack()
        is_zero = current_rank() == 0
        if not is_zero:
            devnull = self._stack.enter_context(open(os.devnull, "w"))
            self._stack.enter_context(contextlib.redirect_stdout(devnull))
        return is_zero

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        assert self._stack is not None
        self._stack.close()

    def __call__(self, fn: F) -> F:
        return rank0_only(fn)


@overload
def rank0_only(fn: F) -> F: ...
@overload
def rank0_only(fn: None = None) -> _Rank0Only: ...
def rank0_only(fn: Callable[..., Any] | None = None) -> Any:
    """Run ``fn`` on global rank 0 only (other ranks get ``None``), as ``@rank0_only`` or ``@rank0_only()``;
    or ``with rank0_only() as is_zero:`` to silence stdout on other ranks (the body runs everywhere, so
    collectives inside it stay matched). The rank is read at call time (:func:`current_rank`)."""
    if fn is None:
        return _Rank0Only()

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if current_rank() != 0:
            return None
        return fn(*args, **kwargs)

    return wrapper
