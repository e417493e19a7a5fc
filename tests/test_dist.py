"""``torchdoctor dist`` without a process group: the pure rules on recorded journals and recorded facts.

The journals under tests/fixtures/dist/journals are real runs (see SOURCE.md); the multi-GPU facts
are the recorded Slurm node (8 x V100, 4 visible) with the rank's own environment applied.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from torchdoctor.dist.journal import Journal, records_in
from torchdoctor.dist.probe import Fault, ProbeConfig, env_from_slurm, first_host
from torchdoctor.dist.report import build, markdown, render
from torchdoctor.dist.rules import (
    STEPS,
    device_findings,
    device_of,
    differences,
    first_failure,
    rank_states,
    shared_devices,
)

from .conftest import REPO, run_cli
from .support.gpu import rank_facts

JOURNALS = REPO / "tests" / "fixtures" / "dist" / "journals"


def replay(case: str) -> dict[int | None, Any]:
    """The states of a recorded run, with what the launcher agent saw (agent.json) applied."""
    states = rank_states(records_in(JOURNALS / case))
    agent = JOURNALS / case / "agent.json"
    if agent.exists():
        for rank, f in (json.loads(agent.read_text()).get("failures") or {}).items():
            states[int(rank)].exit = {"exitcode": f["exitcode"], "signal": f["signal"]}
    return states


@pytest.mark.parametrize(
    ("case", "rank", "step", "kind", "code"),
    [
        ("1-collectives-kill", 1, "collectives", "died", "TD457"),
        ("1-collectives-hang", 1, "collectives", "hung", "TD455"),
        ("1-barrier-stop", 1, "barrier", "hung", "TD455"),
        ("1-collectives-wrong", 1, "collectives", "failed", "TD467"),
        ("0-init-exit", 0, "init", "died", "TD457"),
    ],
)
def test_recorded_faults_name_the_rank_and_step(case: str, rank: int, step: str, kind: str, code: str) -> None:
    ff = first_failure(replay(case))
    assert ff is not None
    assert (ff["rank"], ff["step"], ff["kind"], ff["code"]) == (rank, step, kind, code)
    assert ff["host"] and ff["pid"]
    assert ff["family"] in ("dist-hang", "rank-divergence")


def test_recorded_healthy_run_has_no_failure_and_every_step_ok() -> None:
    states = replay("ok")
    report = build(states, world_size=2, nnodes=1, backend="auto", mode="local", seconds=1.0)
    assert report.ok and report.first_failure is None
    assert report.backend == "gloo"  # what the ranks chose
    rows = report.to_json()["steps"]
    assert {(r["name"], r["rank"]) for r in rows} == {(s, r) for s in STEPS for r in (0, 1)}
    assert all(r["status"] == "ok" and r["seconds"] is not None for r in rows)
    assert [b["bytes"] for b in report.bandwidth] == [4096, 65536, 1048576, 16777216]
    assert all(b["busbw"] > 0 for b in report.bandwidth) and report.latency_s


def test_the_waiting_rank_is_not_the_culprit() -> None:
    """In the hang, rank 0 failed first (its collective timed out); rank 1 is named, rank 0 is a cascade."""
    states = replay("1-collectives-hang")
    rec0 = states[0].steps["collectives"]
    assert rec0["status"] == "failed" and rec0["code"] in ("TD455", "TD454")
    report = build(states, world_size=2, nnodes=1, backend="gloo", mode="local", seconds=1.0)
    row = {(r["name"], r["rank"]): r["status"] for r in report.to_json()["steps"]}
    assert row[("collectives", 1)] == "timeout" and row[("bandwidth", 0)] == "skipped"


def test_a_rank_missing_from_the_journals_is_named() -> None:
    states = replay("ok")
    del states[1]
    report = build(states, world_size=2, nnodes=1, backend="gloo", mode="local", seconds=1.0)
    assert not report.ok
    assert report.first_failure is not None
    assert (report.first_failure["rank"], report.first_failure["code"]) == (1, "TD452")


def test_report_json_has_the_documented_keys_and_renders(tmp_path: Path) -> None:
    report = build(replay("1-collectives-kill"), world_size=2, nnodes=1, backend="gloo", mode="local", seconds=3.0)
    data = report.to_json()
    assert {"schema_version", "ok", "world_size", "steps", "first_failure", "findings"} <= set(data)
    assert set(data["first_failure"]) >= {"step", "rank", "host", "code", "family", "message", "fix"}
    assert {"name", "rank", "host", "status", "seconds"} <= set(data["steps"][0])
    md = markdown(report)
    assert "| collectives |" in md and "TD457" in md
    out = tmp_path / "r.txt"
    with out.open("w") as fh:
        render(report, "text", fh)
    text = out.read_text()
    assert "first failure: step collectives, rank 1" in text and "died" in text


# -- devices ----------------------------------------------------------------------------------------


def devices_of(envs: list[dict[str, str]]) -> dict[int, dict[str, Any]]:
    return {r: {**device_of(rank_facts(env), int(env["LOCAL_RANK"])), "host": "node7"} for r, env in enumerate(envs)}


def test_each_local_rank_gets_its_own_gpu() -> None:
    envs = [{"LOCAL_RANK": str(i), "CUDA_VISIBLE_DEVICES": "0,1,2,3"} for i in range(4)]
    devs = devices_of(envs)
    assert [d["index"] for d in devs.values()] == [0, 1, 2, 3]
    assert shared_devices(devs) == []


def test_two_ranks_on_one_gpu_is_td488() -> None:
    # per-rank CUDA_VISIBLE_DEVICES that overlap: both ranks' cuda:0 is physical GPU 2
    envs = [{"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "2"}, {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "2,3"}]
    found = shared_devices(devices_of(envs))
    assert [f.code for f in found] == ["TD488"]
    assert "ranks 0, 1 on node7" in found[0].message and found[0].family == "gpu-unavailable"


def test_exclusive_gpu_held_by_another_process_is_td303() -> None:
    found = device_findings(rank_facts({"LOCAL_RANK": "1"}, exclusive={1: 4242}))
    assert "TD303" in [f.code for f in found]
    f = next(f for f in found if f.code == "TD303")
    assert "4242" in f.message or any("4242" in str(e.value) for e in f.evidence)


def test_visible_devices_that_hide_the_ranks_gpu_is_td309() -> None:
    facts = rank_facts({"LOCAL_RANK": "2", "CUDA_VISIBLE_DEVICES": "5,6"})
    assert device_of(facts, 2)["uuid"] is None  # cuda:2 does not exist for this rank
    assert "TD309" in [f.code for f in device_findings(facts)]


def test_local_rank_beyond_visible_count_is_td309() -> None:
    found = device_findings(rank_facts({"LOCAL_RANK": "4", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}))
    assert [f.code for f in found if f.code == "TD309"] == ["TD309"]


def test_visible_devices_naming_no_gpu_hides_all_td307_td308() -> None:
    assert "TD307" in [f.code for f in device_findings(rank_facts({"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "9"}))]
    hidden = rank_facts({"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": ""})
    assert "TD308" in [f.code for f in device_findings(hidden)]
    assert device_of(hidden, 0)["kind"] == "cpu"


# -- consistency -----------------------------------------------------------------------------------


def test_a_node_with_another_torch_is_an_error_naming_its_host() -> None:
    base = {"host": "a", "torch": "2.13.0+cu124", "cuda": "12.4", "nccl": "2.21.5", "python": "3.11.7"}
    base |= {"nofile": 1048576, "max_map_count": 65530, "shm_bytes": 2**30}
    other = {**base, "host": "b", "torch": "2.12.1+cu124", "nofile": 1024}
    diffs = {d.key: d for d in differences({0: base, 1: base | {}, 2: other, 3: other})}
    assert set(diffs) == {"torch", "nofile"}
    assert diffs["torch"].severity.label == "error" and diffs["nofile"].severity.label == "warning"
    assert diffs["torch"].odd_ranks() == [2, 3]
    f = diffs["torch"].finding()
    assert f.code == "TD468" and "2.12.1+cu124" in f.message and "(b)" in f.message
    assert "pip install torch==2.13.0+cu124" in f.fix and " on b" in f.fix


def test_same_everywhere_has_no_difference() -> None:
    d = {"host": "a", "torch": "2.13.0", "cuda": None, "nccl": None, "python": "3.11", "nofile": 1, "shm_bytes": 1}
    assert differences({0: d, 1: {**d, "host": "b"}}) == []


# -- launch environments ---------------------------------------------------------------------------


def test_slurm_variables_become_torchs() -> None:
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "2",
        "SLURM_JOB_NODELIST": "gpu[07-09,12],cpu1",
        "SLURM_JOB_ID": "123456",
    }
    out = env_from_slurm(env)
    assert out == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "2",
        "MASTER_ADDR": "gpu07",
        "MASTER_PORT": str(29500 + 123456 % 1000),
    }
    assert env_from_slurm({**env, "RANK": "0"}) == {}  # a launcher's own variables win
    assert env_from_slurm({**env, "MASTER_ADDR": "head"}).get("MASTER_ADDR") is None
    assert first_host("node1,node2") == "node1" and first_host("n[3-4]") == "n3"


def test_fault_and_config_round_trip() -> None:
    f = Fault.parse("1:collectives:kill")
    assert (f.rank, f.step, f.kind) == (1, "collectives", "kill")
    for bad in ("1:collective:kill", "x:env:kill", "1:env:explode", "1:env"):
        with pytest.raises(ValueError, match="RANK:STEP:FAULT"):
            Fault.parse(bad)
    cfg = ProbeConfig(backend="gloo", timeout=7.5, sizes=(8, 16), fault=f, gather=False, report=None)
    again = ProbeConfig.from_env({"TORCHDOCTOR_DIST_CONFIG": cfg.to_env()})
    assert again == cfg


def test_journal_lines_are_whole_records(tmp_path: Path) -> None:
    j = Journal(str(tmp_path), "3")
    j.write({"event": "hello", "rank": 3, "host": "h", "pid": 1})
    j.write({"event": "step", "step": "env", "status": "running"})
    j.write({"event": "step", "step": "env", "status": "ok", "seconds": 0.1})
    with open(tmp_path / "rank-3.jsonl", "a") as fh:
        fh.write('{"event": "step", "step": "rendez')  # a record cut by a kill: ignored
    recs = records_in(tmp_path)
    assert list(recs) == [3] and [r["event"] for r in recs[3]] == ["hello", "step", "step"]
    st = rank_states(recs)[3]
    assert st.steps["env"]["status"] == "ok" and st.running is None and st.host == "h"
    assert j.mirror()["steps"][0]["step"] == "env"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--rdzv-endpoint", "nohost"], "HOST:PORT"),
        (["--rdzv-endpoint", "h:99999"], "HOST:PORT"),
        (["--nnodes", "2"], "--rdzv-endpoint"),
        (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], "--node-rank"),
        (["--sizes", "4KiB,lots"], "--sizes"),
        (["--sizes", "1"], "between 4 bytes"),
        (["--inject", "1:nowhere:kill"], "RANK:STEP:FAULT"),
        (["--timeout", "0"], "--timeout"),
        (["--plot", "bw.pdf", "--nproc", "1", "--sizes", "4KiB"], ".png or .svg"),
    ],
)
def test_bad_options_are_one_clear_line(args: list[str], words: str) -> None:
    proc = run_cli("dist", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert words in proc.stderr and "Traceback" not in proc.stderr


def test_readme_shows_the_failure_as_the_rules_word_it() -> None:
    """README's failing run was captured from a real run; its first-failure line is what the rules say now."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    ff = first_failure(replay("1-collectives-hang"))
    assert ff is not None
    assert ff["message"] in readme and "first failure: step collectives, rank 1" in readme
    assert "torchdoctor dist passed" in readme and "docs/dist.md" in readme
