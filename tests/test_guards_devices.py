"""select_device on the recorded 8-GPU node (busy exclusive GPU, full GPUs, another rank's GPU, hidden
GPUs) and live on this GPU-less machine; limit_gpu_memory's checks; init_distributed on real gloo
process groups: a missing variable and a taken port fail in seconds with their codes, a rank without
its master is explained, two ranks start and all_reduce."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from torchdoctor.guards.devices import DeviceError, choose_device, limit_gpu_memory, select_device

from .conftest import REPO
from .support.gpu import rank_facts

GiB = 1024**3
ALL4 = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}


def test_the_local_ranks_own_gpu_comes_first() -> None:
    choice = choose_device(rank_facts({**ALL4, "LOCAL_RANK": "1"}), 1)
    assert (choice.device, choice.physical_index, choice.skipped) == ("cuda:1", 1, [])
    assert "the GPU of local rank 1" in choice.explain()


def test_an_exclusive_gpu_held_by_another_process_is_skipped() -> None:
    choice = choose_device(rank_facts(ALL4, exclusive={1: 4242}), 1)
    assert choice.device == "cuda:2"
    assert [(s["code"], "4242" in s["why"]) for s in choice.skipped] == [("TD303", True)]
    assert "skipped cuda:1 (GPU 1" in choice.explain()


def test_full_gpus_raise_with_the_code_unless_cpu_is_allowed() -> None:
    facts = rank_facts(ALL4)  # recorded: 0.4-3.1 GB free on each of the four
    with pytest.raises(DeviceError) as err:
        choose_device(facts, 0, min_free_bytes=4 * GiB)
    assert err.value.code == "TD305" and len(err.value.skipped) == 4 and "4 GiB needed" in str(err.value)
    assert "Fix:" in str(err.value)
    cpu = choose_device(facts, 0, min_free_bytes=4 * GiB, allow_cpu=True)
    assert cpu.device == "cpu" and len(cpu.skipped) == 4
    roomy = choose_device(facts, 0, min_free_bytes=2 * GiB)
    assert roomy.device == "cuda:1" and roomy.skipped[0]["code"] == "TD305"


def test_a_gpu_another_rank_of_the_job_uses_is_skipped() -> None:
    facts = rank_facts(ALL4, processes={0: [{"pid": 5001, "name": "python", "type": "C"}]})
    choice = choose_device(facts, 0, job_pids={5001})
    assert choice.device == "cuda:1" and choice.skipped[0]["code"] == "TD488"
    assert choose_device(facts, 0).device == "cuda:0"  # the same process, not of this job: shared is allowed


def test_visible_devices_narrow_and_renumber() -> None:
    choice = choose_device(rank_facts({"CUDA_VISIBLE_DEVICES": "2,3", "LOCAL_RANK": "1"}), 1)
    assert (choice.device, choice.physical_index) == ("cuda:1", 3)
    with pytest.raises(DeviceError) as err:
        choose_device(rank_facts({"CUDA_VISIBLE_DEVICES": ""}), 0)
    assert err.value.code == "TD308"


def test_live_on_a_machine_without_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LOCAL_RANK", "RANK", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(DeviceError) as err:
        select_device()
    assert err.value.code == "TD301" and err.value.family == "gpu-unavailable"
    t0 = time.monotonic()
    with pytest.raises(DeviceError):
        select_device(wait=0.4, poll=0.1)
    assert 0.3 < time.monotonic() - t0 < 5
    assert select_device(allow_cpu=True).device == "cpu"
    with pytest.raises(ValueError):
        select_device(min_free_bytes=-1)


def test_limit_gpu_memory_checks_its_argument() -> None:
    with pytest.raises(TypeError):
        limit_gpu_memory("0.5")  # type: ignore[arg-type]
    for bad in (0, 1.5, -0.1):
        with pytest.raises(ValueError, match=r"\(0, 1\]"):
            limit_gpu_memory(bad)
    with pytest.raises(DeviceError) as err:
        limit_gpu_memory(0.5)
    assert err.value.code == "TD301"


# -- init_distributed on real process groups --------------------------------------------------------

SCRIPT = """
import sys, time
sys.path.insert(0, {src!r})
import torchdoctor
t0 = time.monotonic()
try:
    info = torchdoctor.init_distributed(timeout=float(sys.argv[1]))
except torchdoctor.DistInitError as exc:
    print(f"CODE={{exc.code}} FAMILY={{exc.family}} SECONDS={{time.monotonic() - t0:.1f}}")
    print(exc)
    sys.exit(3)
import torch, torch.distributed as dist
t = torch.ones(2) * (info.rank + 1)
dist.all_reduce(t)
print(f"rank {{info.rank}}/{{info.world_size}} {{info.backend}} {{info.device}} all_reduce={{t.tolist()}}")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_rank(tmp_path: Path, env: dict[str, str], timeout: str = "20") -> subprocess.Popen[str]:
    script = tmp_path / "init.py"
    script.write_text(textwrap.dedent(SCRIPT.format(src=str(REPO / "src"))))
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return subprocess.Popen(
        [sys.executable, str(script), timeout],
        env={**base, "GLOO_SOCKET_IFNAME": "lo", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_ranks_start_and_all_reduce(tmp_path: Path) -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    procs = [run_rank(tmp_path, {**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
        assert "gloo cpu all_reduce=[3.0, 3.0]" in out


def test_a_missing_variable_fails_in_seconds_with_its_code(tmp_path: Path) -> None:
    p = run_rank(tmp_path, {"RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 3
    assert "CODE=TD401 FAMILY=dist-env" in out and "WORLD_SIZE" in out
    assert float(out.split("SECONDS=")[1].split()[0]) < 5


def test_a_taken_port_fails_in_seconds_with_its_code(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, "
            "socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', 0)); s.listen(1); print(s.getsockname()[1], flush=True); "
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        port = holder.stdout.readline().strip()
        p = run_rank(tmp_path, {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
        out, _ = p.communicate(timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert p.returncode == 3
    assert "CODE=TD407 FAMILY=dist-port" in out and f"pid {holder.pid}" in out
    assert float(out.split("SECONDS=")[1].split()[0]) < 5


def test_a_rank_without_its_master_is_explained_not_hung(tmp_path: Path) -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    p = run_rank(tmp_path, env, timeout="3")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 3, err[-1000:]
    assert "FAMILY=dist-connect" in out
    assert float(out.split("SECONDS=")[1].split()[0]) < 30
