"""Small helpers shared by the catalogue's check functions (pure: no I/O)."""

from __future__ import annotations

from typing import Any

from ..model import Evidence
from ..units import human_bytes

__all__ = ["Evidence", "ev", "human_bytes"]


def ev(label: str, value: Any, source: str = "") -> Evidence:
    return Evidence(label=label, value=value, source=source)

