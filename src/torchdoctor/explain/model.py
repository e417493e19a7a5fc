"""The model of ``explain`` (and of ``lab run``'s "reproduced" verdict, which reads it through
:func:`torchdoctor.explain.shows`): :class:`ExplainReport` holding ranked :class:`Diagnosis` es.
``check`` and ``loader`` report :class:`torchdoctor.model.Finding` s instead.

The JSON form (``ExplainReport.to_dict``) is documented in ``docs/explain-json.md`` and is stable:
keys are only ever added.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..model import ExitCode

SCHEMA_VERSION = 1
EVIDENCE_TEXT = 2000
"""Characters of one evidence line kept in the report."""


@dataclass(frozen=True)
class LineRef:
    """One line of evidence and where it was read: file, 1-based line, rank and host."""

    file: str
    line: int
    text: str
    rank: int | None = None
    host: str | None = None

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "rank": self.rank,
            "host": self.host,
            "text": self.text[:EVIDENCE_TEXT],
        }


def rank_ranges(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 4, 6, 7]`` → ``"0-4,6-7"``."""
    out: list[str] = []
    items = sorted(set(ranks))
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(out)


@dataclass
class Diagnosis:
    """One catalogue code found in the logs, grouped over every rank that showed it."""

    code: str
    name: str
    family: str
    role: str
    """``root-cause``, ``cascade``, ``confirmation``, ``advice`` or ``hypothesis`` (from ``symptom``
    signatures; see :class:`torchdoctor.signature.Role`)."""
    confidence: float
    rank: int | None
    """The rank where it showed first (None when the lines carry no rank)."""
    host: str | None
    title: str
    message: str
    fix: str
    evidence: list[LineRef]
    ranks: list[int] = field(default_factory=list)
    count: int = 1
    """Matching lines in all inputs."""
    values: dict[str, str] = field(default_factory=dict)
    traceback: list[str] = field(default_factory=list)
    """The last lines of the Python traceback that ended in the first matching line, if any."""
    explained_by: str | None = None
    """For a cascade or confirmation: the root-cause code it belongs to."""
    time: float | None = None
    notes: list[str] = field(default_factory=list)
    confirm: str = ""
    """For a hypothesis: how to confirm it (a command to run, the line to look for)."""

    @property
    def ranks_text(self) -> str:
        return rank_ranges(self.ranks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "name": self.name,
            "family": self.family,
            "role": self.role,
            "confidence": round(self.confidence, 2),
            "rank": self.rank,
            "host": self.host,
            "title": self.title,
            "message": self.message,
            "fix": self.fix,
            "evidence": [e.to_dict() for e in self.evidence],
            "ranks": self.ranks,
            "ranks_text": self.ranks_text,
            "count": self.count,
            "values": self.values,
            "confirm": self.confirm or None,
            "traceback": self.traceback,
            "explained_by": self.explained_by,
            "notes": self.notes,
        }


@dataclass
class UnmatchedError:
    """An error line no signature explained (the most relevant few are reported).

    ``score`` is its relevance, 1 (a warning) to 4 (the line that ends a traceback): see
    :mod:`torchdoctor.explain.relevance`."""

    ref: LineRef
    score: int
    count: int = 1
    ranks: list[int] = field(default_factory=list)
    traceback: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = self.ref.to_dict()
        out.update({"count": self.count, "ranks": self.ranks, "traceback": self.traceback, "relevance": self.score})
        return out


@dataclass
class ExplainReport:
    """The result of ``explain``: diagnoses best first, the first failure, per-rank facts."""

    diagnoses: list[Diagnosis]
    first_failure: dict[str, Any] | None
    ranks: dict[int, dict[str, Any]]
    unmatched_errors: list[UnmatchedError]
    sources: list[str] = field(default_factory=list)
    lines: int = 0
    bytes: int = 0
    notes: list[str] = field(default_factory=list)
    scanner: str = "python"
    skipped_repeats: int = 0
    """Error lines (no signature trigger) skipped because two of the same shape were already read."""

    @property
    def top(self) -> Diagnosis | None:
        """The first diagnosis, whatever its role (the root cause when there is one)."""
        return self.diagnoses[0] if self.diagnoses else None

    @property
    def root_cause(self) -> Diagnosis | None:
        """The chosen root cause: the top diagnosis when its role is root-cause."""
        if self.diagnoses and self.diagnoses[0].role == "root-cause":
            return self.diagnoses[0]
        return None

    @property
    def explained(self) -> bool:
        """A root cause, a cascade or a hypothesis was named."""
        return any(d.role in ("root-cause", "cascade", "hypothesis") for d in self.diagnoses)

    @property
    def exit_code(self) -> ExitCode:
        """0 when a diagnosis names what happened (root cause, cascade or hypothesis); 1 otherwise."""
        return ExitCode.OK if self.explained else ExitCode.FINDINGS

    def codes(self) -> list[str]:
        """Codes recognised in the log, best first; a ``guess`` (words only, nothing recognised) is not one."""
        return [d.code for d in self.diagnoses if d.role != "guess"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "command": "explain",
            "diagnoses": [d.to_dict() for d in self.diagnoses],
            "first_failure": self.first_failure,
            "ranks": {str(r): info for r, info in sorted(self.ranks.items())},
            "unmatched_errors": [u.to_dict() for u in self.unmatched_errors],
            "root_cause": self.root_cause.code if self.root_cause else None,
            "sources": self.sources,
            "lines": self.lines,
            "bytes": self.bytes,
            "scanner": self.scanner,
            "skipped_repeats": self.skipped_repeats,
            "notes": self.notes,
        }
