"""One log file for every rank and worker, without glued or cut lines.

Many processes appending to one file with ``open(path, "a")`` and ``print()`` interleave: Python's
buffered writer flushes whenever its buffer fills, in the middle of a line, and ``print`` writes the
text and the newline separately. :class:`RankFile` buffers per process until a newline and appends the
complete lines with ONE ``os.write`` on an ``O_APPEND`` descriptor.

Complete lines are batched: they are written at most ``flush_every`` seconds (default 0.2) after the
first of them, by the next ``write`` or by one background thread shared by every RankFile of the
process, or at once when 64 KiB are waiting, on :meth:`flush`, :meth:`close`, and at interpreter exit.
One system call per batch instead of one per line is what keeps a line per training step far below
1% of the step (``benchmarks/guard_overhead.py``). The price: a process killed by SIGKILL (or SIGTERM
without a handler) loses the lines of its last ``flush_every`` seconds. ``flush_every=0`` writes every
line as it completes, as a line-buffered file does.

Limits (why it is safe and where it is not):

* On a local file system (ext4, xfs, btrfs, tmpfs) Linux serialises writes to one regular file and
  ``O_APPEND`` moves to the end and writes in one step, so each ``os.write`` lands whole, after the
  others, at any reasonable size (lines up to a few MiB; a write cut short by a full disk or a signal
  is finished with a second write, which can then be separated from the first).
* NFS does not make ``O_APPEND`` atomic across clients (hosts): each client computes the end of file
  itself. Pass ``lock=True`` to take a POSIX record lock (``fcntl.lockf``, forwarded to the NFS server
  by the lock manager) around each append. Ranks on one host do not need it.
* A line without its newline waits in the process until the next newline and the batch it joins;
  :meth:`flush` writes complete lines only, :meth:`close` writes the rest. A partial line longer than
  :attr:`RankFile.MAX_PENDING` characters is written as it is, to bound memory.
* After ``fork()`` the child starts with an empty buffer: waiting lines belong to the parent.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar, overload

from .checkpoint import current_rank

__all__ = ["RankFile", "RankFileHandler", "rank0_only"]

F = TypeVar("F", bound=Callable[..., Any])


class RankFile(io.TextIOBase):
    """A text file many processes append lines to: ``print(..., file=RankFile(path))``.

    ``prefix`` (e.g. ``"[rank {rank}] "``, ``{rank}`` and ``{pid}`` filled in) starts every line.
    ``flush_every``: seconds a complete line may wait to be written with others (0: at once)."""

    MAX_PENDING = 1 << 20
    BATCH_BYTES = 64 << 10

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        lock: bool = False,
        prefix: str = "",
        encoding: str = "utf-8",
        flush_every: float = 0.2,
    ) -> None:
        super().__init__()
        if isinstance(flush_every, bool) or not isinstance(flush_every, (int, float)) or not flush_every >= 0:
            raise ValueError(f"flush_every must be a number of seconds >= 0; got {flush_every!r}")
        self.path = Path(os.fspath(path))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(
            self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666
        )
        self._lock_file = lock
        self._encoding = encoding
        self._prefix_template = prefix
        self._flush_every = float(flush_every)
        self._partial = ""  # the line being written, without its newline yet
        self._lines: list[str] = []  # complete lines (each chunk ends with a newline), not yet written
        self._size = 0
        self._since = 0.0  # monotonic time of the oldest waiting complete line
        self._gen = _forks
        self._mutex = threading.Lock()
        if self._flush_every:
            _flusher.add(self)

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
            if self._fd is None:
                raise ValueError("I/O operation on closed RankFile")
            if self._gen != _forks:  # forked: what waits belongs to the parent, which writes it
                self._gen, self._partial, self._lines, self._size = _forks, "", [], 0
                if self._flush_every:
                    _flusher.add(self)
            cut = s.rfind("\n") + 1
            if not cut:
                self._partial += s
                if len(self._partial) > self.MAX_PENDING:  # bound memory: write it as it is
                    self._queue(self._partial)
                    self._partial = ""
                    self._write_out()
                return len(s)
            self._queue(self._partial + s[:cut] if self._partial else s[:cut])
            self._partial = s[cut:]
            if (
                not self._flush_every
                or self._size >= self.BATCH_BYTES
                or time.monotonic() - self._since >= self._flush_every
            ):
                self._write_out()
        return len(s)

    def flush(self) -> None:
        """Write the complete lines waiting now; a partial line stays until its newline."""
        with self._mutex:
            if self._fd is not None and self._gen == _forks:
                self._write_out()

    def close(self) -> None:
        with self._mutex:
            if self._fd is None:
                return
            try:
                if self._gen == _forks:
                    if self._partial:
                        self._queue(self._partial + "\n")
                    self._write_out()
            finally:
                self._partial, self._lines, self._size = "", [], 0
                os.close(self._fd)
                self._fd = None
        _flusher.discard(self)
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

    def _queue(self, text: str) -> None:
        if not self._lines:
            self._since = time.monotonic()
        self._lines.append(text)
        self._size += len(text)

    def _flush_due(self, now: float) -> None:
        """Called by the background thread: write the batch if its oldest line has waited long enough."""
        with self._mutex:
            if self._lines and self._fd is not None and self._gen == _forks and now - self._since >= self._flush_every:
                self._write_out()

    def _write_out(self) -> None:
        """Write every waiting complete line with one append (the mutex is held)."""
        if not self._lines:
            return
        text = "".join(self._lines)
        self._lines, self._size = [], 0
        if self._prefix_template:
            prefix = self._prefix_template.format(rank=current_rank(), pid=os.getpid())
            text = "".join(prefix + line for line in text.splitlines(keepends=True))
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


class _Flusher:
    """One daemon thread per process writing the batches of every open RankFile that are due. It starts
    with the first open RankFile (again in a forked child, where threads do not survive) and ends when
    none is open any more, so a program that closes its files exits with no thread of ours running.
    Flushes every open file at exit."""

    TICK = 0.05

    def __init__(self) -> None:
        self._files: weakref.WeakSet[RankFile] = weakref.WeakSet()
        self._guard = threading.Lock()
        self._pid = -1
        atexit.register(self.flush_all)

    def add(self, f: RankFile) -> None:
        with self._guard:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                self._files = weakref.WeakSet()
                threading.Thread(target=self._run, name="torchdoctor-rankfile-flush", daemon=True).start()
            self._files.add(f)

    def discard(self, f: RankFile) -> None:
        with self._guard:
            self._files.discard(f)

    def _run(self) -> None:
        pid = os.getpid()
        while True:
            time.sleep(self.TICK)
            with self._guard:
                if self._pid != pid:
                    return
                files = list(self._files)
                if not files:  # every RankFile is closed: the thread ends; the next RankFile starts another
                    self._pid = -1
                    return
            now = time.monotonic()
            for f in files:
                try:
                    f._flush_due(now)
                except Exception:  # a full disk or a closed descriptor: the next write reports it
                    pass

    def flush_all(self) -> None:
        for f in list(self._files):
            try:
                f.flush()
            except Exception:
                pass


_flusher = _Flusher()

#: how many fork()s separate this process from the one that imported this module: a RankFile created
#: before a fork sees a different number in the child (cheaper than os.getpid() on every write)
_forks = 0


def _after_fork_in_child() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)  # one call for the whole batch; only a short write needs another
        view = view[n:]


class RankFileHandler(logging.Handler):
    """A :class:`logging.Handler` appending each formatted record (tracebacks included) whole; records
    batch like :class:`RankFile` lines, except ERROR and above, written at once with what waits."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        lock: bool = False,
        level: int = logging.NOTSET,
        prefix: str = "",
        flush_every: float = 0.2,
    ) -> None:
        super().__init__(level)
        self.file = RankFile(path, lock=lock, prefix=prefix, flush_every=flush_every)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.file.write(self.format(record) + "\n")
            if record.levelno >= logging.ERROR:
                self.file.flush()
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
