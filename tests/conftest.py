from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# shared helpers live in tests/support (test modules never import from one another); their asserts
# are rewritten like a test's, so a failing helper shows its operands
pytest.register_assert_rewrite("tests.support")

from .support import FIXTURES, REPO  # noqa: F401  (the test modules import them from here)


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120, **kw: Any
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, the way a user does."""
    full_env = dict(os.environ)
    full_env.pop("NO_COLOR", None)
    full_env.pop("COLUMNS", None)  # piped output is 100 columns wide unless a test sets COLUMNS itself
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "torchdoctor", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        **kw,
    )


def run_json(*args: str, **kw: Any) -> dict[str, Any]:
    proc = run_cli(*args, "--format", "json", **kw)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def cli():
    return run_cli


# -- guard: the suite must leave nothing of torch's in the real /dev/shm ------------------------
_SHM = Path("/dev/shm")


def _torch_segments() -> set[str]:
    try:
        return {p.name for p in _SHM.iterdir() if p.name.startswith("torch_")}
    except OSError:
        return set()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config._torchdoctor_shm_before = _torch_segments()  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = getattr(session.config, "_torchdoctor_shm_before", set())
    leaked = []
    for name in sorted(_torch_segments() - before):
        pid = name.split("_")[1] if name.count("_") >= 1 else ""
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            leaked.append(name)
    if leaked:
        # The creators were processes this test run started and they are gone: remove what they left,
        # and fail the run so that the test that leaked gets fixed.
        for name in leaked:
            try:
                (_SHM / name).unlink()
            except OSError:
                pass
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"FAILED: the test run leaked {len(leaked)} torch segment(s) into the real /dev/shm "
                f"(removed): {', '.join(leaked[:5])}",
                red=True,
            )
        session.exitstatus = 1
