"""The findings model of ``check`` and ``loader``: :class:`Finding` and its parts.

``check`` (preflight audit) and ``loader`` (DataLoader probe) report findings; the reporters in
:mod:`torchdoctor.report` (text, JSON, Markdown) render these and nothing else. ``explain`` has its
own model (:mod:`torchdoctor.explain.model`: diagnoses, ranks, unmatched lines) and renderers, as its
output is about a run's logs rather than a machine; both name the same catalogue codes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Severity(enum.IntEnum):
    """How bad a finding is. Ordered, so ``--fail-on`` can compare."""

    INFO = 10
    WARNING = 20
    ERROR = 30

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            choices = ", ".join(s.label for s in cls)
            raise ValueError(f"unknown severity {text!r}; choose one of {choices}") from None


class ExitCode(enum.IntEnum):
    """Documented exit codes of every torchdoctor command.

    * ``OK`` (0): nothing at or above ``--fail-on``.
    * ``FINDINGS`` (1): at least one finding at or above ``--fail-on``.
    * ``USAGE`` (2): bad arguments or input, or an internal error (one clear line, no traceback).
    """

    OK = 0
    FINDINGS = 1
    USAGE = 2


@dataclass(frozen=True)
class Evidence:
    """One thing that was read, and where it was read from."""

    label: str
    value: Any
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "value": self.value, "source": self.source}


@dataclass(frozen=True)
class Finding:
    """A judgement about a machine, a process or a log, tied to one catalogue code."""

    code: str
    name: str
    family: str
    severity: Severity
    area: str
    title: str
    message: str
    fix: str
    evidence: tuple[Evidence, ...] = field(default_factory=tuple)
    related: tuple[str, ...] = field(default_factory=tuple)
    check_error: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "code": self.code,
            "name": self.name,
            "family": self.family,
            "severity": self.severity.label,
            "area": self.area,
            "title": self.title,
            "message": self.message,
            "evidence": [e.to_dict() for e in self.evidence],
            "fix": self.fix,
            "related": list(self.related),
        }
        if self.check_error:
            out["check_error"] = True
        return out


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Worst first, then by code, so output is stable."""
    return sorted(findings, key=lambda f: (-int(f.severity), f.code, f.message))
