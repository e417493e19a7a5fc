"""How torchdoctor is stopped: SIGTERM and SIGHUP become an exception, so every child's cleanup
runs (see :mod:`torchdoctor.supervise`); light enough for the CLI to import on every start."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def signal_name(exit_code: int | None) -> str | None:
    """``SIGKILL`` for a child that died of signal 9 (``exit_code`` -9); None for a normal exit."""
    if exit_code is None or exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


def pid_alive(pid: int) -> bool:
    """A process with this PID exists (this user's or another's). A PID can be reused: alive is not proof that
    the process is the one that wrote a name, so callers only ever clean up after PIDs that are gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except (OverflowError, ValueError):  # no such PID can exist
        return False
    return True


class Stopped(BaseException):
    """torchdoctor itself was asked to stop (SIGTERM, SIGHUP) while it supervised a child."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextmanager
def stoppable() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Stopped` in the main thread for the duration (so the
    supervisor's cleanup runs, as it does for Ctrl-C); the previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_stopped(signum: int, _frame: Any) -> None:
        raise Stopped(signum)

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            previous[sig] = signal.signal(sig, raise_stopped)
        except (ValueError, OSError):
            continue
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
