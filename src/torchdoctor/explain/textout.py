"""A small line writer for ``explain``'s text report: styled segments, wrapped once, two backends.

The report is laid out here (indentation, hanging indents, wrapping at word boundaries, long words
folded), the same way whatever the output is. Off a terminal the lines are written as plain text,
100 columns wide, without importing rich (most of a pasted traceback's explain time would
otherwise be rich's import); on a terminal each wrapped line is printed through a rich console, which
adds colour (``NO_COLOR`` honoured) at the terminal's width.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import IO, Any

PLAIN_WIDTH = 100
"""Columns off a terminal (what ``torchdoctor check`` uses too)."""

Segment = tuple[str, str]
"""(text, rich style); the style is ignored off a terminal."""
Parts = str | Sequence[Segment]

_TOKEN_RE = re.compile(r"\S+\s*")


def isatty(out: IO[str]) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


def wrap_offsets(text: str, width: int, rest: int | None = None) -> list[tuple[int, int]]:
    """``(start, end)`` of each line when ``text`` (no newlines) is wrapped greedily: the first line
    at ``width`` columns, the others at ``rest`` (default: ``width``).

    Words are kept whole unless longer than a line (then folded); spaces at a break are dropped.
    """
    widths = (max(1, width), max(1, rest if rest is not None else width))
    lines: list[tuple[int, int]] = []
    start = end = None
    for m in _TOKEN_RE.finditer(text):
        word_end = m.start() + len(m.group().rstrip())
        if start is not None and end is not None and word_end - start <= widths[bool(lines)]:
            end = word_end
            continue
        if start is not None and end is not None:
            lines.append((start, end))
        start = m.start() if lines or start is not None else 0  # the first line keeps its indentation
        while word_end - start > widths[bool(lines)]:  # a word longer than a line: fold it
            lines.append((start, start + widths[bool(lines)]))
            start = lines[-1][1]
        end = word_end
    if start is not None and end is not None:
        lines.append((start, end))
    return lines or [(0, 0)]


def _cut(segments: Sequence[Segment], start: int, end: int) -> list[Segment]:
    out: list[Segment] = []
    pos = 0
    for text, style in segments:
        a, b = max(start, pos), min(end, pos + len(text))
        if a < b:
            out.append((text[a - pos : b - pos], style))
        pos += len(text)
    return out


class Writer:
    """Collects wrapped, styled lines and writes them to ``out`` (see the module doc)."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.tty = isatty(out)
        self.console: Any = None
        if self.tty:
            from rich.console import Console

            self.console = Console(file=out, no_color="NO_COLOR" in os.environ, highlight=False, emoji=False)
            self.width = self.console.width
        else:
            self.width = PLAIN_WIDTH

    def line(self, parts: Parts = "", indent: int = 0, style: str = "", hang: int | None = None) -> None:
        """One paragraph: wrapped to the width less ``indent``; continuation lines indented by
        ``hang`` (default: ``indent``). A ``str`` takes ``style`` whole; newlines start new lines."""
        segments: list[Segment] = [(parts, style)] if isinstance(parts, str) else list(parts)
        text = "".join(t for t, _ in segments)
        if "\n" in text:
            pos = 0
            for i, piece in enumerate(text.split("\n")):
                self.line(
                    _cut(segments, pos, pos + len(piece)),
                    indent if i == 0 else (hang if hang is not None else indent),
                    hang=hang,
                )
                pos += len(piece) + 1
            return
        hang = indent if hang is None else hang
        for i, (a, b) in enumerate(wrap_offsets(text, self.width - indent, self.width - hang)):
            pad = " " * (indent if i == 0 else hang)
            self._emit([(pad, "")] + _cut(segments, a, b))

    def labelled(self, label: str, body: str, label_width: int, indent: int = 2, style: str = "") -> None:
        """``label`` in a column of its own (green), ``body`` wrapped beside it, hanging."""
        column = indent + label_width + 1
        self.line([(f"{label:<{label_width}} ", "green"), (body.strip(), style)], indent=indent, hang=column)

    def blank(self) -> None:
        self._emit([])

    def _emit(self, segments: list[Segment]) -> None:
        if self.console is None:
            self.out.write("".join(t for t, _ in segments).rstrip() + "\n")
            return
        from rich.text import Text

        self.console.print(Text.assemble(*segments), soft_wrap=True)
