"""``explain`` reports as text, Markdown and JSON.

Text is laid out by :class:`~.textout.Writer`: plain off a terminal (rich is not even imported, which
keeps a pasted traceback's explain fast), coloured through rich on a terminal.

Every format is redacted by default: the report is quoted into public bug reports, so secrets the
logs hold (``postgres://user:pw@...``, ``GITHUB_TOKEN=ghp_...``, ``token=...``) are replaced by
``<redacted>`` in every string of it first, with :func:`torchdoctor.facts.redact.redact_text`, the
one redaction function ``facts`` uses too. Matching is not affected: it runs on the raw lines.
"""

from __future__ import annotations

import dataclasses
from typing import IO, TYPE_CHECKING, Any, cast

from ..facts.redact import REDACTED, redact_text
from .model import Diagnosis, ExplainReport, LineRef, UnmatchedError

if TYPE_CHECKING:
    from .textout import Writer

_ROLE_LABEL = {
    "root-cause": "Root cause",
    "cascade": "Cascade",
    "confirmation": "Confirmation",
    "advice": "Advice",
    "hypothesis": "Likely cause (hypothesis)",
    "guess": "A guess from the words (nothing recognised)",
}
_ROLE_STYLE = {
    "root-cause": "bold red",
    "cascade": "yellow",
    "confirmation": "cyan",
    "advice": "dim",
    "hypothesis": "magenta",
    "guess": "dim magenta",
}
TEXT_LINE = 300
ALSO_UNEXPLAINED = 3
"""Unexplained error lines shown (tier 3 and up) under a named root cause."""
LABEL = 5
"""Width of the ``fix:`` / ``more:`` label column."""


def render(report: ExplainReport, fmt: str, out: IO[str], redact: bool = True) -> None:
    """Write ``report`` as ``fmt`` (``text``, ``markdown`` or ``json``); secrets removed unless
    ``redact`` is false (then the JSON says ``"redacted": false``)."""
    if redact:
        report = redacted(report)
    if fmt == "json":
        import json

        doc = report.to_dict()
        doc["redacted"] = redact
        json.dump(doc, out, indent=2, default=str)
        out.write("\n")
    elif fmt == "markdown":
        out.write(markdown(report))
    else:
        write_text(report, out)


def redacted(report: ExplainReport) -> ExplainReport:
    """A copy of ``report`` with :func:`~torchdoctor.facts.redact.redact_text` applied to every
    string it holds (evidence, tracebacks, messages and values filled from the log, first failure,
    per-rank facts, notes), before any of it is cut short for display."""
    return cast(ExplainReport, _scrub(report))


def _scrub(node: Any) -> Any:
    if isinstance(node, str):
        return redact_text(node)
    if isinstance(node, list):
        return [_scrub(x) for x in node]
    if isinstance(node, tuple):
        return tuple(_scrub(x) for x in node)
    if isinstance(node, (set, frozenset)):
        return type(node)(_scrub(x) for x in node)
    if isinstance(node, dict):
        return {k: _scrub(v) for k, v in node.items()}
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        changes = {f.name: _scrub(getattr(node, f.name)) for f in dataclasses.fields(node) if f.init}
        return dataclasses.replace(node, **changes)
    return node


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
    how = {"diagnosis": "", "torchrun-summary": " according to torchrun's summary", "unmatched-error": ""}.get(
        ff.get("source", ""), ""
    )
    extra = f", exit code {ff['exitcode']}" if ff.get("exitcode") is not None else ""
    return f"First failure: {who}{host}{where}{how}{extra}"


# --------------------------------------------------------------------------- text


def write_text(report: ExplainReport, out: IO[str]) -> None:
    from .textout import Writer

    w = Writer(out)
    w.line(f"torchdoctor explain · {_summary(report)}", style="bold")
    w.blank()
    if not report.diagnoses:
        _text_unmatched(w, report, headline=True)
    elif report.diagnoses[0].role == "guess":
        w.line(f"No known failure signature matched ({_summary(report)}).", style="bold yellow")
        w.blank()
        _text_block(w, report.diagnoses[0], report)
    else:
        _text_block(w, report.diagnoses[0], report)
    rest = report.diagnoses[1:]
    if rest:
        w.blank()
        w.line("Also found", style="bold underline")
        for d in rest:
            line = [(f"{d.code} {d.name}", _ROLE_STYLE.get(d.role, "")), (f"  {d.role}", "")]
            if d.ranks:
                line.append((f", ranks {d.ranks_text}", ""))
            line.append((f", {d.count} line{'s' if d.count != 1 else ''}", ""))
            if d.explained_by:
                line.append((f" (explained by {d.explained_by})", "dim"))
            if d.role == "hypothesis":
                line.append((f", confidence {d.confidence:.2f}", "dim"))
            w.line(line, indent=2)
            w.line(f"{_where(d.evidence[0])}  {_short(d.evidence[0].text, 160)}", indent=6, style="dim")
    if report.diagnoses and report.root_cause is None and report.unmatched_errors:
        w.blank()
        _text_unmatched(w, report, headline=False)
    elif report.root_cause is not None:
        _text_unexplained(w, report)
    for note in report.notes:
        w.line(f"note: {note}", style="dim")


def _text_block(w: Writer, d: Diagnosis, report: ExplainReport) -> None:
    w.line(
        [
            (f"{_ROLE_LABEL.get(d.role, d.role)}: ", _ROLE_STYLE.get(d.role, "")),
            (f"{d.code} {d.name}", "bold"),
            (f"  [{d.family}]  confidence {d.confidence:.2f}", "dim"),
        ]
    )
    ff = _first_failure_line(report)
    if ff and d.role == "root-cause":
        w.line(ff, indent=2)
    elif _who(d):
        w.line(_who(d), indent=2)
    w.line(d.message, indent=2)
    w.line("evidence:", indent=2, style="dim")
    for ref in d.evidence:
        w.line(f"{_where(ref)}  {_short(ref.text)}", indent=4)
    if d.traceback:
        w.line("traceback (last frames):", indent=2, style="dim")
        for line in d.traceback[-6:]:
            w.line(_short(line, 160), indent=4, style="dim")
    for note in d.notes:
        w.line(f"note: {note}", indent=2, style="dim")
    if d.confirm:
        w.labelled("check:", d.confirm, LABEL)
    w.labelled("fix:", d.fix, LABEL)
    w.labelled("more:", f"torchdoctor codes {d.code}", LABEL, style="dim")


def _unexplained(report: ExplainReport) -> list[UnmatchedError]:
    return [u for u in report.unmatched_errors if u.score >= 3][:ALSO_UNEXPLAINED]


def _text_unexplained(w: Writer, report: ExplainReport) -> None:
    """Error lines the root cause does not account for: a second failure must not hide behind it."""
    items = _unexplained(report)
    if not items:
        return
    root = report.root_cause.code if report.root_cause else "the root cause"
    w.blank()
    w.line(f"Not explained by {root} (another failure?):", style="bold")
    for u in items:
        w.line(f"{_where(u.ref)}  {_short(u.ref.text)}", indent=2)


def _text_unmatched(w: Writer, report: ExplainReport, headline: bool) -> None:
    if headline:
        w.line(f"No known failure signature matched ({_summary(report)}).", style="bold yellow")
    if not report.unmatched_errors:
        if headline:
            w.line("No error lines either (no exception, error, failure, signal, exit code or warning line).")
        return
    w.line("The most relevant error lines:" if headline else "Unexplained error lines:", style="bold")
    for u in report.unmatched_errors:
        more = f"  (×{u.count}" + (f", ranks {_ranks(u)})" if len(u.ranks) > 1 else ")") if u.count > 1 else ""
        w.line(f"{_where(u.ref)}  {_short(u.ref.text)}{more}", indent=2)
        if u.traceback and len(u.traceback) > 1:
            w.line(_short(u.traceback[-1], 160), indent=6, style="dim")
    ff = _first_failure_line(report)
    if ff and headline:
        w.line(ff)
    if headline:
        w.line("If this is a failure torchdoctor should know, report it with these lines.", style="dim")


def _ranks(u: UnmatchedError) -> str:
    from .model import rank_ranges

    return rank_ranges(u.ranks)


# --------------------------------------------------------------------------- markdown


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _prose(text: str) -> str:
    """Markdown outside code spans: the redaction marker escaped, or it would render as an (empty) HTML tag."""
    return text.replace(REDACTED, "\\" + REDACTED[:-1] + "\\>")


def markdown(report: ExplainReport) -> str:
    lines = ["## torchdoctor explain", "", f"{_summary(report)}.", ""]
    ff = _first_failure_line(report)
    if not report.diagnoses:
        lines += ["**No known failure signature matched.**", ""]
    for i, d in enumerate(report.diagnoses):
        level = "###" if i == 0 else "####"
        lines += [
            f"{level} {_ROLE_LABEL.get(d.role, d.role)}: {d.code} `{d.name}` (family `{d.family}`, confidence {d.confidence:.2f})",
            "",
        ]
        if i == 0 and ff and d.role == "root-cause":
            lines += [_prose(ff), ""]
        elif _who(d):
            lines += [_prose(_who(d)), ""]
        lines += [_prose(d.message), ""]
        lines += ["| where | rank | line |", "|---|---|---|"]
        lines += [
            f"| `{_md(r.location)}` | {r.rank if r.rank is not None else ''} | `{_md(_short(r.text, 200))}` |"
            for r in d.evidence
        ]
        lines.append("")
        for note in d.notes:
            lines += [f"_{_prose(note)}_", ""]
        if i == 0 or d.role == "root-cause":
            lines += ["**Fix:**", "", "```", d.fix.strip(), "```", "", f"More: `torchdoctor codes {d.code}`", ""]
    if report.root_cause is not None and _unexplained(report):
        lines += [f"### Not explained by {report.root_cause.code}", ""]
        lines += [
            f"- `{_md(u.ref.location)}` {f'(rank {u.ref.rank}) ' if u.ref.rank is not None else ''}`{_md(_short(u.ref.text, 200))}`"
            for u in _unexplained(report)
        ]
        lines.append("")
    if report.unmatched_errors and report.root_cause is None:
        lines += ["### Most relevant error lines", ""]
        lines += [
            f"- `{_md(u.ref.location)}` {f'(rank {u.ref.rank}) ' if u.ref.rank is not None else ''}`{_md(_short(u.ref.text, 200))}`"
            for u in report.unmatched_errors
        ]
        lines.append("")
        if ff and not report.diagnoses:
            lines += [_prose(ff), ""]
    lines += [f"_note: {_prose(_md(n))}_" for n in report.notes]
    return "\n".join(lines).rstrip("\n") + "\n"
