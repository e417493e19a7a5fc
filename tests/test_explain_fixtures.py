"""Every log fixture, through the real engine: positives name their code, near-misses do not.

Layout: ``tests/fixtures/logs/<CODE>/<anything>.log``. A fixture starts with a header of lines
beginning ``# `` closed by a line that is exactly ``# ---``; the header says where the text came
from (``# source: ...``) and may say ``# expect-top: TDnnn`` for a log with several failures.
Files named ``near-*.log`` are near misses: they must NOT produce CODE. Any other file must produce
CODE; when CODE comes out as a root cause it must be the top diagnosis (or ``expect-top``'s code).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from torchdoctor.explain import explain
from torchdoctor.registry import all_codes, log_codes

LOGS = Path(__file__).parent / "fixtures" / "logs"
HEADER_END = "# ---"


@dataclass
class LogFixture:
    path: Path
    code: str
    near_miss: bool
    header: dict[str, list[str]] = field(default_factory=dict)
    text: str = ""

    @property
    def expect_top(self) -> str | None:
        values = self.header.get("expect-top")
        return values[0].strip() if values else None

    @property
    def id(self) -> str:
        return f"{self.code}/{self.path.name}"


def parse_fixture(path: Path) -> LogFixture:
    """Split a fixture into its header fields (``# key: value`` lines) and the log text after ``# ---``."""
    raw = path.read_bytes().decode("utf-8", errors="replace")
    lines = raw.split("\n")
    if HEADER_END not in lines:
        raise AssertionError(f"{path}: no '{HEADER_END}' line closing the header")
    end = lines.index(HEADER_END)
    header: dict[str, list[str]] = {}
    for line in lines[:end]:
        if not line.startswith("# "):
            raise AssertionError(f"{path}: header line does not start with '# ': {line!r}")
        m = re.match(r"# ([\w-]+):\s*(.*)$", line)
        if m:
            header.setdefault(m.group(1).lower(), []).append(m.group(2))
    return LogFixture(path, path.parent.name, path.name.startswith("near-"), header, "\n".join(lines[end + 1 :]))


def all_fixtures() -> list[LogFixture]:
    return [parse_fixture(p) for p in sorted(LOGS.glob("*/*.log"))]


FIXTURES = all_fixtures()
CODES = {c.code: c for c in all_codes()}
EXPLAINED = {c.code for c in log_codes()}
"""What explain can name: codes with signatures, and the codes it reads one of them as (Code.across_nodes)."""


def test_there_are_fixtures() -> None:
    assert FIXTURES, f"no fixtures under {LOGS}"


@pytest.mark.parametrize("fx", FIXTURES, ids=lambda f: f.id)
def test_fixture_header_names_its_source(fx: LogFixture) -> None:
    assert fx.header.get("source"), f"{fx.path}: the header must say where the text came from (# source: ...)"
    assert fx.code in CODES, f"{fx.path}: {fx.code} is not a registered code"
    assert fx.code in EXPLAINED, f"{fx.code} has fixtures but no signatures (and no code is read as it)"
    assert fx.text.strip(), f"{fx.path}: no log text after the header"


@pytest.mark.parametrize("fx", FIXTURES, ids=lambda f: f.id)
def test_fixture(fx: LogFixture) -> None:
    report = explain(fx.text)
    codes = report.codes()
    if fx.near_miss:
        assert fx.code not in codes, f"near miss {fx.path.name} produced {fx.code}: {_evidence(report, fx.code)}"
        return
    assert fx.code in codes, f"{fx.path.name} did not produce {fx.code}; got {codes or 'nothing'}"
    diag = next(d for d in report.diagnoses if d.code == fx.code)
    leftover = re.findall(r"(?<!\$)\{(\w+)\}", diag.message + diag.fix)  # ${VAR} in a shell fix is fine
    assert not leftover, f"{fx.code}: template placeholders not filled: {leftover}"
    want_top = fx.expect_top or (fx.code if diag.role == "root-cause" else None)
    if want_top:
        assert codes[0] == want_top, f"{fx.path.name}: top diagnosis is {codes[0]}, expected {want_top} (all: {codes})"
    assert diag.evidence and diag.evidence[0].line > 0


def _evidence(report, code: str) -> str:
    d = next((d for d in report.diagnoses if d.code == code), None)
    return d.evidence[0].text if d and d.evidence else "?"


def test_every_code_with_signatures_has_a_positive_and_a_near_miss() -> None:
    kinds: dict[str, set[str]] = {}
    for fx in FIXTURES:
        kinds.setdefault(fx.code, set()).add("near-miss" if fx.near_miss else "positive")
    missing = {
        c.code: sorted({"positive", "near-miss"} - kinds.get(c.code, set())) for c in CODES.values() if c.signatures
    }
    missing = {code: what for code, what in missing.items() if what}
    assert not missing, "codes with signatures that lack a real fixture: " + ", ".join(
        f"{code} (no {' and no '.join(what)})" for code, what in sorted(missing.items())
    )
