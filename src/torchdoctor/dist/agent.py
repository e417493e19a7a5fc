"""The launcher agent, in a child of ``torchdoctor dist``: torch's own ``elastic_launch`` (torchrun's
machinery) starting ``python -m torchdoctor.dist`` ranks, with no restarts and a rendezvous that
gives up after the step deadline. Writes what it saw to ``agent.json``:
``{"state": "succeeded"|"failed"|"error", "failures": {rank: {...}}, "error": {...}}``.

Run as ``python -m torchdoctor.dist.agent CONFIG.json``; never imported by the CLI.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _failures(exc: Any) -> dict[str, Any]:
    out = {}
    for rank, f in exc.failures.items():
        signal_name = None
        if f.exitcode is not None and f.exitcode < 0:
            try:
                signal_name = f.signal_name()
            except Exception:  # noqa: BLE001 - an unknown signal number
                signal_name = f"signal {-f.exitcode}"
        out[str(rank)] = {
            "local_rank": f.local_rank,
            "pid": f.pid,
            "exitcode": f.exitcode,
            "signal": signal_name,
            "timestamp": f.timestamp,
        }
    return out


def main(path: str) -> int:
    with open(path, encoding="utf-8") as fh:
        cfg = json.load(fh)
    result: dict[str, Any] = {"state": None}
    try:
        from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import LaunchConfig, elastic_launch

        config = LaunchConfig(
            min_nodes=cfg["nnodes"],
            max_nodes=cfg["nnodes"],
            nproc_per_node=cfg["nproc"],
            run_id=cfg["run_id"],
            rdzv_endpoint=cfg["endpoint"],
            rdzv_backend="c10d",
            rdzv_configs={"join_timeout": cfg["join_timeout"], "is_host": cfg["is_host"]},
            rdzv_timeout=int(cfg["join_timeout"]),
            max_restarts=0,
            monitor_interval=0.05,
            start_method="spawn",
            logs_specs=DefaultLogsSpecs(log_dir=cfg["log_dir"], redirects=Std.ALL),
        )
        try:
            elastic_launch(config, sys.executable)("-m", "torchdoctor.dist")
            result["state"] = "succeeded"
        except ChildFailedError as exc:
            result.update(state="failed", failures=_failures(exc))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which explains it
        result.update(state="error", error={"type": type(exc).__name__, "message": str(exc)[:4000]})
    tmp = cfg["out"] + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    os.replace(tmp, cfg["out"])
    return 0 if result["state"] == "succeeded" else 1


if __name__ == "__main__":
    status = main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # the ranks are gone; skip the seconds torch's rendezvous teardown takes at exit
