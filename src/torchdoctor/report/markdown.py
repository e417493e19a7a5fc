"""Markdown for pasting into a bug report or a PR."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..model import Finding
from .json_report import summary
from .text import compact_codes, machine_line

if TYPE_CHECKING:
    from ..checks import Passed

_ICON = {"error": "❌", "warning": "⚠️", "info": "ℹ️"}


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def render(
    findings: Sequence[Finding], command: str, context: dict[str, Any], passed: Sequence[Passed] | None = None
) -> str:
    s = summary(findings)
    lines = [f"## torchdoctor {command}", ""]
    if context.get("source"):
        lines += [f"Facts: {context['source']}", ""]
    if isinstance(context.get("machine"), dict):
        lines += [f"Machine: {machine_line(context['machine'])}", ""]
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
    if passed is not None:
        lines += ["### ✅ Checked and fine", ""]
        if passed:
            lines += ["| checked | found | how it was judged | codes |", "|---|---|---|---|"]
            lines += [
                f"| {_cell(p.subject)} | {_cell(p.value)} | {_cell(p.detail)} | {_cell(compact_codes(p.codes))} |"
                for p in passed
            ]
        else:
            lines += ["Nothing could be checked and found fine (see the findings above)."]
        lines.append("")
    return "\n".join(lines)
