"""Rich terminal report, grouped by area. Colour only on a TTY; ``NO_COLOR`` is honoured."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import IO, Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..model import Finding, Severity
from ..registry import AREAS
from .json_report import summary

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
_MARK = {Severity.ERROR: "✖", Severity.WARNING: "▲", Severity.INFO: "●"}


def make_console(out: IO[str]) -> Console:
    no_color = "NO_COLOR" in os.environ
    return Console(
        file=out,
        no_color=no_color,
        highlight=False,
        soft_wrap=False,
        width=None if out.isatty() else 100,
        emoji=False,
    )


def finding_block(f: Finding) -> Group:
    head = Text()
    head.append(f"{_MARK[f.severity]} {f.code} ", style=_STYLE[f.severity])
    head.append(f.name, style="bold")
    head.append(f"  [{f.family}]", style="dim")
    parts: list[Any] = [head, Text("  " + f.message)]
    if f.evidence:
        table = Table(show_header=False, box=None, padding=(0, 1), pad_edge=False)
        table.add_column(style="dim", no_wrap=True)
        table.add_column()
        table.add_column(style="dim")
        for e in f.evidence:
            table.add_row("   " + e.label, str(e.value), e.source)
        parts.append(table)
    fix = Text("  fix: ", style="green")
    fix.append(f.fix.strip().replace("\n", "\n       "))
    parts.append(fix)
    parts.append(Text(f"  more: torchdoctor codes {f.code}", style="dim"))
    return Group(*parts)


def write(findings: Sequence[Finding], command: str, out: IO[str], context: dict[str, Any]) -> None:
    console = make_console(out)
    source = context.get("source")
    title = f"torchdoctor {command}" + (f" · {source}" if source else "")
    console.print(Text(title, style="bold"))
    by_area: dict[str, list[Finding]] = {}
    for f in findings:
        by_area.setdefault(f.area, []).append(f)
    for area in list(AREAS) + sorted(set(by_area) - set(AREAS)):
        items = by_area.get(area)
        if not items:
            continue
        console.print()
        console.print(Panel.fit(Text(AREAS.get(area, area), style="bold"), border_style="dim"))
        for f in items:
            console.print(finding_block(f))
    s = summary(findings)
    console.print()
    line = Text()
    line.append(f"{s['error']} error(s)", style="bold red" if s["error"] else "green")
    line.append(", ")
    line.append(f"{s['warning']} warning(s)", style="yellow" if s["warning"] else "green")
    line.append(f", {s['info']} info")
    if not findings:
        line = Text("No findings.", style="green")
    console.print(line)
