r"""Log signatures: how a failure mode is recognised in a log. Declared on the code they diagnose.

A :class:`Signature` is data: a role, cheap literal triggers, one regular expression with named
groups for the values a person needs, and near-miss exclusions. The matcher (``torchdoctor.explain``)
only runs a signature's regex on lines that contain one of its triggers.

Roles (after nvidia-resiliency-ext's log analyser):

* ``root-cause``: this line is a failure in its own right (``unable to mmap ... (12)``);
* ``cascade``: a symptom of a failure elsewhere (watchdog timeouts, "worker exited unexpectedly"):
  look for an earlier root cause, on this rank or another;
* ``confirmation``: strengthens a diagnosis but names no cause by itself (a bare ``Killed``, exit -9);
* ``advice``: context printed next to failures (CUDA's "might be asynchronously reported"):
  never a cause;
* ``symptom``: a symptom or a sentence that points at this code without proving it (a worker that
  "exited unexpectedly" inside a container, "hangs after the first epoch with num_workers > 0",
  a generic exception in telling frames). It makes a *hypothesis*: ranked with its confidence
  (kept below 0.8: a hypothesis is never a sure answer) and how to confirm it (:attr:`Signature.confirm`).
  Several codes may declare the same symptom with different weights; without a root cause the
  strongest hypothesis leads.

Where a signature is tried (the engine's rules, see :mod:`torchdoctor.explain.stream`): on log lines,
never on a traceback's frame or source lines. Two opt-ins widen or narrow that:

* ``frames=True``: the signature is tried *only* where a traceback was cut before its exception line
  (a paste that stops at a frame): on that traceback's last source line, which the pattern sees
  after the :data:`FRAME_TAIL` - 1 kept frame lines above it, one per line (``\n``-separated,
  stripped); a match must reach into the last line. For code that only one library raises from
  (``raise _env_error("MASTER_ADDR")`` in torch's env:// rendezvous);
* ``context=(...)``: literals, at least one of which must occur in the traceback that the matched
  exception line closes (its kept frame and source lines, stripped, joined by ``\n``: a literal
  may span a frame line and its source line, ``"in _rmtree_safe_fd\nos.unlink("``). A line that
  closes no traceback never matches such a signature.

Recognition is separated from evidence. People edit what they paste and trackers cut it, so a line
that fails :attr:`Signature.pattern` is tried twice more (:meth:`Signature.match`):

* **placeholders**: every named group, and every bare ``\d+``, also accepts what people type
  instead of a value (``...``, ``…``, ``XXX``, ``***``, ``<ip>``, ``[redacted]``, ``N``);
  the value is then absent (a diagnosis shows it as unknown), the diagnosis is not. Such a match
  must hold one of the signature's triggers in full;
* **truncation**: a line that ends inside the pattern (``… Tried to allocate 17.19 MiB f...``) is a
  match when what it does hold covers one of the signature's triggers in full (the stable core
  phrase); values cut at the end of the line are dropped.

Exclusions apply to every form, and accept placeholders where they name a value (``\d+``, a named
group) just as the pattern does, so near misses stay near misses once their values are scrubbed.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import regex  # type: ignore[import-untyped]

FRAME_TAIL = 4
"""Traceback lines a ``frames=True`` pattern sees: the last source line and the three lines above it
(the frame line it belongs to, and the calling frame's two lines)."""


PLACEHOLDER = (
    r"(?:\.{3,}|…|[Xx]{2,}|\*{2,}|#{2,}|\?+|<[^<>\n]{1,40}>|\[[^\[\]\n]{1,40}\]|"
    r"_{2,}|(?<![A-Za-z])N(?![a-z]{3}))"
)
"""What people type where a value was: ``...``, ``…``, ``XXX``, ``***``, ``<ip>``, ``[redacted]``, ``N``. Not
``{name}``: that is a format string in source code, the template of the message, not the message."""
_CUT_MARKS = re.compile(r"(?:\s*(?:\.{3,}|…|\[(?:truncated|cut)\]))+\s*$")
MIN_CUT_MATCH = 12
"""A cut line must hold at least this many characters of the pattern (and a whole trigger)."""
_MAX_STARTS = 32
"""Start positions a placeholder-tolerant search tries before giving up (see ``Signature._tolerant_search``)."""


def tolerant(pattern: str) -> str:
    """``pattern`` with every named group, and every bare ``\\d+``, also accepting a :data:`PLACEHOLDER`."""
    inserts: list[tuple[int, str]] = []
    stack: list[tuple[int, bool]] = []
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\":
            bare = not in_class and not any(named for _, named in stack)
            if bare and pattern.startswith("\\d+", i) and (i + 3 >= n or pattern[i + 3] not in "?*+{"):
                inserts += [(i, "(?:"), (i + 3, "|" + PLACEHOLDER + ")")]
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern.startswith("[^]", i) or pattern.startswith("[]", i):
                i += 2 if pattern[i + 1] == "]" else 3
                continue
        elif c == "(":
            stack.append((i, pattern.startswith("(?P<", i)))
        elif c == ")" and stack:
            start, named = stack.pop()
            if named:
                inserts += [(start, "(?:"), (i + 1, "|" + PLACEHOLDER + ")")]
        i += 1
    out = pattern
    for pos, text in sorted(inserts, key=lambda p: p[0], reverse=True):
        out = out[:pos] + text + out[pos:]
    return out


class Role(str, enum.Enum):
    ROOT_CAUSE = "root-cause"
    CASCADE = "cascade"
    CONFIRMATION = "confirmation"
    ADVICE = "advice"
    SYMPTOM = "symptom"


SYMPTOM_MAX = 0.75
"""A symptom's confidence stays below the 0.8 that sure answers carry."""


@dataclass(frozen=True)
class Signature:
    """One way a failure shows up in text."""

    role: Role
    triggers: tuple[str, ...]
    """Literal substrings; a line must contain at least one of them for :attr:`pattern` to run."""
    pattern: str
    """Regex (searched, case-sensitive unless it says ``(?i)``) with named groups for values."""
    exclude: tuple[str, ...] = ()
    """Regexes; a line matching any of them is a near miss, not a match."""
    confidence: float = 0.9
    """How sure a match makes us that this code is the failure (0..1)."""
    values: dict[str, str] = field(default_factory=dict)
    """Constant values added to the extracted ones (e.g. ``{"strategy": "file_system"}``)."""
    frames: bool = False
    """Tried only on the last source line of a traceback cut before its exception line (module doc)."""
    context: tuple[str, ...] = ()
    """Literals; one of them must occur in the traceback the matched line closes (module doc)."""
    confirm: str = ""
    """For a ``symptom``: how to confirm the hypothesis (a command to run, the log line to look for)."""

    def __post_init__(self) -> None:
        if not self.triggers:
            raise ValueError("a signature needs at least one literal trigger")
        if not 0 < self.confidence <= 1:
            raise ValueError("confidence must be in (0, 1]")
        if isinstance(self.context, str) or not all(isinstance(c, str) and c for c in self.context):
            raise ValueError("context must be a tuple of non-empty literals")
        if self.frames and self.context:
            raise ValueError("a frames signature matches inside the traceback: it takes no context")
        if self.role is Role.SYMPTOM and (not self.confirm or self.confidence > SYMPTOM_MAX):
            raise ValueError(f"a symptom needs a confirm text and a confidence <= {SYMPTOM_MAX}")
        # Patterns compile lazily (only signatures whose trigger is seen); tests compile them all.

    @cached_property
    def regex(self) -> re.Pattern[str]:
        return re.compile(self.pattern)

    @cached_property
    def exclusions(self) -> tuple[re.Pattern[str], ...]:
        """The :attr:`exclude` regexes, tolerant of placeholders like the pattern (a near miss whose
        values were scrubbed, ``[Errno XXX] Address already in use``, is still that near miss)."""
        return tuple(re.compile(tolerant(e)) for e in self.exclude)

    @property
    def symptom(self) -> bool:
        """A symptom's match is a hypothesis: it never ends a wrapped message, opens no window and explains
        no neighbouring error line (see :mod:`torchdoctor.explain.stream`)."""
        return self.role is Role.SYMPTOM

    @cached_property
    def _has_values(self) -> bool:
        """Whether the pattern has values a placeholder could stand for (else its tolerant form is itself)."""
        return tolerant(self.pattern) != self.pattern

    @cached_property
    def tolerant_regex(self) -> Any:
        """:attr:`pattern` accepting placeholders for values (module doc); supports partial matches."""
        return regex.compile(tolerant(self.pattern))

    def match(self, line: str, cut: bool = False) -> dict[str, str] | None:
        """Extracted values when the log line ``line`` matches (triggers are the caller's prefilter), else
        None. A ``frames`` signature never matches a log line (see :meth:`match_frames`); a ``context``
        signature's traceback is the caller's to check (:meth:`in_context`). Placeholders are tolerated
        (module doc), and a cut end when the line says it was cut (``...``, ``…``) or ``cut`` is true (the
        engine passes it once the next line did not continue this one); the values they hide are left out."""
        if self.frames or any(ex.search(line) for ex in self.exclusions):
            return None
        m = self.regex.search(line)
        if m is not None:
            return self._values(m)
        t = self._tolerant_search(line) if self._has_values else None
        if t is not None:
            return self._values(t)
        if (cut or _CUT_MARKS.search(line)) and not self.symptom:  # prose ends where it likes
            return self._cut_match(line)
        return None

    def _holds_trigger(self, text: str) -> bool:
        return any(t in text for t in self.triggers)

    def _tolerant_search(self, text: str, partial: bool = False) -> Any:
        """The first match of :attr:`tolerant_regex` in ``text`` that holds a whole trigger, or None.

        Not merely the leftmost match: where a pattern's head is optional, a placeholder-shaped value
        earlier in the line (NCCL's ``[0]`` device tag) is a match of its own that holds no trigger,
        and the one that does starts later. Later starts are tried up to the last trigger."""
        last = max(text.rfind(t) for t in self.triggers)
        if last < 0:
            return None
        pos = 0
        for _ in range(_MAX_STARTS):
            try:
                m = self.tolerant_regex.search(text, pos, partial=partial, timeout=0.05)
            except TimeoutError:
                return None
            if m is None or m.start() > last:
                return None
            if self._holds_trigger(m.group(0)):
                return m
            pos = m.start() + 1
        return None

    def _cut_match(self, line: str) -> dict[str, str] | None:
        """Values when ``line`` ends inside the pattern, holding a whole trigger (module doc)."""
        text = _CUT_MARKS.sub("", line.rstrip())
        if len(text) < MIN_CUT_MATCH:
            return None
        m = self._tolerant_search(text, partial=True)
        # a full match counts too: the cut fell where the pattern may end (`...c:3...` once `...` is gone)
        if m is None or len(m.group(0)) < MIN_CUT_MATCH:
            return None
        found = {k: v for k, v in m.groupdict().items() if v is not None and m.end(k) < len(text)}
        return {**self.values, **found}

    def match_frames(self, tail: Sequence[str]) -> dict[str, str] | None:
        """Values when the pattern matches the last lines of a cut traceback (``tail``, oldest first,
        the last source line last) and the match reaches into that last line; else None."""
        lines = [line.strip() for line in tail[-FRAME_TAIL:]]
        if not lines:
            return None
        text = "\n".join(lines)
        last_start = len(text) - len(lines[-1])
        if any(ex.search(text) for ex in self.exclusions):
            return None
        for m in self.regex.finditer(text):
            if m.end() > last_start:
                return self._values(m)
        return None

    def in_context(self, traceback: Sequence[str]) -> bool:
        """True when the signature needs no context, or one of its literals is in ``traceback``."""
        if not self.context:
            return True
        if not traceback:
            return False
        text = "\n".join(line.strip() for line in traceback)
        return any(c in text for c in self.context)

    def _values(self, m: Any) -> dict[str, str]:
        found = {k: v for k, v in m.groupdict().items() if v is not None}
        return {**self.values, **found}


def prose_gap(n: int, *avoid: str) -> str:
    """A pattern fragment: up to ``n`` characters of one sentence holding none of ``avoid`` (regex
    fragments). A prose symptom's gap cannot swallow its triggers, so a line the engine takes as cut
    short (a partial match must hold a trigger) matches only once it reached the pattern's last part."""
    return r"(?:(?!" + "|".join(avoid) + r")[^.\n]){0," + str(n) + "}"
