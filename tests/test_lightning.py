"""DoctorCallback in a real Lightning ``Trainer``: ``ddp`` on gloo, 2 CPU processes, a tiny model.

Each test runs ``tests/support/lightning_job.py`` as a user runs a training script; Lightning starts
rank 1 itself. What the callback saw is in ``result-rank{R}.json``; what the user sees is stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from torchdoctor.explain import shows
from torchdoctor.lab import get
from torchdoctor.lab.runner import missing_needs, run
from torchdoctor.ranks.runfile import read_records

from .conftest import REPO
from .support.gloo import finished

pytest.importorskip("lightning")

JOB = REPO / "tests" / "support" / "lightning_job.py"
FIT_DONE = "`Trainer.fit` stopped"  # Lightning's last words of a finished fit
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "GROUP_RANK")


def job(out: Path, *args: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess[str], dict[int, Any]]:
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS and not k.startswith(("SLURM_", "TORCHELASTIC"))}
    env["GLOO_SOCKET_IFNAME"] = "lo"
    proc = subprocess.run(
        [sys.executable, str(JOB), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=out.parent,
    )
    results = {
        int(p.stem.removeprefix("result-rank")): json.loads(p.read_text()) for p in out.glob("result-rank*.json")
    }
    return proc, results


def test_clean_run_passes_every_check_and_prints_preflight_once(tmp_path: Path) -> None:
    out = tmp_path / "clean"
    proc, results = job(out, "--doctor", "--sync-every", "5", "--fingerprints", str(tmp_path / "fp"))
    assert finished(proc, FIT_DONE), proc.stderr[-3000:]
    assert sorted(results) == [0, 1]
    for r in results.values():
        assert r["steps"] == 40 and r["error"] is None
        assert [step for step, _ in r["sync"]] == list(range(5, 41, 5))
        assert all(ok for _, ok in r["sync"])
        assert sorted(r["preflight"]) == ["0", "1"]  # every rank's problems, on every rank
        assert len(r["memory"]) == 1 and r["memory"][0][1]["finding"] is None
    assert proc.stderr.count("torchdoctor preflight") == 1  # printed by rank 0 only
    assert "TD469" not in proc.stderr
    for rank in (0, 1):
        records = read_records(tmp_path / "fp" / f"fingerprints-rank{rank}.jsonl")
        assert [r["step"] for r in records[1:]] == list(range(1, 41)), [r.get("step") for r in records]
    assert not (out / "torchdoctor-reports").exists()


@pytest.mark.parametrize("reuse", [False, True], ids=["own-digest", "digest-from-fingerprints"])
def test_perturbed_rank_is_named_within_sync_every_steps_and_reported(tmp_path: Path, reuse: bool) -> None:
    """reuse: fingerprints with parameter totals every 5 steps, so each check takes its digest from the record of
    its own step instead of reading the parameters again."""
    out = tmp_path / "perturbed"
    more = ("--fingerprints", str(tmp_path / "fp"), "--params-every", "5") if reuse else ()
    proc, results = job(out, "--doctor", "--sync-every", "5", "--perturb", "1:7", *more)
    assert proc.returncode != 0
    err = proc.stderr
    line = next(x for x in err.splitlines() if "TD469" in x and "torchdoctor (step" in x)
    assert "rank-divergence" in line and "net.2.weight" in line, line
    assert "step 10" in line  # perturbed after step 7, caught at the next check
    assert err.count("torchdoctor (step 10)") == 1  # printed once, by rank 0
    assert "1" in line.split("net.2.weight", 1)[1]  # the rank that differs is named after the tensor
    for r in results.values():
        assert r["error"] and r["error"].startswith("RankDivergenceError")
        assert r["steps"] == 11  # the check of step 10 is read, and raised, at the end of step 11
    reports = sorted((out / "torchdoctor-reports").glob("*.json"))
    assert len(reports) == 2, reports  # guard: one per rank
    body = json.loads(reports[0].read_text())
    assert "RankDivergenceError" in json.dumps(body)


def test_perturbed_rank_with_warn_keeps_training(tmp_path: Path) -> None:
    out = tmp_path / "warned"
    proc, results = job(out, "--doctor", "--sync-every", "5", "--perturb", "1:7", "--on-mismatch", "warn")
    assert finished(proc, FIT_DONE), proc.stderr[-3000:]
    sync = dict((step, ok) for step, ok in results[0]["sync"])
    assert sync[5] is True and sync[10] is False and sync[40] is False
    assert "TD469" in proc.stderr


def test_rank_that_keeps_memory_each_step_is_named(tmp_path: Path) -> None:
    out = tmp_path / "leak"
    proc, results = job(out, "--doctor", "--sync-every", "20", "--leak", "1:8")
    assert finished(proc, FIT_DONE), proc.stderr[-3000:]
    (epoch, report), *_ = results[0]["memory"]
    finding = report["finding"]
    assert finding is not None and finding["rank"] == 1, report
    assert finding["code"] == "TD277"
    assert 0 <= finding["grew_from_step"] < finding["grew_to_step"] <= 40
    assert results[1]["memory"][0][1]["finding"]["rank"] == 1  # the same report on every rank
    line = next(x for x in proc.stderr.splitlines() if "TD277" in x)
    assert "rank 1" in line, line


def test_unlocked_callback_mangles_its_file_and_doctor_open_does_not() -> None:
    s = get("lightning-callback-shared-log")
    reason = missing_needs(s)
    if reason:
        pytest.skip(reason)
    bad = run(s, fixed=False)
    assert bad.failed and shows(bad.text(), "TD657"), bad.tail()
    good = run(s, fixed=True)
    assert good.exit_code == 0, good.tail()


def test_grad_norm_is_the_global_l2_norm_and_none_without_gradients() -> None:
    import math

    import torch

    from torchdoctor.ranks.fingerprint import grad_norm

    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    assert grad_norm(m) is None
    m(torch.randn(4, 8)).sum().backward()
    reference = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in m.parameters()))
    assert grad_norm(m) == pytest.approx(reference, rel=1e-6)


@pytest.mark.parametrize("manual", [False, True])
def test_the_step_counter_read_each_step_is_global_step(tmp_path: Path, manual: bool) -> None:
    """DoctorCallback reads Lightning's own optimizer-step counter each step instead of walking the ``global_step``
    property; in a real (one-process) Trainer, with automatic and with manual optimization, it reads what
    ``global_step`` says at every step, and the fingerprints carry those steps."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from torchdoctor.lab.scenarios.lightning import cpu_trainer, tiny_module
    from torchdoctor.lightning import DoctorCallback

    seen: list[tuple[int, int]] = []

    class Compare(L.Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            seen.append((doctor._step(), int(trainer.global_step)))

    module = tiny_module()
    if manual:
        module.automatic_optimization = False

        def training_step(batch: Any, batch_idx: int) -> Any:
            opt = module.optimizers()
            x, y = batch
            loss = torch.nn.functional.mse_loss(module.net(x), y)
            opt.zero_grad()
            module.manual_backward(loss)
            opt.step()
            return loss

        module.training_step = training_step  # type: ignore[method-assign]
    doctor = DoctorCallback(sync_every=None, preflight=False, determinism=False, fingerprints=tmp_path / "fp")
    data = DataLoader(TensorDataset(torch.randn(96, 16), torch.randn(96, 1)), batch_size=8)
    cpu_trainer([doctor, Compare()], devices=1).fit(module, data)
    assert len(seen) == 12 and [a for a, _ in seen] == [b for _, b in seen] == list(range(1, 13))
    assert doctor._step.__name__ == "<lambda>" and "total" in doctor._step.__code__.co_freevars  # not the fallback
    steps = [r["step"] for r in read_records(tmp_path / "fp" / "fingerprints-rank0.jsonl")[1:]]
    assert steps == list(range(1, 13))
