"""``torchdoctor dist`` on real gloo process groups over loopback: passing runs, every fault, two
"nodes" on one machine, torchrun, and the lab's distributed scenarios predicted (closed loop).

Deadlines are short (4 s) so a fault costs seconds; "named within deadline + 2 s" is measured from
the moment the failing step started (the rank's own journal) to the moment the report exists.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from torchdoctor.dist.journal import records_in
from torchdoctor.dist.launch import LaunchOptions, run
from torchdoctor.dist.probe import Fault
from torchdoctor.lab import get

from .conftest import run_cli

DEADLINE = 4.0
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GROUP_RANK")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS and not k.startswith("SLURM_")}
    return {**env, "GLOO_SOCKET_IFNAME": "lo", **extra}


def dist_json(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "torchdoctor", "dist", "--format", "json", *args],
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.stdout.strip(), proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def rank_pids(log_dir: Path) -> list[int]:
    run_dir = next(log_dir.glob("torchdoctor-dist-*"))
    return [r["pid"] for recs in records_in(run_dir / "ranks").values() for r in recs if r.get("event") == "hello"]


@pytest.fixture
def holder() -> Iterator[tuple[int, int]]:
    """Another process listening on a port: (port, pid)."""
    code = (
        "import socket,sys,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        "s.bind(('0.0.0.0', 0)); s.listen(1); print(s.getsockname()[1], flush=True); time.sleep(120)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    yield port, proc.pid
    proc.kill()
    proc.wait()


# -- passing runs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("nproc", [2, 4])
def test_healthy_gloo_run_passes_every_step_with_checked_results(nproc: int, tmp_path: Path) -> None:
    rc, data = dist_json("--nproc", str(nproc), "--timeout", "30", "--log-dir", str(tmp_path))
    assert rc == 0 and data["ok"] and data["first_failure"] is None
    assert data["world_size"] == nproc and data["backend"] == "gloo"
    assert len(data["steps"]) == 8 * nproc and all(s["status"] == "ok" for s in data["steps"])
    assert all(s["seconds"] is not None and s["host"] == socket.gethostname() for s in data["steps"])
    run_dir = next(tmp_path.glob("torchdoctor-dist-*"))
    recs = records_in(run_dir / "ranks")
    coll = [r for rs in recs.values() for r in rs if r.get("step") == "collectives" and r.get("status") == "ok"]
    assert len(coll) == nproc
    assert all(c["details"]["checked"] == ["all_gather", "all_reduce", "broadcast", "reduce_scatter"] for c in coll)
    assert [b["bytes"] for b in data["bandwidth"]] == [4096, 65536, 1048576, 16777216]
    assert data["latency_s"] > 0
    assert gone(rank_pids(tmp_path))


def test_text_report_and_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / "bw.png"
    proc = run_cli("dist", "--nproc", "2", "--sizes", "4KiB,256KiB", "--plot", str(plot), env=clean_env())
    assert proc.returncode == 0, proc.stderr
    assert "torchdoctor dist passed" in proc.stdout and "| collectives" not in proc.stdout
    assert "collectives" in proc.stdout and "256 KiB" in proc.stdout and "busbw" in proc.stdout
    assert plot.stat().st_size > 5000 and plot.read_bytes()[:4] == b"\x89PNG"


def test_runs_under_torchrun_as_a_module(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2"]
        + ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--max-restarts", "0"]
        + ["-m", "torchdoctor.dist", "--format", "json", "--timeout", "20"],
        env=clean_env(TMPDIR=str(tmp_path)),  # torchrun's own log directory (torchelastic_*) goes there
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)  # rank 0 alone prints the report, with every rank's steps
    assert data["ok"] and data["mode"] == "torchrun" and data["world_size"] == 2
    assert {s["rank"] for s in data["steps"]} == {0, 1} and all(s["status"] == "ok" for s in data["steps"])


def test_two_nodes_on_one_machine_pass() -> None:
    port = free_port()
    common = ["--nnodes", "2", "--nproc", "1", "--rdzv-endpoint", f"127.0.0.1:{port}", "--timeout", "30"]
    cmd = [sys.executable, "-m", "torchdoctor", "dist", "--format", "json", *common]
    other = subprocess.Popen([*cmd, "--node-rank", "1"], env=clean_env(), stdout=subprocess.PIPE, text=True)
    rc, mine = dist_json(*common, "--node-rank", "0")
    out, _ = other.communicate(timeout=60)
    theirs = json.loads(out)
    assert rc == 0 and other.returncode == 0 and mine["ok"] and theirs["ok"]
    full = mine if len({s["rank"] for s in mine["steps"]}) == 2 else theirs  # the node that got rank 0
    assert {s["rank"] for s in full["steps"]} == {0, 1} and full["world_size"] == 2
    assert all(s["status"] == "ok" for s in full["steps"])


def test_second_node_never_started_is_named_within_the_deadline() -> None:
    port = free_port()
    t0 = time.monotonic()
    rc, data = dist_json("--nnodes", "2", "--nproc", "1", "--rdzv-endpoint", f"127.0.0.1:{port}", "--timeout", "4")
    took = time.monotonic() - t0
    ff = data["first_failure"]
    assert rc == 1 and not data["ok"]
    assert ff["step"] == "rendezvous" and ff["family"] == "dist-connect" and ff["code"] == "TD452"
    assert "not all 2 nodes joined" in ff["message"] and ff["host"] == socket.gethostname()
    assert took < 4 + 15  # the rendezvous deadline plus the launcher's start


# -- faults ---------------------------------------------------------------------------------------------


def named_within(fault: str, tmp_path: Path) -> tuple[dict[str, Any], float]:
    """Run with a fault; the report, and seconds from the faulty step's start to the report."""
    rep = run(LaunchOptions(nproc=2, timeout=DEADLINE, fault=Fault.parse(fault), log_dir=str(tmp_path)))
    end = time.time()
    rank, step, _ = fault.split(":")
    run_dir = next(tmp_path.glob("torchdoctor-dist-*"))
    recs = records_in(run_dir / "ranks")[int(rank)]
    started = next(r["t"] for r in recs if r.get("step") == step and r.get("status") == "running")
    assert gone(rank_pids(tmp_path)), "a rank outlived the run"
    return rep.to_json(), end - started


@pytest.mark.parametrize(
    ("fault", "kind", "status"),
    [
        ("1:collectives:kill", "died", "died"),
        ("1:collectives:hang", "hung", "timeout"),
        ("1:barrier:stop", "hung", "timeout"),
        ("0:init:exit", "died", "died"),
    ],
)
def test_a_rank_that_dies_or_hangs_is_named_within_deadline_plus_2s(
    fault: str, kind: str, status: str, tmp_path: Path
) -> None:
    data, seconds = named_within(fault, tmp_path)
    rank, step, _ = fault.split(":")
    ff = data["first_failure"]
    assert not data["ok"]
    assert (ff["rank"], ff["step"], ff["kind"], ff["family"]) == (int(rank), step, kind, "dist-hang")
    assert ff["host"] == socket.gethostname() and isinstance(ff["pid"], int)
    row = next(s for s in data["steps"] if s["name"] == step and s["rank"] == int(rank))
    assert row["status"] == status
    assert seconds < DEADLINE + 2, f"named {seconds:.1f} s after the step started"


def test_a_collective_with_wrong_data_names_the_rank_it_came_from(tmp_path: Path) -> None:
    data, _ = named_within("1:collectives:wrong", tmp_path)
    ff = data["first_failure"]
    assert (ff["rank"], ff["code"], ff["family"]) == (1, "TD467", "rank-divergence")
    assert "rank(s) 1 arrived wrong" in ff["message"]


def test_master_port_held_by_another_listener_is_dist_port_with_its_pid(holder: tuple[int, int]) -> None:
    port, pid = holder
    rc, data = dist_json("--nproc", "2", env=clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
    ff = data["first_failure"]
    assert rc == 1 and ff["family"] == "dist-port" and ff["code"] == "TD407"
    assert str(port) in ff["message"] and f"pid {pid}" in ff["message"]
    assert data["steps"] == []  # nothing was started


@pytest.mark.parametrize(
    ("env", "code", "variable"),
    [
        ({"RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}, "TD401", "WORLD_SIZE"),
        ({"RANK": "3", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}, "TD403", "RANK=3"),
        ({"RANK": "one", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}, "TD402", "RANK"),
    ],
)
def test_missing_or_inconsistent_rank_variables_are_dist_env(env: dict[str, str], code: str, variable: str) -> None:
    rc, data = dist_json("--timeout", "5", env=clean_env(**env), timeout=60)
    ff = data["first_failure"]
    assert rc == 1 and (ff["step"], ff["code"], ff["family"]) == ("env", code, "dist-env")
    assert variable in ff["message"]


def test_sigterm_mid_run_leaves_nothing_running(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchdoctor", "dist", "--nproc", "2", "--timeout", "60"]
        + ["--inject", "1:collectives:hang", "--log-dir", str(tmp_path)],
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    pids: list[int] = []
    while time.monotonic() < deadline:
        runs = list(tmp_path.glob("torchdoctor-dist-*/ranks"))
        recs = records_in(runs[0]) if runs else {}
        if any(r.get("step") == "collectives" for rs in recs.values() for r in rs):
            pids = [r["pid"] for rs in recs.values() for r in rs if r.get("event") == "hello"]
            break
        time.sleep(0.1)
    assert len(pids) == 2, "the ranks never reached the collectives"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    t0 = time.monotonic()
    while not gone(pids) and time.monotonic() - t0 < 5:
        time.sleep(0.1)
    assert gone(pids)


# -- the lab's distributed scenarios, predicted by dist ----------------------------------------------


def predicted(name: str, port_holder: tuple[int, int]) -> dict[str, Any]:
    """Run dist in the situation the lab scenario reproduces; its first failure."""
    env_case = {
        "dist-env-missing-rank": {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())},
        "dist-env-missing-world-size": {"RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())},
        "dist-env-missing-master-addr": {"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": str(free_port())},
        "dist-env-missing-master-port": {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"},
        "dist-rank0-alone": {
            "RANK": "0",
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
        },
        "dist-no-master": {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())},
    }
    if name in env_case:
        _, data = dist_json("--timeout", "3", env=clean_env(**env_case[name]), timeout=60)
    elif name == "dist-port-in-use":
        port, _ = port_holder
        _, data = dist_json("--nproc", "2", env=clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
    else:
        fault = {"dist-peer-killed": "1:collectives:kill", "dist-peer-hangs": "1:collectives:hang"}[name]
        _, data = dist_json("--nproc", "2", "--timeout", "4", "--inject", fault)
    assert data["first_failure"] is not None, f"{name}: dist saw nothing"
    return dict(data["first_failure"])


LAB = [
    "dist-port-in-use",
    "dist-peer-killed",
    "dist-peer-hangs",
    "dist-env-missing-rank",
    "dist-env-missing-world-size",
    "dist-env-missing-master-addr",
    "dist-env-missing-master-port",
    "dist-rank0-alone",
    "dist-no-master",
]


@pytest.mark.parametrize("name", LAB)
def test_dist_predicts_the_labs_distributed_failures(name: str, holder: tuple[int, int]) -> None:
    scenario = get(name)
    ff = predicted(name, holder)
    assert ff["family"] == scenario.family, f"{name}: lab {scenario.code} ({scenario.family}), dist {ff}"
    if name == "dist-no-master":  # refusal told apart from a timeout, and the address named
        assert "connection refused: nothing listens at 127.0.0.1:" in ff["message"]
    if name == "dist-rank0-alone":  # torch's own words, or (a loaded machine) the watchdog's
        assert "1/2 clients joined" in ff["message"] or "step rendezvous" in ff["message"]
