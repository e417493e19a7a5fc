"""``explain`` reports as text (rich), Markdown and JSON. rich is imported only for text."""

from __future__ import annotations

import json
from typing import IO, Any

from .model import Diagnosis, ExplainReport, LineRef, UnmatchedError

_ROLE_LABEL = {"root-cause": "Root cause", "cascade": "Cascade", "confirmation": "Confirmation", "advice": "Advice"}
_ROLE_STYLE = {"root-cause": "bold red", "cascade": "yellow", "confirmation": "cyan", "advice": "dim"}
TEXT_LINE = 300


def render(report: ExplainReport, fmt: str, out: IO[str]) -> None:
    if fmt == "json":
        json.dump(report.to_dict(), out, indent=2, default=str)
        out.write("\n")
    elif fmt == "markdown":
        out.write(markdown(report))
    else:
        write_text(report, out)


def _short(text: str, width: int = TEXT_LINE) -> str:
    text = text.strip()
    return text if len(text) <= width else text[: width - 1] + "…"


def _where(ref: LineRef) -> str:
    rank = f" [rank {ref.rank}]" if ref.rank is not None else ""
    return f"{ref.location}{rank}"


def _who(d: Diagnosis) -> str:
    parts = []
    if d.rank is not None:
        parts.append(f"rank {d.rank}")
    if d.host:
        parts.append(f"on {d.host}")
    if len(d.ranks) > 1:
        parts.append(f"(ranks {d.ranks_text})")
    return " ".join(parts)


def _summary(report: ExplainReport) -> str:
    n = len(report.sources)
    return f"{n} source{'s' if n != 1 else ''}, {report.lines:,} lines"


def _first_failure_line(report: ExplainReport) -> str | None:
    ff = report.first_failure
    if not ff:
        return None
    who = f"rank {ff['rank']}" if ff.get("rank") is not None else ""
    host = f" on {ff['host']}" if ff.get("host") else ""
    where = f"{ff['file']}:{ff['line']}" if ff.get("file") and ff.get("line") else ""
    if who and where:
        where = f" ({where})"
    elif not who:
        who, where = where or "unknown rank", ""
    how = {"diagnosis": "", "torchrun-summary": " according to torchrun's summary", "unmatched-error": ""}.get(ff.get("source", ""), "")
    extra = f", exit code {ff['exitcode']}" if ff.get("exitcode") is not None else ""
    return f"First failure: {who}{host}{where}{how}{extra}"


# --------------------------------------------------------------------------- text


def write_text(report: ExplainReport, out: IO[str]) -> None:
    from rich.text import Text

    from ..report.text import stripped

    with stripped(out) as console:
        console.print(Text(f"torchdoctor explain · {_summary(report)}", style="bold"))
        console.print()
        if not report.diagnoses:
            _text_unmatched(console, report, headline=True)
        else:
            _text_block(console, report.diagnoses[0], report)
        rest = report.diagnoses[1:]
        if rest:
            from rich.padding import Padding

            console.print()
            console.print(Text("Also found", style="bold underline"))
            for d in rest:
                line = Text()
                line.append(f"{d.code} {d.name}", style=_ROLE_STYLE.get(d.role, ""))
                line.append(f"  {d.role}")
                if d.ranks:
                    line.append(f", ranks {d.ranks_text}")
                line.append(f", {d.count} line{'s' if d.count != 1 else ''}")
                if d.explained_by:
                    line.append(f" (explained by {d.explained_by})", style="dim")
                console.print(Padding(line, (0, 0, 0, 2)))
                console.print(Padding(Text(f"{_where(d.evidence[0])}  {_short(d.evidence[0].text, 160)}", style="dim"), (0, 0, 0, 6)))
        if report.diagnoses and report.root_cause is None and report.unmatched_errors:
            console.print()
            _text_unmatched(console, report, headline=False)
        for note in report.notes:
            console.print(Text(f"note: {note}", style="dim"))


def _text_block(console: Any, d: Diagnosis, report: ExplainReport) -> None:
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    head = Text()
    head.append(f"{_ROLE_LABEL.get(d.role, d.role)}: ", style=_ROLE_STYLE.get(d.role, ""))
    head.append(f"{d.code} {d.name}", style="bold")
    head.append(f"  [{d.family}]  confidence {d.confidence:.2f}", style="dim")
    console.print(head)
    ff = _first_failure_line(report)
    if ff and d.role == "root-cause":
        console.print(Padding(Text(ff), (0, 0, 0, 2)))
    elif _who(d):
        console.print(Padding(Text(_who(d)), (0, 0, 0, 2)))
    console.print(Padding(Text(d.message), (0, 0, 0, 2)))
    console.print(Padding(Text("evidence:", style="dim"), (0, 0, 0, 2)))
    for ref in d.evidence:
        console.print(Padding(Text(f"{_where(ref)}  {_short(ref.text)}"), (0, 0, 0, 4)))
    if d.traceback:
        console.print(Padding(Text("traceback (last frames):", style="dim"), (0, 0, 0, 2)))
        for line in d.traceback[-6:]:
            console.print(Padding(Text(_short(line, 160), style="dim"), (0, 0, 0, 4)))
    for note in d.notes:
        console.print(Padding(Text(f"note: {note}", style="dim"), (0, 0, 0, 2)))
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="green", no_wrap=True)
    grid.add_column()
    grid.add_row("fix:", d.fix.strip())
    grid.add_row("more:", Text(f"torchdoctor codes {d.code}", style="dim"))
    console.print(Padding(grid, (0, 0, 0, 2)))


def _text_unmatched(console: Any, report: ExplainReport, headline: bool) -> None:
    from rich.padding import Padding
    from rich.text import Text

    if headline:
        console.print(Text(f"No known failure signature matched ({_summary(report)}).", style="bold yellow"))
    if not report.unmatched_errors:
        if headline:
            console.print(Text("No error lines either (nothing with Error, Exception, Traceback, Killed or signal)."))
        return
    console.print(Text("The most relevant error lines:" if headline else "Unexplained error lines:", style="bold"))
    for u in report.unmatched_errors:
        more = f"  (×{u.count}" + (f", ranks {_ranks(u)})" if len(u.ranks) > 1 else ")") if u.count > 1 else ""
        console.print(Padding(Text(f"{_where(u.ref)}  {_short(u.ref.text)}{more}"), (0, 0, 0, 2)))
        if u.traceback and len(u.traceback) > 1:
            console.print(Padding(Text(_short(u.traceback[-1], 160), style="dim"), (0, 0, 0, 6)))
    ff = _first_failure_line(report)
    if ff and headline:
        console.print(Text(ff))
    if headline:
        console.print(Text("If this is a failure torchdoctor should know, report it with these lines.", style="dim"))


def _ranks(u: UnmatchedError) -> str:
    from .model import rank_ranges

    return rank_ranges(u.ranks)


# --------------------------------------------------------------------------- markdown


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(report: ExplainReport) -> str:
    lines = ["## torchdoctor explain", "", f"{_summary(report)}.", ""]
    ff = _first_failure_line(report)
    if not report.diagnoses:
        lines += ["**No known failure signature matched.**", ""]
    for i, d in enumerate(report.diagnoses):
        level = "###" if i == 0 else "####"
        lines += [f"{level} {_ROLE_LABEL.get(d.role, d.role)}: {d.code} `{d.name}` (family `{d.family}`, confidence {d.confidence:.2f})", ""]
        if i == 0 and ff and d.role == "root-cause":
            lines += [ff, ""]
        elif _who(d):
            lines += [_who(d), ""]
        lines += [d.message, ""]
        lines += ["| where | rank | line |", "|---|---|---|"]
        lines += [f"| `{_md(r.location)}` | {r.rank if r.rank is not None else ''} | `{_md(_short(r.text, 200))}` |" for r in d.evidence]
        lines.append("")
        for note in d.notes:
            lines += [f"_{note}_", ""]
        if i == 0 or d.role == "root-cause":
            lines += ["**Fix:**", "", "```", d.fix.strip(), "```", "", f"More: `torchdoctor codes {d.code}`", ""]
    if report.unmatched_errors and report.root_cause is None:
        lines += ["### Most relevant error lines", ""]
        lines += [f"- `{_md(u.ref.location)}` {f'(rank {u.ref.rank}) ' if u.ref.rank is not None else ''}`{_md(_short(u.ref.text, 200))}`" for u in report.unmatched_errors]
        lines.append("")
        if ff and not report.diagnoses:
            lines += [ff, ""]
    lines += [f"_note: {_md(n)}_" for n in report.notes]
    return "\n".join(lines).rstrip("\n") + "\n"
