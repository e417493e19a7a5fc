"""The stable JSON shape shared by every command that reports findings.

``{"schema_version": 1, "command": str, "findings": [finding...], "summary": {...}, ...}``
where each finding has ``code, name, family, severity, area, title, message, evidence, fix,
related`` (see ``docs/json.md``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import IO, Any

from ..model import Finding

SCHEMA_VERSION = 1


def summary(findings: Sequence[Finding]) -> dict[str, int]:
    counts = Counter(f.severity.label for f in findings)
    return {"error": counts.get("error", 0), "warning": counts.get("warning", 0), "info": counts.get("info", 0)}


def document(findings: Sequence[Finding], command: str, context: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "command": command}
    doc.update(context)
    doc["findings"] = [f.to_dict() for f in findings]
    doc["summary"] = summary(findings)
    return doc


def write(findings: Sequence[Finding], command: str, out: IO[str], context: dict[str, Any]) -> None:
    json.dump(document(findings, command, context), out, indent=2, default=str)
    out.write("\n")
