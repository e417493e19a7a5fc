"""Renderers: one :class:`~torchdoctor.model.Finding` model, three formats."""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, Any

from ..model import Finding
from . import json_report, markdown, text

FORMATS = ("text", "json", "markdown")


def render_findings(
    findings: Sequence[Finding],
    fmt: str,
    command: str,
    out: IO[str],
    context: dict[str, Any] | None = None,
) -> None:
    """Write a findings report in ``fmt`` to ``out``. ``context`` adds command-specific fields."""
    context = context or {}
    if fmt == "json":
        json_report.write(findings, command, out, context)
    elif fmt == "markdown":
        out.write(markdown.render(findings, command, context))
    else:
        text.write(findings, command, out, context)
