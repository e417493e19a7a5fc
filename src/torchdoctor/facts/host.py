"""Host facts: OS, Python, container runtime, and the (redacted) environment."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

from .context import GatherContext
from .redact import redact_env


def default_start_method(version: tuple[int, int], system: str = "Linux") -> str:
    """multiprocessing's default start method for a Python version on a platform."""
    if system == "Linux":
        return "forkserver" if version >= (3, 14) else "fork"
    return "spawn"  # macOS (since 3.8) and Windows


def detect_container(ctx: GatherContext) -> dict[str, Any]:
    signs: list[str] = []
    kind = None
    if ctx.path("/.dockerenv").exists():
        signs.append("/.dockerenv exists")
        kind = "docker"
    if ctx.path("/run/.containerenv").exists():
        signs.append("/run/.containerenv exists")
        kind = kind or "podman"
    if ctx.env.get("KUBERNETES_SERVICE_HOST"):
        signs.append("KUBERNETES_SERVICE_HOST is set")
        kind = "kubernetes"
    cgroup = ctx.read_text("/proc/1/cgroup") or ""
    for marker, name in (
        ("kubepods", "kubernetes"),
        ("docker", "docker"),
        ("containerd", "containerd"),
        ("lxc", "lxc"),
    ):
        if marker in cgroup:
            signs.append(f"/proc/1/cgroup mentions {marker}")
            kind = kind or name
            break
    env_container = ctx.env.get("container")
    if env_container:
        signs.append(f"container={env_container}")
        kind = kind or env_container
    return {"in_container": bool(signs), "kind": kind, "signs": signs}


def gather(ctx: GatherContext) -> dict[str, Any]:
    uname = platform.uname()
    return {
        "hostname": uname.node,
        "system": uname.system,
        "kernel": uname.release,
        "machine": uname.machine,
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
            "default_start_method": default_start_method(sys.version_info[:2], uname.system),
        },
        "pid": os.getpid(),
        "uid": os.getuid() if hasattr(os, "getuid") else None,
        "container": detect_container(ctx),
        "env": redact_env(ctx.env, gpu_ids=not ctx.show_uuids),
    }
