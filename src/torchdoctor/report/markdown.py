"""Markdown for pasting into a bug report or a PR."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..model import Finding
from .json_report import summary

_ICON = {"error": "❌", "warning": "⚠️", "info": "ℹ️"}


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def render(findings: Sequence[Finding], command: str, context: dict[str, Any]) -> str:
    s = summary(findings)
    lines = [f"## torchdoctor {command}", ""]
    if context.get("source"):
        lines += [f"Facts: {context['source']}", ""]
    lines += [f"**{s['error']} error(s), {s['warning']} warning(s), {s['info']} info**", ""]
    if not findings:
        lines += ["No findings.", ""]
    for f in findings:
        lines += [f"### {_ICON[f.severity.label]} {f.code} `{f.name}` ({f.severity.label}, family `{f.family}`)", ""]
        lines += [f.message, ""]
        if f.evidence:
            lines += ["| evidence | value | source |", "|---|---|---|"]
            lines += [f"| {_cell(e.label)} | {_cell(e.value)} | {_cell(e.source)} |" for e in f.evidence]
            lines.append("")
        lines += ["**Fix:**", "", "```", f.fix.strip(), "```", ""]
        if f.related:
            lines += [f"Related: {', '.join(f.related)}", ""]
    return "\n".join(lines)
