"""The README's "Ranks and runs in step" example, run as written under torchrun with 2 gloo ranks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from .conftest import REPO
from .support.gloo import finished

RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GROUP_RANK")


def _example() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("### Ranks and runs in step", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def test_readme_ranks_example_runs_under_torchrun(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(_example())
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    env["GLOO_SOCKET_IFNAME"] = "lo"
    env["TMPDIR"] = str(tmp_path)  # torchrun's own log directory (torchelastic_*) goes there
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "train.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert finished(proc, "no rank far above the others"), proc.stderr[-3000:]
    assert "TD472" in proc.stdout  # the determinism audit printed (deterministic algorithms are off)
    for rank in (0, 1):
        lines = (tmp_path / "runs" / "a" / f"fingerprints-rank{rank}.jsonl").read_text().splitlines()
        assert json.loads(lines[0])["kind"] == "header" and len(lines) == 51
    again = subprocess.run(
        [sys.executable, "-m", "torchdoctor", "runs", "diff", "runs/a", "runs/a"], cwd=tmp_path, capture_output=True
    )
    assert again.returncode == 0  # a run agrees with itself
