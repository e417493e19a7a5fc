"""The closed loop with watch: for every lab scenario whose failure builds up over time (memory maps,
descriptors, /dev/shm filling, memory growing into RLIMIT_AS, threads growing into RLIMIT_NPROC), ``lab run NAME --watch`` shows watch's warning of the right family
arriving before the failure's text; and the seed case under ``torchdoctor watch`` itself is warned
about and then explained as shm-map-count.

Scenarios whose failure is one burst (a single oversized allocation under RLIMIT_AS, two 16 MiB
batches landing in a 16 MiB /dev/shm at once, a 16-thread pool created at once, 256 descriptors
used up in a fraction of a second) give nothing to project from; they are listed in NOT_BUILT_UP
with the reason (the lead times measured here, three runs each).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchdoctor.lab import get
from torchdoctor.lab.runner import missing_needs

from .conftest import run_cli

BUILT_UP = [
    "map-count-fast-spawn",
    "map-count-fast-forkserver",
    "fd-queue-ancdata",
    "shm-fill-kept-batches",
    "oom-rlimit-as-growth",
    "threads-nproc-growth",
]
NOT_BUILT_UP = {
    "fd-spawn-dataset": "its 256 descriptors go within about 0.1 s (warned 0.03-0.08 s ahead at 20 Hz here)",
    "fd-loader-kept-batches": "its 256 descriptors go within about 0.2 s (warned 0.01-0.21 s ahead at 20 Hz here)",
    "shm-sigbus": "each worker's 32 MiB mapped file fills the 16 MiB /dev/shm in one memcpy (a gradual fill "
    "under a private 16 MiB /dev/shm is tests/test_watch.py's)",
    "shm-no-space": "two 16 MiB batches land in the 16 MiB /dev/shm within one sample",
    "oom-rlimit-as": "one 4 GiB allocation against RLIMIT_AS",
    "threads-nproc-limit": "a 16-thread pool created at once",
}


@pytest.mark.parametrize("name", BUILT_UP)
def test_watch_warns_before_the_failure(name: str) -> None:
    s = get(name)
    reason = missing_needs(s)
    if reason:
        pytest.skip(reason)
    proc = run_cli("lab", "run", name, "--watch", "0.05", "--format", "json", timeout=300)
    out = json.loads(proc.stdout)
    assert out["reproduced"], out["output_tail"]
    warned = out["warned"]
    assert warned is not None, f"{name}: no warning of {s.family}; warnings: {out['warnings']}"
    assert warned["before"] == "the failure's text"
    assert warned["lead_seconds"] > 0, warned
    from torchdoctor.registry import lookup

    assert lookup(warned["code"]).family == s.family


def test_the_exempt_scenarios_exist_and_are_bursts() -> None:
    for name in NOT_BUILT_UP:
        assert get(name).name == name


@pytest.mark.slow
def test_the_seed_case_under_watch_is_warned_then_explained(tmp_path: Path) -> None:
    """spawn + file_system + 70,000 small tensors: the map count climbs for seconds before 'unable to mmap'."""
    tl = tmp_path / "seed.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torchdoctor", "watch", "--timeline", str(tl), "--"]
        + [sys.executable, "-m", "torchdoctor.lab.child", "map-count-spawn"],
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr.decode()[-2000:]
    data = json.loads(tl.read_text())
    maps = [w for w in data["warnings"] if w["resource"] == "maps"]
    assert maps and maps[0]["code"] == "TD155" and maps[0]["limit"] == data["limits"]["max_map_count"]
    failed_text = proc.stderr.decode() + proc.stdout.decode()
    assert "unable to mmap" in failed_text
    d = data["diagnosis"]
    assert d["family"] == "shm-map-count" and d["code"] == "TD155"
    assert d["warned_before_seconds"] > 2
    assert "warned" in proc.stderr.decode() and "s before the end" in proc.stderr.decode()
