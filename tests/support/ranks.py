"""Run a function on real gloo ranks (over loopback) and collect each rank's JSON result.

The ranks start from multiprocessing's fork server, not from a fork of the test process: a rank forked
from pytest late in a full run inherits its hundreds of MiB, and every rank's memory starts there
(what the memory tests compare). From the fork server each rank is a fresh interpreter with torch.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

JOIN_TIMEOUT = datetime.timedelta(seconds=60)


def _entry(rank: int, world: int, port: int, body: Callable[[int], dict[str, Any]], out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=JOIN_TIMEOUT
    )
    try:
        result = body(rank)
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result), encoding="utf-8")


def run_ranks(world: int, body: Callable[[int], dict[str, Any]], tmp_path: Path) -> list[dict[str, Any]]:
    """``body(rank)`` (a module-level function: it is pickled) on ``world`` real gloo ranks (set
    GLOO_SOCKET_IFNAME=lo); every rank's JSON result."""
    import multiprocessing

    import torch.multiprocessing as mp

    from torchdoctor.facts.dist_env import free_port

    # the fork server imports these once; each rank forks from it with them loaded (no effect once it runs)
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "torchdoctor.ranks.sync", "tests.conftest"])

    mp.start_processes(_entry, args=(world, free_port(), body, str(tmp_path)), nprocs=world, start_method="forkserver")
    return [json.loads((tmp_path / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(world)]
