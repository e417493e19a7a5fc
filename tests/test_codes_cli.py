"""`torchdoctor codes` (issue 7): suggestions that are really close, and the terminal width honoured."""

from __future__ import annotations

import re

import pytest

from torchdoctor.registry import all_codes
from torchdoctor.report.codes import near_codes, suggest

from .conftest import run_cli

KNOWN = [c.code for c in all_codes()]


def _one_line_error(*args: str) -> str:
    proc = run_cli("codes", *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_a_code_far_from_every_code_gets_no_unrelated_suggestion() -> None:
    line = _one_line_error("TD999")
    assert "unknown code 'TD999'" in line
    assert not re.search(r"TD[0-8]\d\d", line), line  # it used to suggest TD201, TD202, TD203
    assert "no code is close to it" in line and "`torchdoctor codes` lists them all" in line


@pytest.mark.parametrize(
    "key, expected",
    [
        ("TD165", "TD156"),  # two digits swapped
        ("TD105", "TD104"),  # a neighbour in the same hundred
        ("TD370", "TD365"),  # the nearest of the hundred, within reach
        ("102", "TD102"),  # the number without TD
    ],
)
def test_close_codes_are_suggested(key: str, expected: str) -> None:
    line = _one_line_error(key)
    assert "did you mean" in line and expected in line.split("did you mean", 1)[1], line


def test_suggestions_are_near_in_number_or_one_typo_away() -> None:
    suggested = 0
    for number in range(100, 1000, 7):
        for code in near_codes(number, KNOWN):
            suggested += 1
            n = int(code[2:])
            want, got = f"{number:03d}", code[2:]
            same_hundred_near = want[0] == got[0] and abs(n - number) <= 10
            one_typo = sum(a != b for a, b in zip(want, got)) == 1 and want[0] == got[0]
            swapped = sorted(want) == sorted(got) and sum(a != b for a, b in zip(want, got)) == 2
            assert same_hundred_near or one_typo or swapped, (number, code)
    assert suggested > 50, "near_codes suggested (almost) nothing: the loop above checked nothing"


def test_partial_and_malformed_codes() -> None:
    close, hint = suggest("TD10", all_codes())
    assert close == ["TD101", "TD102", "TD103"] and "--prefix TD10" in hint
    assert "three digits" in suggest("TD1020", all_codes())[1]
    assert suggest("TD8", all_codes()) == ([], "; no code starts with TD8: `torchdoctor codes` lists them all")
    assert "shm-too-small" in suggest("shm-to-small", all_codes())[0]


@pytest.mark.parametrize("columns", [160, 80])
def test_codes_honours_columns(columns: int) -> None:
    out = run_cli("codes", env={"COLUMNS": str(columns)}).stdout
    widest = max(len(line) for line in out.splitlines())
    assert widest <= columns
    if columns > 100:
        assert widest > 100, "titles still wrapped at 100 columns"


def test_check_honours_columns_and_stays_at_100_when_piped() -> None:
    wide = run_cli("check", "--no-torch", "--batch-bytes", "8GiB", env={"COLUMNS": "160"}).stdout
    piped = run_cli("check", "--no-torch", "--batch-bytes", "8GiB").stdout
    assert 100 < max(map(len, wide.splitlines())) <= 160
    assert max(map(len, piped.splitlines())) <= 100
