"""Warnings from samples: pure functions of what was sampled, so recorded timelines replay exactly.

For each resource of each process (or of the host), the last :data:`WINDOW` seconds of values give
a rate (least squares). A warning is printed once per process and resource, when the value is
within :data:`NEAR` of its limit, or when it rises fast enough to reach the limit within
:data:`HORIZON` seconds while already past :data:`FLOOR` of it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..registry import lookup
from ..units import human_bytes

#: Seconds of history the rate is fitted on.
WINDOW = 10.0
#: Warn when the limit is projected within this many seconds...
HORIZON = 30.0
#: ...and the value is already past this fraction of it (a slow start is not yet a trend).
FLOOR = 0.25
#: Warn in any case past this fraction of the limit.
NEAR = 0.90
#: Points needed for a rate.
MIN_POINTS = 3


@dataclass(frozen=True)
class Resource:
    key: str
    what: str
    code: str
    bytes: bool = False


RESOURCES = {
    "maps": Resource("maps", "memory maps", "TD155"),
    "fds": Resource("fds", "open files", "TD153"),
    "tasks": Resource("tasks", "tasks (processes and threads) against RLIMIT_NPROC", "TD280"),
    "address_space": Resource("address_space", "address space (RLIMIT_AS)", "TD270", bytes=True),
    "shm": Resource("shm", "/dev/shm used", "TD156", bytes=True),
    "cgroup_memory": Resource("cgroup_memory", "cgroup memory", "TD202", bytes=True),
    "host_memory": Resource("host_memory", "host memory in use", "TD276", bytes=True),
}


@dataclass(frozen=True)
class Warning:
    t: float
    pid: int | None
    process: str
    code: str
    family: str
    resource: str
    value: int
    limit: int
    rate: float | None
    projected_seconds: float | None
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "t": self.t,
            "pid": self.pid,
            "process": self.process,
            "code": self.code,
            "family": self.family,
            "resource": self.resource,
            "value": self.value,
            "limit": self.limit,
            "rate": None if self.rate is None else round(self.rate, 3),
            "projected_seconds": None if self.projected_seconds is None else round(self.projected_seconds, 1),
            "message": self.message,
        }


def rate(points: deque[tuple[float, float]]) -> float | None:
    """Least-squares slope of (t, value), per second; None with too few points or no time span."""
    if len(points) < MIN_POINTS:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var <= 0:
        return None
    return sum((t - mt) * (v - mv) for t, v in points) / var


@dataclass
class Warner:
    horizon: float = HORIZON
    near: float = NEAR
    floor: float = FLOOR
    window: float = WINDOW
    history: dict[tuple[Any, str], deque[tuple[float, float]]] = field(default_factory=dict)
    warned: set[tuple[Any, str]] = field(default_factory=set)

    def feed(self, sample: dict[str, Any], limits: dict[str, Any]) -> list[Warning]:
        """Warnings the sample raises (each process and resource warns at most once)."""
        return [w for w in self._check(sample, limits) if w is not None]

    def _check(self, sample: dict[str, Any], limits: dict[str, Any]) -> Iterator[Warning | None]:
        t = float(sample["t"])
        for p in sample.get("processes", []):
            ident = (p["pid"], p.get("name"))
            yield self._one(
                t, ident, p["pid"], p.get("name") or "?", "maps", p.get("maps"), limits.get("max_map_count")
            )
            yield self._one(t, ident, p["pid"], p.get("name") or "?", "fds", p.get("fds"), p.get("nofile"))
            yield self._one(
                t, ident, p["pid"], p.get("name") or "?", "address_space", p.get("vsize"), p.get("as_limit")
            )
        yield from self._tasks(t, sample.get("processes", []))
        host = (None, "host")
        shm_limit = sample.get("shm_size") or limits.get("shm_bytes")  # the job's /dev/shm, which may change
        yield self._one(t, host, None, "/dev/shm", "shm", sample.get("shm_used"), shm_limit)
        yield self._one(
            t,
            host,
            None,
            "the job's cgroup",
            "cgroup_memory",
            sample.get("cgroup_memory"),
            limits.get("cgroup_memory_bytes"),
        )
        total, avail = limits.get("mem_total_bytes"), sample.get("mem_available")
        used = total - avail if isinstance(total, int) and isinstance(avail, int) else None
        if not limits.get("cgroup_memory_bytes"):
            yield self._one(t, host, None, "this host", "host_memory", used, total)

    def _tasks(self, t: float, procs: list[dict[str, Any]]) -> Iterator[Warning | None]:
        """RLIMIT_NPROC counts every task of a user: the job's threads per uid (root is exempt)."""
        by_uid: dict[int, list[dict[str, Any]]] = {}
        for p in procs:
            if isinstance(p.get("uid"), int) and p["uid"] != 0 and isinstance(p.get("threads"), int):
                by_uid.setdefault(p["uid"], []).append(p)
        for uid, group in by_uid.items():
            limits = [p["nproc"] for p in group if isinstance(p.get("nproc"), int)]
            if not limits:
                continue
            total = sum(p["threads"] for p in group)
            biggest = max(group, key=lambda p: p["threads"])
            yield self._one(
                t, ("uid", uid), biggest["pid"], f"uid {uid}, {len(group)} process(es)", "tasks", total, min(limits)
            )

    def _one(
        self, t: float, ident: Any, pid: int | None, label: str, key: str, value: Any, limit: Any
    ) -> Warning | None:
        if not isinstance(value, int) or not isinstance(limit, int) or limit <= 0:
            return None
        hist = self.history.setdefault((ident, key), deque())
        hist.append((t, float(value)))
        while hist and t - hist[0][0] > self.window:
            hist.popleft()
        if (ident, key) in self.warned:
            return None
        r = rate(hist)
        projected = (limit - value) / r if r is not None and r > 0 else None
        soon = projected is not None and projected < self.horizon and value >= self.floor * limit
        if value < self.near * limit and not soon:
            return None
        self.warned.add((ident, key))
        res = RESOURCES[key]
        code = lookup(res.code)
        return Warning(
            t=t,
            pid=pid,
            process=label,
            code=code.code,
            family=code.family,
            resource=key,
            value=value,
            limit=limit,
            rate=r,
            projected_seconds=max(projected, 0.0) if projected is not None else None,
            message=_message(pid, label, res, value, limit, r, projected, code.code, code.name),
        )


def _fmt(res: Resource, n: float) -> str:
    return human_bytes(int(n)) if res.bytes else f"{int(n):,}"


def _message(
    pid: int | None,
    label: str,
    res: Resource,
    value: int,
    limit: int,
    r: float | None,
    projected: float | None,
    code: str,
    name: str,
) -> str:
    who = f"pid {pid} ({label})" if pid is not None else label
    parts = [f"{who}: {_fmt(res, value)}/{_fmt(res, limit)} {res.what}"]
    if r is not None and r > 0:
        parts.append(f"+{_fmt(res, r)}/s")
    if projected is not None and r is not None and r > 0:
        parts.append(f"limit in ~{max(projected, 0):.0f} s")
    else:
        parts.append(f"{value / limit:.0%} of the limit")
    return ", ".join(parts) + f": {code} {name}"
