"""The lab's run-to-run scenario (lab/scenarios/runs.py), run for real by the lab runner.

runs-unseeded-worker: two trainings with the same torch seed whose dataset jitters samples with an
unseeded random.Random() made in each DataLoader worker; `runs diff` (diff_runs) finds them parting
at step 0, at the data (TD477), and the child exits 1. Seeding that generator from the worker's seed
(torchdoctor.worker_init_fn.then(reseed)) makes the runs agree bit for bit.

TD477 has no log signature (it is judged by comparing recorded runs, not read from a log), so the
closed loop of tests/support/lab.py (explain names the code) does not apply; these tests check the
diff's own output instead.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from torchdoctor.lab import get
from torchdoctor.lab.runner import RunRecord, run

NAME = "runs-unseeded-worker"


@pytest.fixture(scope="module")
def before() -> set[str]:
    """The temporary directory before this module's runs (a killed earlier run's leftovers are not theirs)."""
    return set(os.listdir(tempfile.gettempdir()))


@pytest.fixture(scope="module")
def records(before: set[str]) -> Iterator[dict[bool, RunRecord]]:
    with ThreadPoolExecutor(2) as pool:
        futures = {fixed: pool.submit(run, get(NAME), fixed) for fixed in (False, True)}
        out = {fixed: f.result() for fixed, f in futures.items()}
    for rec in out.values():
        if rec.skipped:
            pytest.skip(f"{NAME}: {rec.skipped}")
    yield out


def test_the_scenario_is_declared_with_its_code() -> None:
    s = get(NAME)
    assert (s.code, s.family) == ("TD477", "rank-divergence")
    assert "worker_init_fn" in s.fix


def test_unfixed_runs_part_at_the_data_and_the_child_fails(records: dict[bool, RunRecord]) -> None:
    rec = records[False]
    text = rec.text()
    assert rec.exit_code == 1 and not rec.timed_out and not rec.memory_killed, rec.tail()
    assert "torchdoctor runs diff PARTED" in text
    assert "the runs part at step 0 on rank 0: data (the batch)" in text
    assert re.search(r"TD477 \[rank-divergence\] the runs part at step 0 on rank 0: the data", text), rec.tail()
    assert "worker_init_fn" in text  # the fix comes with it
    assert len(re.findall(r": 12 steps recorded, last loss \d", text)) == 2


def test_fixed_runs_agree(records: dict[bool, RunRecord]) -> None:
    rec = records[True]
    assert rec.exit_code == 0, rec.tail()
    assert "no difference in 12 step(s) compared over 1 rank(s)" in rec.text()
    losses = re.findall(r"last loss (\d+\.\d+)", rec.text())
    assert len(losses) == 2 and losses[0] == losses[1]


def test_no_temporary_directory_is_left_behind(records: dict[bool, RunRecord], before: set[str]) -> None:
    assert all(r.exit_code is not None for r in records.values())
    assert not [p for p in set(os.listdir(tempfile.gettempdir())) - before if p.startswith("torchdoctor-lab-runs-")]


def test_a_scenario_killed_at_its_deadline_leaves_no_temporary_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child that makes a temporary directory and then hangs, killed at a 2 s deadline (SIGKILL to its session:
    its own cleanup never runs): the directory goes anyway, with the scratch directory (TMPDIR) the runner made
    for the run."""
    import sys

    from torchdoctor.lab import runner

    code = "import tempfile, time; print(tempfile.mkdtemp(prefix='torchdoctor-lab-x-'), flush=True); time.sleep(60)"
    monkeypatch.setattr(runner, "_child_argv", lambda s, fixed: ([sys.executable, "-c", code], None))
    rec = run(get(NAME), timeout=2.0)
    made = rec.output.decode().split()[0]
    assert rec.timed_out and made.startswith(tempfile.gettempdir())
    scratch = os.path.dirname(made)
    assert os.path.basename(scratch).startswith(f"torchdoctor-lab-{NAME}-")  # inside the run's own directory
    assert not os.path.exists(made) and not os.path.exists(scratch)


def test_the_next_run_removes_the_scratch_of_a_runner_killed_with_sigkill(tmp_path: Path) -> None:
    """A runner killed with SIGKILL cannot remove its scratch directory; the next run removes it, and only it: not
    a live runner's, not one of another name."""
    import subprocess
    import sys

    from torchdoctor.lab import runner

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)  # a process that has exited: its PID names no runner
    stale = tmp_path / f"torchdoctor-lab-map-count-spawn-p{dead}-ab_12XYZ"
    (stale / "torch-shm-dir-x").mkdir(parents=True)
    live = tmp_path / f"torchdoctor-lab-map-count-spawn-p{os.getpid()}-cd_34XYZ"
    live.mkdir()
    others = [tmp_path / "torchdoctor-lab-map-count-spawn-ef_56XYZ", tmp_path / f"torchdoctor-x-p{dead}-gh_78XYZ"]
    for d in others:
        d.mkdir()
    (tmp_path / f"torchdoctor-lab-writes-p{dead}-ij_90XYZ").write_text("a file, not a run's directory")
    assert runner.sweep_stale_scratch(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and live.exists() and all(d.exists() for d in others)
    assert (tmp_path / f"torchdoctor-lab-writes-p{dead}-ij_90XYZ").exists()
    assert runner.sweep_stale_scratch(str(tmp_path / "missing")) == []


def test_a_run_names_its_scratch_after_its_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from torchdoctor.lab import runner

    code = "import os; print(os.environ['TMPDIR'], flush=True)"
    monkeypatch.setattr(runner, "_child_argv", lambda s, fixed: ([sys.executable, "-c", code], None))
    rec = run(get(NAME), timeout=30.0)
    scratch = os.path.basename(rec.output.decode().split()[0])
    assert runner.SCRATCH.fullmatch(scratch) and f"-p{os.getpid()}-" in scratch
