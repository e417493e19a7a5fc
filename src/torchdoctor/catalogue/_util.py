"""Small helpers shared by the catalogue's check functions (pure: no I/O)."""

from __future__ import annotations

from typing import Any

from ..facts import Facts
from ..model import Evidence
from ..units import human_bytes

__all__ = ["Evidence", "ev", "human_bytes", "fact"]


def ev(label: str, value: Any, source: str = "") -> Evidence:
    return Evidence(label=label, value=value, source=source)


def fact(facts: Facts, path: str) -> Any:
    """Shorthand for ``facts.get(path)``; ``None`` when unknown."""
    return facts.get(path)
