"""Facts gatherer (being written)."""

from __future__ import annotations

from typing import Any

from .context import GatherContext


def gather(ctx: GatherContext) -> dict[str, Any]:
    return {}
