"""Wall time of ``torchdoctor dist`` against the floor: a bare torchrun running one all_reduce.

Both start 2 ranks (gloo, loopback) on this machine, through torch's elastic launcher; the floor
does nothing but ``init_process_group`` + one ``all_reduce`` + ``destroy_process_group``. Runs are
interleaved; medians are printed with the ratio, and dist's per-step times (median over its runs).

    python benchmarks/dist_smoke.py [--runs 5] [--nproc 2]

Target (issue 12): a healthy 2-rank gloo run finishes in under 5 s plus torch's import time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOOR = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
dist.destroy_process_group()
"""
ENV = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
for _name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
    ENV.pop(_name, None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def floor(script: Path, nproc: int) -> float:
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", f"--nproc-per-node={nproc}"]
    argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", str(script)]
    t0 = time.perf_counter()
    subprocess.run(argv, env=ENV, check=True, capture_output=True)
    return time.perf_counter() - t0


def dist(nproc: int) -> tuple[float, dict[str, float]]:
    argv = [sys.executable, "-m", "torchdoctor", "dist", "--nproc", str(nproc), "--format", "json"]
    t0 = time.perf_counter()
    out = subprocess.run(argv, env=ENV, check=True, capture_output=True, text=True).stdout
    took = time.perf_counter() - t0
    data = json.loads(out)
    steps: dict[str, float] = {}
    for row in data["steps"]:
        steps[row["name"]] = max(steps.get(row["name"], 0.0), row["seconds"] or 0.0)
    return took, steps


def torch_import() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch.distributed"], check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--nproc", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "floor.py"
        script.write_text(FLOOR)
        floors, dists, steps = [], [], []
        imports = [torch_import() for _ in range(3)]
        for _ in range(args.runs):
            floors.append(floor(script, args.nproc))
            took, per_step = dist(args.nproc)
            dists.append(took)
            steps.append(per_step)
    f, d, imp = statistics.median(floors), statistics.median(dists), statistics.median(imports)
    print(f"machine: {os.cpu_count()} CPUs; {args.runs} interleaved runs each, {args.nproc} ranks, gloo on loopback")
    print(f"import torch.distributed (one process): {imp:.2f} s")
    print(f"floor  torchrun + one all_reduce:       {f:.2f} s (median; min {min(floors):.2f})")
    print(f"torchdoctor dist (8 steps, 4 sizes):    {d:.2f} s (median; min {min(dists):.2f})")
    print(f"ratio dist / floor:                     {d / f:.2f}x")
    print(
        f"dist minus torch import:                {d - imp:.2f} s  (target < 5 s: {'PASS' if d - imp < 5 else 'FAIL'})"
    )
    print("per step (slowest rank, median over runs):")
    for name in steps[0]:
        print(f"  {name:<12} {statistics.median(s[name] for s in steps):.3f} s")


if __name__ == "__main__":
    main()
