"""Catalogue integrity: every code is one well-formed unit, and the docs are generated from it."""

from __future__ import annotations

import re
import string

import pytest

from torchdoctor.errors import UnknownCodeError
from torchdoctor.families import FAMILIES
from torchdoctor.registry import AREAS, all_codes, lookup
from torchdoctor.report.codes import markdown

from .conftest import REPO

CODES = all_codes()


def test_catalogue_is_not_empty_and_codes_unique() -> None:
    assert len(CODES) >= 10
    assert len({c.code for c in CODES}) == len(CODES)
    assert len({c.name for c in CODES}) == len(CODES)


@pytest.mark.parametrize("code", CODES, ids=lambda c: c.code)
def test_code_is_complete(code) -> None:
    assert re.fullmatch(r"TD\d{3}", code.code)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", code.name)
    assert code.family in FAMILIES
    assert code.area in AREAS
    for section in ("title", "message", "fix", "meaning", "why", "false_positives"):
        text = getattr(code, section)
        assert isinstance(text, str) and len(text.strip()) >= 10, f"{code.code}: {section} missing"
    for rel in code.related:
        assert rel != code.code
        assert lookup(rel).code == rel, f"{code.code} relates to unknown {rel}"
    # templates are well-formed
    for template in (code.message, code.fix):
        list(string.Formatter().parse(template))


def test_first_digit_matches_area() -> None:
    expected = {
        "1": {"shm"},
        "2": {"memory", "cpu"},
        "3": {"gpu"},
        "4": {"distributed"},
        "5": {"loader"},
        "6": {"storage"},
        "9": {"torchdoctor"},
    }
    for c in CODES:
        assert c.area in expected[c.code[2]], f"{c.code} is in area {c.area}"


def test_every_family_has_a_code_or_is_log_only() -> None:
    # Preflight covers the families a machine's facts can predict; the rest arrive with `explain`.
    covered = {c.family for c in CODES}
    assert {
        "shm-exhausted",
        "shm-map-count",
        "fd-exhausted",
        "host-oom",
        "checkpoint-io",
        "dist-env",
        "dist-port",
        "gpu-unavailable",
        "thread-oversubscription",
    } <= covered


def test_lookup_by_code_name_and_case() -> None:
    first = CODES[0]
    assert lookup(first.code.lower()) is first
    assert lookup(first.name) is first


def test_unknown_code_suggests_close_ones() -> None:
    with pytest.raises(UnknownCodeError) as err:
        lookup("TD10")
    assert err.value.suggestions and all(s.startswith("TD10") for s in err.value.suggestions)


def test_docs_codes_md_is_current() -> None:
    generated = markdown(CODES)
    on_disk = (REPO / "docs" / "codes.md").read_text(encoding="utf-8")
    assert on_disk == generated, "docs/codes.md is stale: run `make docs`"


def test_every_signature_compiles_and_lives_in_a_log_module() -> None:
    """explain loads only the log_* modules: every code with signatures, and every code explain reads one of them
    as (``Code.across_nodes``), must be found that way."""
    import json
    import re as _re
    import subprocess
    import sys

    code = "import json; from torchdoctor.registry import log_codes; print(json.dumps([c.code for c in log_codes()]))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    seen_by_explain = set(json.loads(proc.stdout))
    with_signatures = {c.code for c in CODES if c.signatures}
    read_as = {c.across_nodes for c in CODES if c.signatures and c.across_nodes}
    assert with_signatures and read_as and seen_by_explain == with_signatures | read_as
    for c in CODES:
        for s in c.signatures:
            _re.compile(s.pattern)
            for ex in s.exclude:
                _re.compile(ex)
