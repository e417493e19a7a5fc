"""Closed loop for the distributed scenarios (lab/scenarios/dist.py): gloo over loopback, short timeouts.

For each: the real failure happens with the text its code recognises; explain names it (a root
cause as the root cause; a cascade such as a survivor's 'Connection closed by peer' as the top
diagnosis when the dead rank said nothing); the fixed variant passes; and where `torchdoctor check
--dist` has a preflight (TD401 missing variables, TD407 port in use) it reported the problem first.
The torchrun runs, the hung peers and the order mismatch are slow (-m slow or TORCHDOCTOR_LAB_SLOW=1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from torchdoctor.lab import get
from torchdoctor.lab.runner import RunRecord, run
from torchdoctor.lab.scenarios import dist
from torchdoctor.registry import lookup
from torchdoctor.signature import Role

from .support.lab import (
    LOGS,
    LabRuns,
    assert_failure,
    assert_fixed,
    assert_recorded,
    scenario_names,
    signature_values,
    slow_requested,
)

NAMES = scenario_names("dist")
SLOW = scenario_names("dist", slow=True)
DIST_VARS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
    "GROUP_RANK",
)


@pytest.fixture(scope="module")
def runs() -> Iterator[LabRuns]:
    lab = LabRuns(NAMES)
    yield lab
    lab.close()


def assert_explained(name: str, rec: RunRecord) -> None:
    """Root-cause codes must be the root cause; a cascade code the top diagnosis (nothing better was printed)."""
    from torchdoctor.explain import explain

    s = get(name)
    report = explain(rec.text())
    assert report.diagnoses, f"explain found nothing in {name}:\n{rec.tail()}"
    roles = {sig.role for sig in lookup(s.code).signatures}
    if Role.ROOT_CAUSE in roles:
        root = report.root_cause
        assert root is not None and (root.code, root.family) == (s.code, s.family), (
            f"{name}: explain said {report.codes()}"
        )
    else:
        top = report.diagnoses[0]
        assert (top.code, top.family, top.role) == (s.code, s.family, "cascade"), f"{name}: {report.codes()}"


def test_the_scenarios_are_here() -> None:
    assert {f"dist-env-missing-{v}" for v in ("rank", "world-size", "master-addr", "master-port")} <= set(NAMES)
    assert {
        "dist-port-in-use",
        "dist-rank0-alone",
        "dist-no-master",
        "dist-peer-killed",
        "dist-collective-shape-mismatch",
    } <= set(NAMES)
    assert {
        "dist-peer-hangs",
        "torchrun-peer-killed",
        "torchrun-peer-hangs",
        "torchrun-peer-oom",
        "dist-collective-order-mismatch",
    } <= set(SLOW)


@pytest.mark.parametrize("name", NAMES)
def test_failure_happens(runs: LabRuns, name: str) -> None:
    assert_failure(name, runs.get(name))


@pytest.mark.parametrize("name", NAMES)
def test_explain_names_the_code(runs: LabRuns, name: str) -> None:
    assert_explained(name, runs.get(name))


@pytest.mark.parametrize("name", NAMES)
def test_fixed_variant_passes(runs: LabRuns, name: str) -> None:
    rec = runs.get(name, fixed=True)
    assert_fixed(name, rec)


@pytest.mark.parametrize("name", NAMES + SLOW)
def test_output_is_recorded_as_a_fixture(name: str) -> None:
    assert_recorded(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_slow_closed_loop(name: str, request: pytest.FixtureRequest) -> None:
    if not slow_requested(request.config):
        pytest.skip("slow (torchrun or a hung peer, ~10 s each way): run with -m slow or TORCHDOCTOR_LAB_SLOW=1")
    failed = run(get(name))
    if failed.skipped:
        pytest.skip(failed.skipped)
    assert_failure(name, failed)
    assert_explained(name, failed)
    assert_fixed(name, run(get(name), fixed=True))


# -- what the real texts say -------------------------------------------------------------------------


@pytest.mark.parametrize("var", dist.ENV_VARS)
def test_missing_variable_is_named(runs: LabRuns, var: str) -> None:
    name = f"dist-env-missing-{var.lower().replace('_', '-')}"
    assert signature_values("TD450", runs.get(name).text())[0]["var"] == var


def test_port_in_use_names_the_port(runs: LabRuns) -> None:
    text = runs.get("dist-port-in-use").text()
    assert signature_values("TD451", text)[0]["port"] in text.split("EADDRINUSE")[0]


def test_store_alone_counts_the_clients(runs: LabRuns) -> None:
    values = signature_values("TD452", runs.get("dist-rank0-alone").text())[0]
    assert (values["joined"], values["world"]) == ("1", "2")


def test_unreachable_store_names_the_loopback_address(runs: LabRuns) -> None:
    values = signature_values("TD453", runs.get("dist-no-master").text())[0]
    assert values["host"] == dist.LOOPBACK and values["ms"] == str(int(dist.CONNECT_TIMEOUT_S * 1000))


def test_killed_peer_is_a_cascade_with_a_sigkill_confirmation(runs: LabRuns) -> None:
    from torchdoctor.explain import explain

    report = explain(runs.get("dist-peer-killed").text())
    assert report.root_cause is None, "the dead rank printed nothing: no root cause may be invented"
    by_code = {d.code: d for d in report.diagnoses}
    assert by_code["TD454"].values["peer"] == dist.LOOPBACK
    assert by_code["TD458"].values == {"process_index": "1", "how": "signal SIGKILL"}
    assert by_code["TD274"].role == "confirmation"


def test_shape_mismatch_names_both_ranks(runs: LabRuns) -> None:
    values = signature_values("TD456", runs.get("dist-collective-shape-mismatch").text())
    assert {(v["rank"], v["other"]) for v in values} == {("0", "1"), ("1", "0")}
    assert all(v["op"] == v["other_op"] == "ALLREDUCE" and "shapes" in v["aspects"] for v in values)


# -- preflight: `check --dist` with the same environment ----------------------------------------------


def _check(env: dict[str, str], *args: str) -> dict[str, dict[str, Any]]:
    clean = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    argv = [
        sys.executable,
        "-m",
        "torchdoctor",
        "check",
        "--dist",
        "--no-torch",
        "--format",
        "json",
        "--fail-on",
        "never",
        *args,
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**clean, **env}, check=False)
    assert proc.returncode == 0, proc.stderr
    return {f["code"]: f for f in json.loads(proc.stdout)["findings"]}


@pytest.mark.parametrize("var", dist.ENV_VARS)
def test_check_predicts_the_missing_variable(var: str) -> None:
    env = {"MASTER_ADDR": dist.LOOPBACK, "MASTER_PORT": str(dist.free_port()), "RANK": "0", "WORLD_SIZE": "1"}
    del env[var]
    findings = _check(env)
    assert "TD401" in findings, sorted(findings)
    assert f"environment variable {var} expected, but not set" in findings["TD401"]["message"]


def test_check_predicts_the_port_in_use() -> None:
    hold = (
        "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1); "
        "print(s.getsockname()[1], flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen(  # another process than check's ancestors holds the port, as a stale run would
        [sys.executable, "-c", hold],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert holder.stdout is not None
        port = holder.stdout.readline().strip()
        findings = _check({"MASTER_ADDR": dist.LOOPBACK, "MASTER_PORT": port, "RANK": "0", "WORLD_SIZE": "1"})
    finally:
        holder.kill()
        holder.wait()
    assert "TD407" in findings, sorted(findings)
    assert port in findings["TD407"]["message"] and str(holder.pid) in findings["TD407"]["message"]


# -- gloo's interface choice and torchrun's SIGKILL summary (TD460, TD459) ------------------------------

_GLOO_INIT = (
    "import datetime, torch.distributed as dist\n"
    "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:0', rank=0, world_size=1,\n"
    "                        timeout=datetime.timedelta(seconds=10))\n"
    "dist.destroy_process_group()\n"
)


def _gloo_init(ifname: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS and not k.startswith(("GLOO_", "NCCL_"))}
    return subprocess.run(
        [sys.executable, "-c", _GLOO_INIT],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "GLOO_SOCKET_IFNAME": ifname},
        check=False,
    )


def test_gloo_interface_that_does_not_exist_is_named_and_lo_fixes_it() -> None:
    """A real gloo init with GLOO_SOCKET_IFNAME naming no interface: explain names TD460 and the name."""
    pytest.importorskip("torch")
    from torchdoctor.explain import explain

    failed = _gloo_init("tdnope0")
    assert failed.returncode != 0, failed.stdout + failed.stderr
    report = explain(failed.stdout + failed.stderr)
    root = report.root_cause
    assert root is not None and (root.code, root.family) == ("TD460", "dist-connect"), report.codes()
    assert root.values["name"] == "tdnope0" and "GLOO_SOCKET_IFNAME" in root.fix
    fixed = _gloo_init("lo")
    assert fixed.returncode == 0, fixed.stderr


def test_torchrun_sigkill_confirms_host_oom_not_a_hang() -> None:
    """torchrun's '-9' lines (recorded from the lab) read as a host-oom confirmation; TD457 leaves them alone."""
    from torchdoctor.explain import explain

    text = (LOGS / "TD459" / "lab-torchrun-peer-killed.log").read_text(encoding="utf-8").split("# ---\n", 1)[1]
    report = explain(text)
    by_code = {d.code: d for d in report.diagnoses}
    assert "TD457" not in by_code, "exit code -9 is a kill, not a worker's own failure"
    assert by_code["TD459"].family == "host-oom"
    assert by_code["TD459"].values["pid"] in text.split("failed (exitcode: -9)")[1].split("\n")[0]
    # no root cause is invented: the survivor's cascade leads (below a sure answer: it shows where the failure
    # surfaced), the '-9' line confirms host-oom after it
    assert report.root_cause is None
    assert report.diagnoses[0].code == "TD454" and report.diagnoses[0].confidence < 0.8
    assert by_code["TD459"].role == "confirmation"


def test_store_based_barrier_counts_in_every_wording() -> None:
    """torch 1.8-2.0 print `worker_count=`, torch >= 2.1 `num_workers_joined=` and then ` error=...`."""
    old = signature_values("TD462", (LOGS / "TD462" / "ezflow-194-world2-count1.log").read_text(encoding="utf-8"))
    new = signature_values(
        "TD462", (LOGS / "TD462" / "local-store-based-barrier-torch-2.13.log").read_text(encoding="utf-8")
    )
    assert old[0]["count"] == "1" and old[0]["timeout"] == "0:30:00"
    assert new[0]["world"] == "2" and new[0]["count"] == "1" and new[0]["timeout"] == "0:00:01"
