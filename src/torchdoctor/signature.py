"""Log signatures: how a failure mode is recognised in a log. Declared on the code they diagnose.

A :class:`Signature` is data: a role, cheap literal triggers, one regular expression with named
groups for the values a person needs, and near-miss exclusions. The matcher (``torchdoctor.explain``)
only runs a signature's regex on lines that contain one of its triggers.

Roles (after nvidia-resiliency-ext's log analyser):

* ``root-cause``: this line is a failure in its own right (``unable to mmap ... (12)``);
* ``cascade``: a symptom of a failure elsewhere (watchdog timeouts, "worker exited unexpectedly"):
  look for an earlier root cause, on this rank or another;
* ``confirmation``: strengthens a diagnosis but names no cause by itself (a bare ``Killed``, exit -9);
* ``advice``: context printed next to failures (CUDA's "might be asynchronously reported"):
  never a cause.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from functools import cached_property


class Role(str, enum.Enum):
    ROOT_CAUSE = "root-cause"
    CASCADE = "cascade"
    CONFIRMATION = "confirmation"
    ADVICE = "advice"


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

    def __post_init__(self) -> None:
        if not self.triggers:
            raise ValueError("a signature needs at least one literal trigger")
        if not 0 < self.confidence <= 1:
            raise ValueError("confidence must be in (0, 1]")
        # Patterns compile lazily (only signatures whose trigger is seen); tests compile them all.

    @cached_property
    def regex(self) -> re.Pattern[str]:
        return re.compile(self.pattern)

    @cached_property
    def exclusions(self) -> tuple[re.Pattern[str], ...]:
        return tuple(re.compile(e) for e in self.exclude)

    def match(self, line: str) -> dict[str, str] | None:
        """Extracted values when ``line`` matches (triggers are the caller's prefilter), else None."""
        m = self.regex.search(line)
        if m is None or any(ex.search(line) for ex in self.exclusions):
            return None
        found = {k: v for k, v in m.groupdict().items() if v is not None}
        return {**self.values, **found}
