"""Which preflight saw a scenario's failure coming: ``check`` (or ``dist``) run before the scenario,
under the scenario's own conditions (its lowered rlimits, its private /dev/shm, its environment,
the loader settings it uses), as a user would run it before the job.

A scenario declares how (:class:`Prediction`, its ``predict`` field); :func:`predicted` runs it and
returns ``{"by", "code", "family", "severity"}`` for the first finding of the scenario's family, or
None when the preflight named nothing of that family. Scenarios whose failure is made at run time
(a peer killed mid-collective, a port taken by the body itself, a directory made read-only by it)
declare none: no preflight could see them.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import Scenario

FREE_PORT = "{free_port}"
_DIST_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID")


@dataclass(frozen=True)
class Prediction:
    by: str
    """``check`` or ``dist``."""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    """Distributed variables for the preflight (others are removed); ``{free_port}`` becomes a free port."""
    rlimits: tuple[tuple[str, int], ...] = ()
    """``("NOFILE", 256)``: soft limits set in the preflight's process, as the scenario sets them."""
    shm_size: str | None = None
    """Run the preflight in a private tmpfs of this size over /dev/shm (root and unshare), as the scenario."""

    def __post_init__(self) -> None:
        if self.by not in ("check", "dist"):
            raise ValueError(f"Prediction.by={self.by!r}: check or dist")
        for name, _ in self.rlimits:
            if not hasattr(resource, f"RLIMIT_{name}"):
                raise ValueError(f"unknown rlimit {name}")


def _env(p: Prediction) -> dict[str, str]:
    from ..facts.dist_env import free_port
    from ..supervise import child_env

    env = {k: v for k, v in child_env().items() if k not in _DIST_VARS}
    for key, value in p.env:
        env[key] = str(free_port()) if value == FREE_PORT else value
    return env


def _limits(p: Prediction) -> None:
    for name, soft in p.rlimits:
        which = getattr(resource, f"RLIMIT_{name}")
        _, hard = resource.getrlimit(which)
        resource.setrlimit(which, (soft, hard if hard == resource.RLIM_INFINITY or hard >= soft else soft))


def predicted(s: Scenario, timeout: float = 120.0) -> dict[str, Any] | None:
    """Run the scenario's preflight; its first finding of the scenario's family, or None."""
    p = s.predict
    if p is None:
        return None
    argv = [sys.executable, "-m", "torchdoctor", p.by, "--format", "json", *p.args]
    if p.shm_size:
        if os.geteuid() != 0:
            return None
        script = 'mount -t tmpfs -o size="$0",mode=1777 tmpfs /dev/shm && exec "$@"'
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, p.shm_size, *argv]
    proc = subprocess.run(  # noqa: S603 - our own module, an argv list
        argv,
        env=_env(p),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=(lambda: _limits(p)) if p.rlimits else None,  # noqa: PLW1509 - setrlimit only
        check=False,
    )
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        return None
    if p.by == "dist":
        ff = data.get("first_failure") or {}
        if ff.get("family") == s.family:
            return {"by": "dist", "code": ff.get("code"), "family": ff.get("family"), "severity": "error"}
        return None
    for f in data.get("findings", []):
        if f.get("family") == s.family and f.get("severity") in ("warning", "error"):
            return {"by": "check", "code": f["code"], "family": f["family"], "severity": f["severity"]}
    return None
