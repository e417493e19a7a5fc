"""Parsing /proc/self/mountinfo, shared by the shm and paths gatherers."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Mount:
    mount_point: str
    fstype: str
    source: str
    options: tuple[str, ...]
    """Per-mount and super-block options together (``rw``, ``size=65536k`` ...)."""

    @property
    def read_only(self) -> bool:
        return "ro" in self.options

    def option(self, name: str) -> str | None:
        for opt in self.options:
            key, _, value = opt.partition("=")
            if key == name:
                return value
        return None

    def to_dict(self) -> dict[str, object]:
        return {
            "mount_point": self.mount_point,
            "fstype": self.fstype,
            "source": self.source,
            "options": list(self.options),
        }


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal: \040 \011 \012 \134
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) + 0 and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """Mounts in the order the kernel lists them (later entries shadow earlier ones)."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        parts = line.split()
        if "-" not in parts:
            continue
        sep = parts.index("-")
        if sep < 6 or len(parts) < sep + 3:
            continue
        mount_opts = parts[5].split(",")
        fstype, source = parts[sep + 1], _unescape(parts[sep + 2])
        super_opts = parts[sep + 3].split(",") if len(parts) > sep + 3 else []
        opts = tuple(dict.fromkeys(mount_opts + super_opts))
        mounts.append(Mount(_unescape(parts[4]), fstype, source, opts))
    return mounts


def mount_for(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount a path lives on: the longest matching mount point, the last one listed winning."""
    target = os.path.normpath(path)
    best: Mount | None = None
    for m in mounts:
        mp = m.mount_point
        if target == mp or target.startswith(mp.rstrip("/") + "/") or mp == "/":
            if best is None or len(mp) >= len(best.mount_point):
                best = m
    return best
