"""The recorded 8-GPU Slurm node (tests/fixtures/facts/slurm-4gpu-node.json) as one rank sees it."""

from __future__ import annotations

import copy
import json
from typing import Any

from torchdoctor.facts import Facts
from torchdoctor.facts.gpu import resolve_visible

from . import FIXTURES

NODE = FIXTURES / "facts" / "slurm-4gpu-node.json"


def rank_facts(
    env: dict[str, str],
    *,
    exclusive: dict[int, int] | None = None,
    processes: dict[int, list[dict[str, Any]]] | None = None,
    free: dict[int, int] | None = None,
) -> Facts:
    """The node with this rank's environment (CUDA_VISIBLE_DEVICES resolved anew). ``exclusive``: GPU
    index -> a foreign pid, in Exclusive_Process mode; ``processes``: GPU index -> its process list;
    ``free``: GPU index -> free bytes."""
    data = copy.deepcopy(json.loads(NODE.read_text()))
    data["host"]["env"].update(env)
    for dev in data["gpu"]["devices"]:
        i = dev["index"]
        if exclusive and i in exclusive:
            dev["compute_mode"] = "Exclusive_Process"
            dev["processes"] = [{"pid": exclusive[i], "name": "other_job", "type": "C"}]
        if processes and i in processes:
            dev["processes"] = processes[i]
        if free and i in free:
            dev["memory"]["free_bytes"] = free[i]
    data["gpu"]["visible"] = resolve_visible(data["host"]["env"].get("CUDA_VISIBLE_DEVICES"), data["gpu"]["devices"])
    return Facts(data)
