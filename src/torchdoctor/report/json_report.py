"""The stable JSON shape shared by every command that reports findings.

``{"schema_version": 1, "command": str, "findings": [finding...], "summary": {...}, ...}``
where each finding has ``code, name, family, severity, area, title, message, evidence, fix,
related``; ``check`` adds ``passed``: what was checked and found fine (see ``docs/json.md``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

from ..model import Finding

if TYPE_CHECKING:
    from ..checks import Passed

SCHEMA_VERSION = 1


def summary(findings: Sequence[Finding]) -> dict[str, int]:
    counts = Counter(f.severity.label for f in findings)
    return {"error": counts.get("error", 0), "warning": counts.get("warning", 0), "info": counts.get("info", 0)}


def document(
    findings: Sequence[Finding], command: str, context: dict[str, Any], passed: Sequence[Passed] | None = None
) -> dict[str, Any]:
    doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "command": command}
    doc.update(context)
    doc["findings"] = [f.to_dict() for f in findings]
    if passed is not None:
        doc["passed"] = [p.to_dict() for p in passed]
    doc["summary"] = summary(findings)
    return doc


def write(
    findings: Sequence[Finding],
    command: str,
    out: IO[str],
    context: dict[str, Any],
    passed: Sequence[Passed] | None = None,
) -> None:
    json.dump(document(findings, command, context, passed), out, indent=2, default=str)
    out.write("\n")
