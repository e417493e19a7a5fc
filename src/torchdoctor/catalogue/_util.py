"""Small helpers shared by the catalogue's check functions (pure: no I/O)."""

from __future__ import annotations

import posixpath
from typing import Any

from ..model import Evidence
from ..units import human_bytes

__all__ = [
    "OWN_DIRECTORY",
    "SHARED_PARENTS",
    "SYSTEM_TREES",
    "Evidence",
    "ev",
    "human_bytes",
    "is_system_path",
    "system_root",
]


def ev(label: str, value: Any, source: str = "") -> Evidence:
    return Evidence(label=label, value=value, source=source)


#: Trees of the operating system: a fix never moves, deletes, truncates, chowns or chmods anything in them.
SYSTEM_TREES = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/run",
    "/sbin",
    "/snap",
    "/sys",
    "/usr",
    "/var",
)
#: Directories whose *subdirectories* belong to users (scratch, homes, volumes); the directories themselves
#: are shared by everybody (e.g. /tmp is mode 1777) and count as system paths.
SHARED_PARENTS = (
    "/tmp",
    "/var/tmp",
    "/dev/shm",
    "/run/user",
    "/home",
    "/root",
    "/mnt",
    "/media",
    "/srv",
    "/opt",
    "/scratch",
    "/data",
    "/workspace",
)
#: What to suggest instead of touching a system path.
OWN_DIRECTORY = "a directory you own (e.g. `mkdir -p $HOME/checkpoints`, or the job's scratch directory)"


def system_root(path: str | None) -> str | None:
    """The system tree ``path`` lies in (``"/usr"`` for ``/usr/lib/x``), or None for a user's path.

    ``/`` itself, the system trees and everything in them, and the shared parents themselves
    (``/tmp``, ``/home``) are system paths; a subdirectory of a shared parent (``/tmp/run1``,
    ``/home/alice/ckpt``) is not. Relative and unknown paths are treated as system paths: a fix
    for them must not be destructive either.
    """
    if not path or not str(path).startswith("/"):
        return str(path or "?")
    p = posixpath.normpath(str(path))
    if p.startswith("//"):
        p = "/" + p.lstrip("/")
    if p == "/":
        return "/"
    for parent in SHARED_PARENTS:
        if p == parent:
            return parent
        if p.startswith(parent + "/"):
            return None
    for tree in SYSTEM_TREES:
        if p == tree or p.startswith(tree + "/"):
            return tree
    return None


def is_system_path(path: str | None) -> bool:
    """Whether ``path`` belongs to the operating system or is shared by every user (see :func:`system_root`)."""
    return system_root(path) is not None
