"""Rich terminal report, grouped by area. Colour only on a TTY; ``NO_COLOR`` is honoured.

Width: ``COLUMNS`` when set, else the terminal's, else (piped) 100 columns.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..model import Finding, Severity
from ..registry import AREAS
from ..units import human_bytes
from .json_report import summary

if TYPE_CHECKING:
    from ..checks import Passed

#: Width of piped output when COLUMNS is not set.
PIPE_WIDTH = 100

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
_MARK = {Severity.ERROR: "✖", Severity.WARNING: "▲", Severity.INFO: "●"}


def output_width(out: IO[str]) -> int | None:
    """``COLUMNS`` when it is a sane number, else None on a terminal (rich asks it), else :data:`PIPE_WIDTH`."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and 20 <= int(columns) <= 10_000:
        return int(columns)
    return None if _isatty(out) else PIPE_WIDTH


def make_console(out: IO[str]) -> Console:
    no_color = "NO_COLOR" in os.environ
    return Console(
        file=out,
        no_color=no_color,
        highlight=False,
        soft_wrap=False,
        width=output_width(out),
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


def write(
    findings: Sequence[Finding],
    command: str,
    out: IO[str],
    context: dict[str, Any],
    passed: Sequence[Passed] | None = None,
    verbose: bool = False,
) -> None:
    with stripped(out) as console:
        _write(console, findings, command, context, passed, verbose)


def compact_codes(codes: Sequence[str]) -> str:
    """``TD101-TD103, TD110`` for runs of consecutive codes."""
    nums = sorted(int(c[2:]) for c in codes if c[2:].isdigit())
    runs: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        runs.append(f"TD{nums[i]:03d}" if i == j else f"TD{nums[i]:03d}-TD{nums[j]:03d}")
        i = j + 1
    return ", ".join(runs)


def machine_line(m: Mapping[str, Any]) -> str:
    """The machine in one line: ``Linux 6.8 x86_64 · Python 3.11.7 · torch 2.4.1 (CUDA 12.1) · 8 CPUs · ...``."""
    parts = []
    if m.get("os"):
        parts.append(str(m["os"]))
    if m.get("python"):
        parts.append(f"Python {m['python']}")
    if m.get("torch"):
        parts.append(f"torch {m['torch']}" + (f" (CUDA {m['torch_cuda']})" if m.get("torch_cuda") else ""))
    cpus = m.get("cpus")
    if isinstance(cpus, (int, float)):
        parts.append(f"{cpus:g} usable CPUs")
    if isinstance(m.get("memory_bytes"), (int, float)):
        parts.append(f"{human_bytes(m['memory_bytes'])} RAM")
    if m.get("gpus"):
        models = m.get("gpu_models") or []
        what = f"{m['gpus']} × {models[0]}" if len(models) == 1 else f"{m['gpus']} GPUs"
        driver = [f"driver {m['gpu_driver']}"] if m.get("gpu_driver") else []
        driver += [f"CUDA {m['gpu_driver_cuda']}"] if m.get("gpu_driver_cuda") else []
        parts.append(what + (f" ({', '.join(driver)})" if driver else ""))
    else:
        parts.append("no GPU")
    if m.get("container"):
        parts.append(f"{m['container']} container")
    return " · ".join(parts)


def passed_block(passed: Sequence[Passed], verbose: bool) -> Any:
    """What was checked and found fine: one paragraph, or (verbose) one line each with how it was judged."""
    if not verbose:
        line = Text()
        line.append(f"✔ Checked and fine ({len(passed)}): ", style="green")
        line.append(" · ".join(f"{p.subject}: {p.value}" for p in passed))
        line.append("  (--verbose: one line each, with how it was judged)", style="dim")
        return line
    width = min(28, max(len(p.subject) for p in passed))
    codes_width = max(len(compact_codes(p.codes)) for p in passed)
    parts: list[Any] = [Text("Checked and fine", style="bold green")]
    for p in passed:
        row = Table.grid(padding=(0, 1), expand=True)
        row.add_column(style="green", no_wrap=True)
        row.add_column(width=width, overflow="fold")
        row.add_column(ratio=1)
        row.add_column(style="dim", no_wrap=True, width=codes_width)
        row.add_row("✔", p.subject, p.value, compact_codes(p.codes))
        parts.append(Padding(row, (0, 0, 0, 2)))
        parts.append(Padding(Text(p.detail, style="dim", overflow="fold"), (0, 0, 0, 4)))
    return Group(*parts)


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


def _write(
    console: Console,
    findings: Sequence[Finding],
    command: str,
    context: dict[str, Any],
    passed: Sequence[Passed] | None = None,
    verbose: bool = False,
) -> None:
    source = context.get("source")
    title = f"torchdoctor {command}" + (f" · {source}" if source else "")
    console.print(Text(title, style="bold"))
    if isinstance(context.get("machine"), dict):
        console.print(Text(machine_line(context["machine"]), style="dim"))
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
    if passed:
        console.print()
        console.print(passed_block(passed, verbose))
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
