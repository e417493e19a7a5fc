from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).parent.parent


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, the way a user does."""
    full_env = dict(os.environ)
    full_env.pop("NO_COLOR", None)
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "torchdoctor", *args],
        capture_output=True, text=True, timeout=timeout, env=full_env, **kw,
    )


def run_json(*args: str, **kw: Any) -> dict[str, Any]:
    proc = run_cli(*args, "--format", "json", **kw)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def cli():
    return run_cli
