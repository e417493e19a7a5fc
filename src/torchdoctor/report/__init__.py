"""Renderers: one :class:`~torchdoctor.model.Finding` model, three formats."""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

from ..model import Finding
from . import json_report, markdown, text

if TYPE_CHECKING:
    from ..checks import Passed

FORMATS = ("text", "json", "markdown")


def render_findings(
    findings: Sequence[Finding],
    fmt: str,
    command: str,
    out: IO[str],
    context: dict[str, Any] | None = None,
    passed: Sequence[Passed] | None = None,
    verbose: bool = False,
) -> None:
    """Write a findings report in ``fmt`` to ``out``. ``context`` adds command-specific fields.

    ``passed`` (``check``): what was checked and found fine; JSON lists it as ``passed``, Markdown in a
    section, text compactly (in full with ``verbose``). None leaves it out of every format.
    """
    context = context or {}
    if fmt == "json":
        json_report.write(findings, command, out, context, passed)
    elif fmt == "markdown":
        out.write(markdown.render(findings, command, context, passed))
    else:
        text.write(findings, command, out, context, passed, verbose)
