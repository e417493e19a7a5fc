"""Rich terminal report, grouped by area. Colour only on a TTY; ``NO_COLOR`` is honoured."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any

from rich.console import Console, Group
from rich.padding import Padding
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
        width=None if _isatty(out) else 100,
        emoji=False,
    )


def finding_block(f: Finding) -> Group:
    head = Text()
    head.append(f"{_MARK[f.severity]} {f.code} ", style=_STYLE[f.severity])
    head.append(f.name, style="bold")
    head.append(f"  [{f.family}]", style="dim")
    parts: list[Any] = [head, Padding(Text(f.message), (0, 0, 0, 2))]
    if f.evidence:
        table = Table(show_header=False, box=None, padding=(0, 1), pad_edge=False)
        table.add_column(style="dim", no_wrap=True)
        table.add_column(ratio=2)
        table.add_column(style="dim", ratio=1)
        for e in f.evidence:
            table.add_row(e.label, str(e.value), e.source)
        parts.append(Padding(table, (0, 0, 0, 4)))
    fix = Table.grid(padding=(0, 1))
    fix.add_column(style="green", no_wrap=True)
    fix.add_column()
    fix.add_row("fix:", f.fix.strip())
    fix.add_row("more:", Text(f"torchdoctor codes {f.code}", style="dim"))
    parts.append(Padding(fix, (0, 0, 0, 2)))
    return Group(*parts)


def write(findings: Sequence[Finding], command: str, out: IO[str], context: dict[str, Any]) -> None:
    with stripped(out) as console:
        _write(console, findings, command, context)


@contextmanager
def stripped(out: IO[str]) -> Iterator[Console]:
    """A console for ``out``; off a TTY, lines are captured and their padding spaces removed."""
    if _isatty(out):
        yield make_console(out)
        return
    buf = io.StringIO()
    console = make_console(buf)
    yield console
    out.write("\n".join(line.rstrip() for line in buf.getvalue().split("\n")))


def _isatty(out: IO[str]) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


def _write(console: Console, findings: Sequence[Finding], command: str, context: dict[str, Any]) -> None:
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
