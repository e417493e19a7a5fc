"""What a gatherer may use: a root to read /proc, /sys and /etc from, an argv runner with a
timeout, the (read-only) environment, and a place to record facts that could not be read."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunResult:
    argv: tuple[str, ...]
    returncode: int | None
    stdout: str
    stderr: str
    error: str | None = None
    """Why the command could not run or finish (not found, timed out); None when it ran."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.returncode == 0


@dataclass
class GatherContext:
    """Everything a gatherer may touch. Tests swap ``root`` and ``env`` to replay fixtures."""

    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    root: Path = Path("/")
    paths: tuple[str, ...] = ()
    dist: bool = False
    torch: bool = True
    """Read facts about the installed torch (never imports it into this process)."""
    show_uuids: bool = False
    section_timeout: float = 8.0
    command_timeout: float = 5.0
    unknowns: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def unknown(self, fact: str, reason: str) -> None:
        with self._lock:
            self.unknowns[fact] = reason

    def path(self, absolute: str) -> Path:
        """Map an absolute host path (``/proc/meminfo``) under :attr:`root`."""
        return self.root / absolute.lstrip("/")

    def read_text(self, absolute: str, fact: str | None = None) -> str | None:
        """File contents, or None (recording why under ``fact`` when given)."""
        try:
            return self.path(absolute).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            if fact:
                self.unknown(fact, f"cannot read {absolute}: {exc.strerror or exc}")
            return None

    def read_int(self, absolute: str, fact: str | None = None) -> int | None:
        text = self.read_text(absolute, fact)
        if text is None:
            return None
        try:
            return int(text.split()[0])
        except (ValueError, IndexError):
            if fact:
                self.unknown(fact, f"unexpected content in {absolute}: {text[:40]!r}")
            return None

    def run(self, argv: list[str], timeout: float | None = None) -> RunResult:
        """Run a command from an argv list (never a shell), bounded in time."""
        t = self.command_timeout if timeout is None else timeout
        try:
            proc = subprocess.run(  # noqa: S603 - argv list, no shell
                argv,
                capture_output=True,
                text=True,
                timeout=t,
                stdin=subprocess.DEVNULL,
                errors="replace",
            )
        except FileNotFoundError:
            return RunResult(tuple(argv), None, "", "", error=f"{argv[0]} not found")
        except subprocess.TimeoutExpired:
            return RunResult(tuple(argv), None, "", "", error=f"{argv[0]} timed out after {t:g} s")
        except OSError as exc:
            return RunResult(tuple(argv), None, "", "", error=f"{argv[0]}: {exc}")
        return RunResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)

    def describe(self) -> dict[str, Any]:
        return {"paths": list(self.paths), "dist": self.dist, "torch": self.torch, "root": str(self.root)}
