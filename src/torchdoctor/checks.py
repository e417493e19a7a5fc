"""Run the catalogue's preflight checks, pure functions of facts, against one snapshot."""

from __future__ import annotations

from .facts import Facts
from .model import Finding, sort_findings
from .options import CheckOptions
from .registry import Code, all_codes


def preflight_codes() -> list[Code]:
    return [c for c in all_codes() if c.check is not None and c.status != "retired"]


def run_checks(facts: Facts, options: CheckOptions | None = None, codes: list[Code] | None = None) -> list[Finding]:
    """Every applicable finding, worst first. A check that raises becomes a finding about itself."""
    options = options or CheckOptions()
    findings: list[Finding] = []
    for code in codes if codes is not None else preflight_codes():
        assert code.check is not None
        try:
            findings.extend(code.finding(hit) for hit in code.check(facts, options))
        except Exception as exc:  # noqa: BLE001 - a crash is reported, never raised
            findings.append(code.crashed(exc))
    return sort_findings(findings)
