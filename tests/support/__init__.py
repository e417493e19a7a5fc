"""Helpers the test modules share (imported as ``tests.support``; never collected as tests).

Test modules import shared pieces only from here or from ``tests/conftest.py``, never from one
another. ``tests/conftest.py`` registers this package for pytest's assertion rewriting, so the
``assert_*`` helpers report their operands like asserts written in a test.

- :mod:`tests.support.lab`: the lab's closed-loop helpers (``LabRuns``, ``closed_loop``, ``assert_*``);
- :mod:`tests.support.explain`: test-only codes and builders of multi-rank logs for the explain tests.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).parent.parent.parent
FIXTURES = REPO / "tests" / "fixtures"
LOGS = FIXTURES / "logs"


def fixture_text(code: str, name: str) -> str:
    """The log text of ``tests/fixtures/logs/<code>/<name>``, without its ``# `` header."""
    return (LOGS / code / name).read_text(encoding="utf-8").split("# ---\n", 1)[1]
