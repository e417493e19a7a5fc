"""Repeated line shapes cost what grep pays for them.

Real training logs repeat themselves: the same ``UserWarning`` with its ``warnings.warn(`` echo on
every rank and step, tqdm bars redrawn thousands of times, logger lines whose metric names hold
``Error``. A line's *shape* is its bytes without digits (ranks, steps, losses, times and pids
differ; the words do not; padding and tqdm's bar glyphs are left out too). :class:`RepeatFilter` works per block of whole lines, at C speed
(``bytes.translate``, ``bytes.split``, set operations): lines whose shape was already read in an
earlier block are skipped before the literal scan, so a block made only of known shapes costs
one translate, one split and one set difference, and no Python work per line.

What is read in full:

* the lines of a block whose shape is new: its first :data:`PER_BLOCK` occurrences in that block,
  so the ranks that print the same failure side by side are all seen;
* lines holding a window opener (``Traceback``, torchrun's summary markers): their shape is never
  learned, so every traceback is stitched from its own lines;
* lines inside an open window (a traceback's frames, a summary's entries), whatever their shape:
  the caller reads the gap lines a window covers (see :func:`~.stream.read_all`).

A failure printed again blocks later with the same shape (a second rank's identical watchdog
line a megabyte on) is counted in ``skipped_repeats``, not listed again: the first occurrence,
which is what triage orders by, was read.
"""

from __future__ import annotations

from typing import Any, NamedTuple

SHAPELESS = b"0123456789 #.+-" + bytes(range(0x80, 0x100))
"""Bytes a shape leaves out: digits and what numbers are written with, padding, and non-ASCII (tqdm's bar
glyphs ``█▏▎``)."""
NEVER_LEARNED = (b"Traceback", b"Failures:", b"Root Cause", b"local_rank:", b"error.json")
"""Lines holding one of these open a window or carry a summary: they are always read."""
PER_BLOCK = 32
"""Lines of one new shape read in the block where it first appears (a window opener's: all)."""
MAX_ECHOES = 1_000
"""Failure shapes watched for echoes (see :meth:`RepeatFilter.watch`)."""
STALE_ECHOES = 1_000
"""Echoes in a row that named no new rank, after which a shape is no longer watched (a warning
every rank prints each step: its ranks are known, its count becomes a lower bound)."""


class Plan(NamedTuple):
    """What to read of one block."""

    runs: list[tuple[int, int]] | None
    """Byte ranges ``[s, e)`` of whole lines to read, in order; None means the whole block."""
    newlines: int
    """Newlines in the block (free here: the caller need not count them again)."""
    shapes: list[bytes]
    """The shape of each line of the block."""
    kept: list[int]
    """Indexes of the lines read (all of them when ``runs`` is None)."""


MAX_SHAPES = 200_000
"""Shapes remembered; past this the memory is cleared (a log of only unique lines is read in full)."""


class RepeatFilter:
    """Which runs of a block's lines to read: those whose shape no earlier block had."""

    def __init__(self) -> None:
        self.seen: set[bytes] = set()
        self.skipped = 0
        self.echo: dict[bytes, Any] = {}
        self.stale: dict[bytes, int] = {}
        """Per watched shape, echoes in a row without a new rank; -1 once it is no longer watched."""

    def watch(self, line: bytes, keys: Any) -> None:
        """``line`` (read in full) showed a failure: later lines of its shape are not read again but
        returned as *echoes*, so the caller can still count them and list their ranks (the same
        NCCL error printed by every rank of a large job) at the cost of a prefix parse, not a match."""
        shape = line.translate(None, SHAPELESS)
        if len(self.echo) < MAX_ECHOES and shape not in self.stale:
            self.echo[shape] = keys
            self.stale[shape] = 0

    def echoed(self, shape: bytes, new_rank: bool) -> None:
        """The caller read an echo of ``shape``; it named a rank not seen before, or not."""
        if new_rank:
            self.stale[shape] = 0
            return
        self.stale[shape] += 1
        if self.stale[shape] >= STALE_ECHOES:
            self.echo.pop(shape, None)
            self.stale[shape] = -1

    def echoes(self, data: bytes, start: int, end: int, plan: Plan) -> list[tuple[int, int, bytes, Any]]:
        """``(s, e, shape, keys)`` of the lines ``plan`` skipped whose shape is a watched failure's;
        asked after the block's kept lines were read, so a failure first seen in this block counts."""
        echo, shapes = self.echo, plan.shapes
        if not echo or plan.runs is None or echo.keys().isdisjoint(shapes):
            return []
        out = []
        skip = set(plan.kept)
        find = data.find
        pos = start
        for i, shape in enumerate(shapes):
            nxt = find(b"\n", pos, end) + 1 or end
            keys = echo.get(shape)
            if keys is not None and i not in skip:
                out.append((pos, nxt, shape, keys))
            pos = nxt
        return out

    def runs(self, data: bytes, start: int, end: int) -> Plan:
        """What to read of the block ``data[start:end]``: see :class:`Plan`."""
        # a shape is learned from the block it first appears in; lines holding a window opener never are
        shapes = data[start:end].translate(None, SHAPELESS).split(b"\n")
        newlines = len(shapes) - 1
        if not shapes[-1]:
            shapes.pop()  # the block ends with a newline
        if self.seen.issuperset(shapes):  # the usual block of a long log: no new shape, no set built
            self.skipped += len(shapes)
            return Plan([], newlines, shapes, [])
        new = set(shapes)
        new.difference_update(self.seen)
        self._learn(new)
        if not new:
            self.skipped += len(shapes)
            return Plan([], newlines, shapes, [])
        budget = {shape: PER_BLOCK if shape in self.seen else len(shapes) for shape in new}
        kept = []
        for i, shape in enumerate(shapes):
            left = budget.get(shape)
            if left:
                kept.append(i)
                budget[shape] = left - 1
        if len(kept) == len(shapes):
            return Plan(None, newlines, shapes, kept)
        out: list[tuple[int, int]] = []
        find = data.find
        pos, line = start, 0  # pos: offset of line number ``line`` (0-based in the block)
        run_start, run_end, prev = -1, start, -2
        for i in kept:
            while line < i:  # walk to line i; only blocks with a new shape pay this
                pos = find(b"\n", pos, end) + 1
                line += 1
            if run_start < 0:
                run_start = pos
            elif i > prev + 1:
                out.append((run_start, run_end))
                run_start = pos
            prev = i
            pos = find(b"\n", pos, end) + 1 or end
            line += 1
            run_end = pos
        out.append((run_start, run_end))
        self.skipped += len(shapes) - len(kept)
        return Plan(out, newlines, shapes, kept)

    def _learn(self, new: set[bytes]) -> None:
        if len(self.seen) + len(new) > MAX_SHAPES:
            self.seen.clear()
        self.seen.update(s for s in new if not any(m in s for m in NEVER_LEARNED))
