"""Distributed environment: facts/dist_env.py and the TD4xx codes (catalogue/distributed*.py).

Pure checks run on facts produced by the real gatherer from an env dict (nothing is mocked but
the environment); the port, resolution and interface tests use real sockets, DNS and namespaces.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from torchdoctor.catalogue.distributed_net import ifname_unmatched
from torchdoctor.checks import preflight_codes, run_checks
from torchdoctor.facts import Facts, GatherContext, dist_env
from torchdoctor.model import Finding, Severity
from torchdoctor.options import CheckOptions
from torchdoctor.registry import lookup

from .conftest import REPO, run_cli

FIXTURES = Path(__file__).parent / "fixtures" / "dist"
TD4 = [c for c in preflight_codes() if 401 <= int(c.code[2:]) <= 449]  # this domain's range, as `check` runs it
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


# -- helpers ----------------------------------------------------------------------------------


def dist_facts(env: dict[str, str], *, dist: bool = False, extra: dict[str, Any] | None = None) -> Facts:
    """Facts whose "dist" section comes from the real gatherer run on ``env``."""
    ctx = GatherContext(env=env, torch=False, dist=dist)
    data: dict[str, Any] = {"meta": {"schema_version": 1}, "dist": dist_env.gather(ctx), "unknown": ctx.unknowns}
    data.update(extra or {})
    json.dumps(data)  # the section must stay JSON-serialisable
    return Facts.from_dict(data)


def found(code: str, facts: Facts, **opts: Any) -> list[Finding]:
    # the code as `check` runs it (TD405 is declared with its log signatures; its check is a preflight variant)
    checked = next((c for c in preflight_codes() if c.code == code), None) or lookup(code)
    return run_checks(facts, CheckOptions(**opts), codes=[checked])


def one(code: str, facts: Facts, **opts: Any) -> Finding:
    hits = found(code, facts, **opts)
    assert len(hits) == 1, hits
    assert not hits[0].check_error, hits[0].message
    return hits[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


FULL = {"MASTER_ADDR": "127.0.0.1", "RANK": "1", "WORLD_SIZE": "2"}  # rank 1: no port test


def full(**kw: str) -> dict[str, str]:
    return {**FULL, "MASTER_PORT": str(free_port()), **kw}


SLURM_TASK = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "3",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "0",
    "SLURM_JOB_NODELIST": "gpu[01-02]",
}


# -- facts ------------------------------------------------------------------------------------


def test_inactive_environment_gathers_little() -> None:
    out = dist_env.gather(GatherContext(env={"PATH": "/usr/bin", "HOME": "/root"}, torch=False))
    assert out["active"] is False and out["active_because"] == []
    assert out["env"] == {} and out["master"] is None and out["store"] is None and out["interfaces"] is None


def test_raw_strings_kept_and_bad_ints_are_data() -> None:
    env = {
        "RANK": "${SLURM_PROCID}",
        "WORLD_SIZE": " 4 ",
        "MASTER_PORT": "29500x",
        "NCCL_DEBUG": "INFO",
        "NCCL_IB_HCA": "mlx5_0",
        "SLURM_NTASKS_PER_NODE": "2(x3),1",
        "AWS_SECRET_ACCESS_KEY": "x",
        "HOME": "/r",
    }
    out = dist_env.gather(GatherContext(env=env, torch=False))
    assert out["env"]["RANK"] == "${SLURM_PROCID}" and out["env"]["NCCL_IB_HCA"] == "mlx5_0"
    assert "AWS_SECRET_ACCESS_KEY" not in out["env"] and "HOME" not in out["env"]
    assert out["ints"] == {"WORLD_SIZE": 4}
    assert out["not_int"] == {"RANK": "${SLURM_PROCID}", "MASTER_PORT": "29500x"}
    assert out["active"] and out["store"] is None  # no valid port: nothing bound


def test_launchers_are_recognised() -> None:
    torchrun = dist_env.gather(
        GatherContext(env={**FULL, "TORCHELASTIC_RUN_ID": "x", "TORCHELASTIC_USE_AGENT_STORE": "True"}, torch=False)
    )
    assert torchrun["launcher"]["torchrun"] and torchrun["launcher"]["agent_store"]
    slurm = dist_env.gather(GatherContext(env=SLURM_TASK, torch=False))
    assert slurm["active"] and "SLURM_NTASKS>1" in slurm["active_because"] and slurm["launcher"]["slurm_step"]
    single = dist_env.gather(GatherContext(env={**SLURM_TASK, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}, torch=False))
    assert not single["active"]


def test_loopback_master_is_local_and_port_is_tested_for_rank0() -> None:
    port = free_port()
    out = dist_env.gather(
        GatherContext(
            env={"MASTER_ADDR": "localhost", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "2"}, torch=False
        )
    )
    assert out["master"]["loopback"] is True and out["master"]["is_local"] is True
    assert out["store"]["tested"] and out["store"]["why"] == "RANK=0"
    assert out["store"]["bindable"] is True and out["store"]["in_use"] is False
    assert {b["address"] for b in out["store"]["bind"]} >= {"0.0.0.0", "127.0.0.1"}


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"MASTER_ADDR": "198.51.100.7"}, "RANK=1"),  # TEST-NET-2: another host
        ({"MASTER_ADDR": "127.0.0.1"}, "RANK=1"),  # rank 0's store is (or will be) here
        ({"MASTER_ADDR": "127.0.0.1", "RANK": None, **SLURM_TASK}, "SLURM_PROCID=3"),
        ({"MASTER_ADDR": "198.51.100.7", "RANK": None}, "MASTER_ADDR is another host"),
    ],
)
def test_port_tested_only_where_the_store_opens(env: dict[str, str | None], why: str) -> None:
    merged = {k: v for k, v in {**full(), **env}.items() if v is not None}
    out = dist_env.gather(GatherContext(env=merged, torch=False))
    assert out["store"]["this_host"] is False and out["store"]["tested"] is False and out["store"]["bind"] == []
    assert out["store"]["why"] == why


def test_port_tested_before_launch_on_the_master_host() -> None:
    out = dist_env.gather(GatherContext(env={"MASTER_ADDR": "localhost", "MASTER_PORT": str(free_port())}, torch=False))
    assert out["store"]["tested"] and out["store"]["why"] == "MASTER_ADDR is this host"


def test_resolution_is_bounded_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # The one fake in this file: a resolver that never answers, to exercise the timeout path.
    def never_answers(*args: Any, **kwargs: Any) -> Any:
        time.sleep(5)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(dist_env.socket, "getaddrinfo", never_answers)
    started = time.monotonic()
    out = dist_env.resolve("slow.example", timeout=0.3)
    assert time.monotonic() - started < 1.5
    assert out["timed_out"] and out["addresses"] is None and "0.3 s" in out["error"]


# -- TD401-TD405 -------------------------------------------------------------------------------


def test_td401_missing_master_vars() -> None:
    f = one("TD401", dist_facts({"RANK": "0", "WORLD_SIZE": "2"}))
    assert f.severity is Severity.ERROR
    assert "MASTER_ADDR, MASTER_PORT are not set" in f.message and "RANK=0, WORLD_SIZE=2" in f.message
    assert "environment variable MASTER_ADDR expected, but not set" in f.message
    assert "MASTER_ADDR=<rank-0 host> MASTER_PORT=29500" in f.fix and "torchrun" in f.fix


def test_td401_empty_counts_as_missing() -> None:
    f = one("TD401", dist_facts(full(RANK="")))
    assert "RANK is not set (RANK set but empty)" in f.message
    assert not found("TD402", dist_facts(full(RANK="")))


def test_td401_near_misses() -> None:
    assert not found("TD401", dist_facts(full()))
    pre_launch = dist_facts({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    assert not found("TD401", pre_launch)  # torchrun will add RANK/WORLD_SIZE
    assert not found("TD401", dist_facts(SLURM_TASK))  # TD404 explains this one


def test_td401_with_dist_flag_is_a_warning() -> None:
    f = one("TD401", dist_facts({}, dist=True))
    assert f.severity is Severity.WARNING and "--dist" in f.message
    assert one("TD401", dist_facts({}), dist=True).severity is Severity.WARNING
    assert not found("TD401", dist_facts({}))


def test_td402_not_an_integer() -> None:
    f = one("TD402", dist_facts(full(RANK="${SLURM_PROCID}", LOCAL_RANK="gpu0")))
    assert (
        "RANK='${SLURM_PROCID}'" in f.message and "LOCAL_RANK='gpu0'" in f.message and "are not integers" in f.message
    )
    assert not found("TD402", dist_facts(full(RANK="1", LOCAL_RANK=" 0 ")))


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not below WORLD_SIZE=2 (valid: 0..1)"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK=-1 is negative"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0 is less than 1"),
        ({"RANK": "0", "WORLD_SIZE": "8", "LOCAL_RANK": "4", "LOCAL_WORLD_SIZE": "4"}, "LOCAL_RANK=4 is not below"),
        ({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8"}, "LOCAL_WORLD_SIZE=8 is larger"),
        ({"RANK": "0", "WORLD_SIZE": "4", "GROUP_RANK": "2", "GROUP_WORLD_SIZE": "2"}, "GROUP_RANK=2 is not below"),
    ],
)
def test_td403_out_of_range(env: dict[str, str], needle: str) -> None:
    f = one("TD403", dist_facts(env))
    assert needle in f.message and f.evidence


def test_td403_near_misses() -> None:
    ok = {
        "RANK": "7",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "3",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
    }
    assert not found("TD403", dist_facts(ok))


def test_td404_slurm_task_without_torch_vars() -> None:
    f = one("TD404", dist_facts(SLURM_TASK))
    assert "task 3 of 8 started by Slurm (4242)" in f.message and "RANK and WORLD_SIZE are not set" in f.message
    assert "RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID" in f.fix
    assert "srun --ntasks-per-node=1 torchrun" in f.fix


def test_td404_open_mpi() -> None:
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    f = one("TD404", dist_facts(env))
    assert "Open MPI" in f.message and "RANK=$OMPI_COMM_WORLD_RANK" in f.fix


@pytest.mark.parametrize(
    "change",
    [
        {"SLURM_NTASKS": "1", "SLURM_PROCID": "0"},  # single-task job
        {"SLURM_STEP_ID": None},  # the batch script, before srun
        {"RANK": "3", "WORLD_SIZE": "8"},  # mapped
        {"TORCHELASTIC_RUN_ID": "abc", "RANK": None},  # srun + torchrun
    ],
)
def test_td404_near_misses(change: dict[str, str | None]) -> None:
    env = {**SLURM_TASK, **change}
    assert not found("TD404", dist_facts({k: v for k, v in env.items() if v is not None}))


def test_td405_rank_exported_in_batch_script() -> None:
    env = {**SLURM_TASK, "RANK": "0", "WORLD_SIZE": "8", "LOCAL_RANK": "0", "MASTER_ADDR": "gpu01"}
    f = one("TD405", dist_facts(env))
    assert "RANK=0 but SLURM_PROCID=3" in f.message and "LOCAL_RANK=0 but SLURM_LOCALID=3" in f.message
    assert "batch script" in f.message


def test_td405_world_size_differs() -> None:
    f = one("TD405", dist_facts({**SLURM_TASK, "RANK": "3", "WORLD_SIZE": "6"}))
    assert "WORLD_SIZE=6 but SLURM_NTASKS=8" in f.message


@pytest.mark.parametrize(
    "change",
    [
        {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3"},  # consistent
        {"RANK": "25", "WORLD_SIZE": "64", "LOCAL_RANK": "1"},  # 8 ranks per task (spawned)
        {"RANK": "0", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "x"},  # torchrun numbers ranks
    ],
)
def test_td405_near_misses(change: dict[str, str]) -> None:
    assert not found("TD405", dist_facts({**SLURM_TASK, **change}))


# -- TD406 / TD407: MASTER_PORT ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("port", "needle"),
    [
        ("abc", "is not an integer"),
        ("70000", "port must have value from 0 to 65535 but was 70000"),
        ("0", "cannot know"),
        ("-5", "outside 1-65535"),
    ],
)
def test_td406_invalid_port(port: str, needle: str) -> None:
    f = one("TD406", dist_facts(full(MASTER_PORT=port)))
    assert needle in f.message and f"MASTER_PORT='{port}'" in f.message


def test_td406_near_miss() -> None:
    assert not found("TD406", dist_facts(full(MASTER_PORT="29500")))


def _hold_port_in_child() -> tuple[subprocess.Popen[str], int]:
    """A separate process (not our ancestor, like a stale job) listening on 127.0.0.1:<free port>."""
    code = (
        "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
        "print(s.getsockname()[1], flush=True); sys.stdin.read()"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def _check_json(env: dict[str, str], **kw: Any) -> dict[str, Any]:
    proc = run_cli("check", "--format", "json", "--no-torch", "--fail-on", "never", env=env, **kw)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _codes(report: dict[str, Any], code: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["code"] == code]


def test_td407_real_port_in_use_then_freed() -> None:
    holder, port = _hold_port_in_child()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "2"}
    try:
        hits = _codes(_check_json(env), "TD407")
        assert len(hits) == 1, hits
        finding = hits[0]
        assert finding["family"] == "dist-port" and finding["severity"] == "error"
        assert f"MASTER_PORT {port} is already in use" in finding["message"]
        values = " ".join(str(e["value"]) for e in finding["evidence"])
        assert str(port) in values and "in use" in values
        if IS_ROOT:  # others' sockets are only attributed to a pid with root
            assert f"pid {holder.pid}" in finding["message"] and f"kill {holder.pid}" in finding["fix"]
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=10)
    assert not _codes(_check_json(env), "TD407")


def test_td407_port_held_by_an_ancestor_is_expected() -> None:
    # This pytest process listens, the CLI runs as its child: like a torchrun worker and its agent.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "2"}
        proc = run_cli("facts", "--no-torch", env=env)
        store = json.loads(proc.stdout)["dist"]["store"]
        assert store["in_use"] is True
        if IS_ROOT:
            assert store["holder"]["pid"] == os.getpid() and store["holder"]["is_ancestor"] is True
            assert not _codes(_check_json(env), "TD407")


def test_td407_privileged_port_without_capability() -> None:
    if not IS_ROOT or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to drop CAP_NET_BIND_SERVICE")
    start = int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text())
    port = next((p for p in range(1000, min(start, 1024)) if _bindable(p)), None)
    if port is None:
        pytest.skip(f"no free port below net.ipv4.ip_unprivileged_port_start={start}")
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "2"}
    full_env = {**os.environ, **env}
    proc = subprocess.run(
        [
            "setpriv",
            "--bounding-set=-net_bind_service",
            sys.executable,
            "-m",
            "torchdoctor",
            "check",
            "--format",
            "json",
            "--no-torch",
            "--fail-on",
            "never",
        ],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
    )
    hits = _codes(json.loads(proc.stdout), "TD407")
    assert len(hits) == 1 and f"MASTER_PORT {port} cannot be bound" in hits[0]["message"]
    assert "EACCES" in hits[0]["message"] and "below 1024" in hits[0]["message"]


def _bindable(port: int) -> bool:
    try:
        with socket.socket() as s:
            s.bind(("0.0.0.0", port))
        return True
    except OSError:
        return False


def _store_facts(holder: dict[str, Any] | None, agent_store: bool = False) -> Facts:
    return Facts.from_dict(
        {
            "meta": {"schema_version": 1},
            "dist": {
                "active": True,
                "env": {"MASTER_ADDR": "localhost", "MASTER_PORT": "29500", "RANK": "0"},
                "ints": {"MASTER_PORT": 29500, "RANK": 0},
                "launcher": {"agent_store": agent_store},
                "store": {
                    "port": 29500,
                    "tested": True,
                    "bindable": False,
                    "in_use": True,
                    "why": "RANK=0",
                    "holder": holder,
                    "bind": [
                        {"address": "0.0.0.0", "ok": False, "errno": 98, "error": "EADDRINUSE: Address already in use"}
                    ],
                },
            },
        }
    )


def test_td407_expected_holders_are_skipped() -> None:
    stale = {"pid": 4321, "name": "python", "user": "alice", "is_self": False, "is_ancestor": False}
    assert "pid 4321 (python, user alice)" in one("TD407", _store_facts(stale)).message
    assert not found("TD407", _store_facts({**stale, "is_ancestor": True}))
    assert not found("TD407", _store_facts({**stale, "is_self": True}))
    assert not found("TD407", _store_facts(None, agent_store=True))
    assert found("TD407", _store_facts(stale, agent_store=True))  # a visible stranger still counts
    assert one("TD407", _store_facts(None)).fix.endswith("holding it.")


# -- TD408-TD410: MASTER_ADDR -------------------------------------------------------------------


def test_td408_unresolvable_name_is_bounded() -> None:
    started = time.monotonic()
    facts = dist_facts(full(MASTER_ADDR="torchdoctor-test.invalid"))  # RFC 2606: never resolves
    assert time.monotonic() - started < dist_env.RESOLVE_TIMEOUT + 2
    f = one("TD408", facts)
    assert "MASTER_ADDR=torchdoctor-test.invalid does not resolve" in f.message
    assert f.severity in (Severity.ERROR, Severity.WARNING)  # WARNING only when the resolver did not answer
    assert facts.why_unknown("dist.master.is_local")
    assert not found("TD408", dist_facts(full(MASTER_ADDR="localhost")))


@pytest.mark.parametrize(
    "nodes",
    [
        {"GROUP_WORLD_SIZE": "2"},
        {"SLURM_STEP_NUM_NODES": "2"},
        {"SLURM_NNODES": "4"},
        {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"},
    ],
)
def test_td409_loopback_master_on_several_nodes(nodes: dict[str, str]) -> None:
    f = one("TD409", dist_facts(full(MASTER_ADDR="localhost", **nodes)))
    assert "resolves to loopback (127.0.0.1" in f.message and "nodes" in f.message


@pytest.mark.parametrize(
    "nodes",
    [
        {"GROUP_WORLD_SIZE": "1"},
        {"SLURM_STEP_NUM_NODES": "1", "SLURM_JOB_NUM_NODES": "2"},
        {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"},
    ],
)
def test_td409_near_misses(nodes: dict[str, str]) -> None:
    assert not found("TD409", dist_facts(full(MASTER_ADDR="127.0.0.1", **nodes)))


def test_td409_routable_master_is_fine() -> None:
    import psutil

    addrs = [
        a.address
        for i in psutil.net_if_addrs().values()
        for a in i
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]
    if not addrs:
        pytest.skip("this host has no non-loopback IPv4 address")
    facts = dist_facts(full(MASTER_ADDR=addrs[0], GROUP_WORLD_SIZE="2"))
    assert facts.get("dist.master.is_local") is True and facts.get("dist.master.loopback") is False
    assert not found("TD409", facts)


def test_td410_rank0_not_on_master() -> None:
    f = one("TD410", dist_facts(full(RANK="0", MASTER_ADDR="198.51.100.7")))
    assert "RANK=0" in f.message and "198.51.100.7" in f.message
    assert not found("TD410", dist_facts(full(RANK="1", MASTER_ADDR="198.51.100.7")))
    assert not found("TD410", dist_facts(full(RANK="0", MASTER_ADDR="127.0.0.1")))
    assert not found(
        "TD410",
        dist_facts(
            full(RANK="0", MASTER_ADDR="198.51.100.7", TORCHELASTIC_RUN_ID="x", TORCHELASTIC_USE_AGENT_STORE="True")
        ),
    )


# -- TD411: interfaces ------------------------------------------------------------------------

NAMES = {
    "lo": {"addresses": ["127.0.0.1"], "up": True},
    "eth0": {"addresses": ["10.0.0.2"], "up": True},
    "ib0": {"addresses": [], "up": False},
}


@pytest.mark.parametrize(
    ("var", "value", "bad"),
    [
        ("NCCL_SOCKET_IFNAME", "eth", []),
        ("NCCL_SOCKET_IFNAME", "=eth", ["=eth"]),
        ("NCCL_SOCKET_IFNAME", "=eth0", []),
        ("NCCL_SOCKET_IFNAME", "ens,eth", []),
        ("NCCL_SOCKET_IFNAME", "ens,ib", ["ens", "ib"]),
        ("NCCL_SOCKET_IFNAME", "^docker,lo", []),
        ("GLOO_SOCKET_IFNAME", "eth0,ib0", ["ib0"]),
        ("GLOO_SOCKET_IFNAME", "eth", ["eth"]),
        ("TP_SOCKET_IFNAME", "eth0", []),
    ],
)
def test_ifname_matching_rules(var: str, value: str, bad: list[str]) -> None:
    assert ifname_unmatched(var, value, NAMES) == bad


def test_td411_missing_interface_on_this_host() -> None:
    f = one("TD411", dist_facts({"GLOO_SOCKET_IFNAME": "nonexistent0"}))
    assert "no interface is named nonexistent0" in f.message
    assert "Unable to find address for: nonexistent0" in f.message and "lo 127.0.0.1" in f.fix
    assert not found("TD411", dist_facts({"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "l"}))
    assert one("TD411", dist_facts({"NCCL_SOCKET_IFNAME": "=l"})).message.startswith("NCCL_SOCKET_IFNAME==l")


def test_td411_interface_without_address_in_a_new_netns() -> None:
    if not IS_ROOT or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a private network namespace")
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    proc = subprocess.run(
        [
            "unshare",
            "-n",
            sys.executable,
            "-m",
            "torchdoctor",
            "check",
            "--format",
            "json",
            "--no-torch",
            "--fail-on",
            "never",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    if proc.returncode != 0 and "unshare" in proc.stderr:
        pytest.skip(f"unshare -n not permitted here: {proc.stderr.strip()}")
    hits = _codes(json.loads(proc.stdout), "TD411")
    assert len(hits) == 1 and "lo has no IPv4/IPv6 address (lo down)" in hits[0]["message"]


# -- TD412 / TD413 ---------------------------------------------------------------------------------


def _nccl_facts(nccl: bool | None, devices: int = 2, active: bool = True) -> Facts:
    return Facts.from_dict(
        {
            "meta": {"schema_version": 1},
            "dist": {"active": active, "env": {}},
            "gpu": {"devices": [{"index": i, "name": "NVIDIA A100-SXM4-80GB"} for i in range(devices)]},
            "torch": {
                "installed": True,
                "version": "2.13.0+cpu",
                "cuda": None,
                "backends": {"gloo": True, "nccl": nccl},
            },
        }
    )


def test_td412_gpus_without_nccl() -> None:
    f = one("TD412", _nccl_facts(False))
    assert "2 GPU(s)" in f.message and "2.13.0+cpu (CPU-only build)" in f.message
    assert not found("TD412", _nccl_facts(True))
    assert not found("TD412", _nccl_facts(None))
    assert not found("TD412", _nccl_facts(False, devices=0))
    assert not found("TD412", _nccl_facts(False, active=False))
    assert found("TD412", _nccl_facts(False, active=False), dist=True)


@pytest.mark.parametrize(
    ("value", "bad"),
    [
        ("1", True),
        ("true", True),
        ("", True),
        (" INFO", True),
        ("DETAILED", True),
        ("DETAIL", False),
        ("info", False),
        ("Off", False),
    ],
)
def test_td413_debug_level(value: str, bad: bool) -> None:
    assert bool(found("TD413", dist_facts({"TORCH_DISTRIBUTED_DEBUG": value}))) is bad


@pytest.mark.torch
def test_td413_agrees_with_real_torch() -> None:
    """The rule is checked against torch itself: `import torch` fails exactly when TD413 fires."""
    pytest.importorskip("torch")
    values = ["1", "detail", "", "OFF "]

    def imports(value: str) -> tuple[str, subprocess.CompletedProcess[str]]:
        env = {**os.environ, "TORCH_DISTRIBUTED_DEBUG": value}
        return value, subprocess.run(
            [sys.executable, "-c", "import torch"], capture_output=True, text=True, env=env, timeout=240
        )

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(pool.map(imports, values))
    outcomes = set()
    for value, proc in results.items():
        fires = bool(found("TD413", dist_facts({"TORCH_DISTRIBUTED_DEBUG": value})))
        assert fires is (proc.returncode != 0), (value, proc.stderr[-300:])
        if fires:
            assert "The value of TORCH_DISTRIBUTED_DEBUG must be OFF, INFO, or DETAIL." in proc.stderr
        outcomes.add(fires)
    assert outcomes == {True, False}, "the values must include both one torch refuses and one it accepts"


# -- the catalogue's quotes are real ---------------------------------------------------------------


def test_quoted_torch_errors_are_recorded() -> None:
    recorded = (FIXTURES / "torch_errors.txt").read_text(encoding="utf-8")
    findings = [
        one("TD401", dist_facts(full(RANK=""))),
        one("TD406", dist_facts(full(MASTER_PORT="70000"))),
        one("TD407", _store_facts(None)),
        one("TD408", dist_facts(full(MASTER_ADDR="td-test.invalid", MASTER_PORT="29542"))),
        one("TD411", dist_facts({"GLOO_SOCKET_IFNAME": "nonexistent0"})),
        one("TD413", dist_facts({"TORCH_DISTRIBUTED_DEBUG": "1"})),
    ]
    # the findings above repeat the recorded experiments, so their filled-in quotes must match verbatim
    for f in findings:
        quotes = re.findall(r"`([^`]+)`", f.message)
        assert quotes, f.code
        for quote in quotes:  # "...ms" stands for the timeout in milliseconds
            for part in quote.split("..."):
                assert part.strip(" .") in recorded, (f.code, part)


def test_td4_codes_are_in_range_and_area() -> None:
    assert len(TD4) >= 10
    for c in TD4:
        assert c.area == "distributed" and c.check is not None
        assert c.family in {"dist-env", "dist-port", "dist-connect"}


def test_live_check_runs_clean_without_distributed_env() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_"))}
    for var in (*dist_env.ACTIVE_VARS, *dist_env.IFNAME_VARS, "TORCH_DISTRIBUTED_DEBUG"):
        env.pop(var, None)
    proc = subprocess.run(
        [sys.executable, "-m", "torchdoctor", "facts", "--no-torch"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=REPO,
    )
    assert json.loads(proc.stdout)["dist"]["active"] is False
