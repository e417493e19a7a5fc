"""What the ranks' records mean: pure functions, testable on recorded journals and recorded facts.

- :func:`device_of` / :func:`device_findings`: which GPU each rank's ``LOCAL_RANK`` lands on
  (through ``CUDA_VISIBLE_DEVICES`` and the node's NVML facts), and the catalogue's device checks.
- :func:`shared_devices`: two ranks of one host on one GPU (by UUID).
- :func:`digest` / :func:`differences`: software and limits that differ between ranks.
- :func:`rank_states` / :func:`step_rows` / :func:`first_failure`: from every rank's journal, the
  rank x step table and the one failure to look at first (a rank that died or hung before the ranks
  that timed out waiting for it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..catalogue.gpu import _visible
from ..facts import Facts
from ..model import Finding, Severity
from ..options import CheckOptions
from ..registry import Hit, lookup
from ..units import human_bytes

STEPS = ("env", "rendezvous", "init", "barrier", "collectives", "bandwidth", "devices", "consistency")
#: Catalogue checks that judge one rank's device from its node's facts and its environment.
DEVICE_CODES = ("TD303", "TD307", "TD308", "TD309", "TD310")
#: Codes that say "I waited for another rank" (the other rank is the cause): cascades.
WAITING_CODES = frozenset({"TD452", "TD454", "TD455", "TD457", "TD458", "TD462", "TD490", "TD491", "TD492"})
#: Signals our side sends to end ranks (the launcher's shutdown), not faults of the rank.
STOP_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP"})
#: Exit statuses of a rank that recorded such a signal (128 + the signal) or whose watchdog ended it.
STOP_EXITS = frozenset({129, 130, 143})


# -- devices ---------------------------------------------------------------------------------------


def device_of(facts: Facts, local_rank: int | None) -> dict[str, Any]:
    """The device ``cuda:LOCAL_RANK`` names for this process: CPU when it sees no GPU."""
    visible = _visible(facts) if facts.gpu.available else []
    if not visible:
        return {"kind": "cpu", "label": "cpu"}
    ordinal = local_rank or 0
    if ordinal >= len(visible):
        return {"kind": "cuda", "ordinal": ordinal, "uuid": None, "label": f"cuda:{ordinal} (not visible)"}
    dev = visible[ordinal]
    return {
        "kind": "cuda",
        "ordinal": ordinal,
        "index": dev.index,
        "uuid": dev.uuid,
        "name": dev.name,
        "label": f"cuda:{ordinal} = GPU {dev.index} ({dev.name or '?'})",
    }


def device_findings(facts: Facts, nproc_per_node: int | None = None) -> list[Finding]:
    """The catalogue's device checks (exclusive GPUs held by others, CUDA_VISIBLE_DEVICES, local rank) on one rank."""
    from ..checks import run_checks

    opts = CheckOptions(dist=True, nproc_per_node=nproc_per_node)
    return run_checks(facts, opts, codes=[lookup(c) for c in DEVICE_CODES])


def shared_devices(devices: Mapping[int, Mapping[str, Any]]) -> list[Finding]:
    """TD488 for every GPU (host, UUID) that more than one rank would use."""
    by_gpu: dict[tuple[str, str], list[int]] = {}
    for rank, dev in sorted(devices.items()):
        if dev.get("kind") == "cuda" and dev.get("uuid"):
            by_gpu.setdefault((str(dev.get("host")), str(dev["uuid"])), []).append(rank)
    out = []
    code = lookup("TD488")
    for (host, uuid), ranks in sorted(by_gpu.items()):
        if len(ranks) < 2:
            continue
        label = devices[ranks[0]].get("label", uuid)
        finding = code.finding(Hit({"duplicate": f"ranks {', '.join(map(str, ranks))} on {host} all use {label}"}))
        out.append(replace(finding, message=f"ranks {_join(ranks)} on {host} would all use {label} (GPU {uuid})."))
    return out


# -- consistency -----------------------------------------------------------------------------------

#: Compared across ranks: software must match (error), limits should (warning).
VERSION_KEYS = ("torch", "cuda", "nccl", "python")
LIMIT_KEYS = ("nofile", "max_map_count", "shm_bytes")


def digest(facts: Facts, nccl: str | None = None) -> dict[str, Any]:
    """What is compared across ranks, from this rank's facts."""
    return {
        "host": facts.host.hostname,
        "torch": facts.torch.version,
        "cuda": facts.torch.cuda,
        "nccl": nccl,
        "python": facts.host.python.version,
        "nofile": facts.limits.rlimits.nofile.soft,
        "max_map_count": facts.limits.sysctl.vm.max_map_count,
        "shm_bytes": facts.shm.size_bytes,
    }


@dataclass(frozen=True)
class Difference:
    key: str
    severity: Severity
    values: dict[str, list[int]]
    """Each value seen (as text) and the ranks that have it."""
    hosts: dict[str, list[str]]

    def odd_ranks(self, reference_rank: int = 0) -> list[int]:
        """The ranks whose value is not the reference rank's (rank 0's), or the minority's."""
        ref = next((v for v, ranks in self.values.items() if reference_rank in ranks), None)
        if ref is None:
            ref = max(self.values, key=lambda v: len(self.values[v]))
        return sorted(r for v, ranks in self.values.items() if v != ref for r in ranks)

    def finding(self) -> Finding:
        values = "; ".join(
            f"{v} on rank(s) {_join(ranks)} ({', '.join(sorted(set(self.hosts[v])))})"
            for v, ranks in self.values.items()
        )
        ref = next((v for v, ranks in self.values.items() if 0 in ranks), next(iter(self.values)))
        odd_hosts = sorted({h for v, hs in self.hosts.items() if v != ref for h in hs})
        return lookup("TD468").finding(
            Hit(
                {
                    "what": _LABELS.get(self.key, self.key),
                    "values": values,
                    "reference": ref,
                    "hosts": ", ".join(odd_hosts),
                },
                severity=self.severity,
            )
        )


_LABELS = {
    "torch": "torch version",
    "cuda": "CUDA version of torch",
    "nccl": "NCCL version",
    "python": "Python version",
    "nofile": "open-file limit (ulimit -n)",
    "max_map_count": "vm.max_map_count",
    "shm_bytes": "/dev/shm size",
}


def differences(digests: Mapping[int, Mapping[str, Any]]) -> list[Difference]:
    out = []
    for key in VERSION_KEYS + LIMIT_KEYS:
        values: dict[str, list[int]] = {}
        hosts: dict[str, list[str]] = {}
        for rank, d in sorted(digests.items()):
            raw = d.get(key)
            text = human_bytes(raw) if key == "shm_bytes" and isinstance(raw, int) else str(raw)
            values.setdefault(text, []).append(rank)
            hosts.setdefault(text, []).append(str(d.get("host")))
        if len(values) > 1:
            sev = Severity.ERROR if key in VERSION_KEYS else Severity.WARNING
            out.append(Difference(key, sev, values, hosts))
    return out


# -- journals --------------------------------------------------------------------------------------


@dataclass
class RankState:
    """One rank as its journal (and the launcher) left it."""

    rank: int | None
    host: str | None = None
    pid: int | None = None
    local_rank: int | None = None
    node_rank: int | None = None
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    running: str | None = None
    running_since: float | None = None
    stopped: bool = False
    ended: bool = False
    exit: dict[str, Any] | None = None
    """What the launcher saw: ``{"exitcode", "signal"}`` when the rank failed."""
    overdue: bool = False
    """The launcher gave up waiting for its running step (it hung where its own watchdog could not act)."""
    notes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """What a step found out before it ended (the rendezvous' TCP connect result), by step."""
    missed: set[str] = field(default_factory=set)
    """Steps where another rank waited for this one in vain (it never arrived)."""
    last: dict[str, Any] | None = None

    @property
    def last_step(self) -> str | None:
        """The step it was in, or the last one it finished."""
        if self.running:
            return self.running
        done = [s for s in STEPS if s in self.steps]
        return done[-1] if done else None

    def died(self) -> bool:
        """Ended by a fault of its own while in a step (a signal we did not send, or an exit without a result)."""
        if not self.running or self.exit is None or self.stopped:
            return False
        if self.exit.get("exitcode") in STOP_EXITS:
            return False
        return self.exit.get("signal") not in STOP_SIGNALS


def rank_states(records: Mapping[int | None, Iterable[Mapping[str, Any]]]) -> dict[int | None, RankState]:
    out: dict[int | None, RankState] = {}
    for rank, recs in records.items():
        st = RankState(rank=rank)
        for rec in recs:
            _apply(st, rec)
        out[rank] = st
    for st in list(out.values()):
        for step, rec in st.steps.items():
            for r in (rec.get("details") or {}).get("missing_ranks") or []:
                if isinstance(r, int) and r in out and step not in out[r].steps:
                    out[r].missed.add(step)
    return out


def _apply(st: RankState, rec: Mapping[str, Any]) -> None:
    event = rec.get("event")
    st.last = dict(rec)
    if event == "hello":
        st.host, st.pid = rec.get("host"), rec.get("pid")
        st.local_rank, st.node_rank = rec.get("local_rank"), rec.get("node_rank")
        if isinstance(rec.get("rank"), int):
            st.rank = rec["rank"]
    elif event == "step" and rec.get("status") == "running":
        st.running, st.running_since = rec.get("step"), rec.get("t")
    elif event == "step":
        st.steps[str(rec.get("step"))] = dict(rec)
        if st.running == rec.get("step"):
            st.running = None
    elif event == "note":
        st.notes.setdefault(str(rec.get("step")), {}).update(
            {k: v for k, v in rec.items() if k not in ("event", "step")}
        )
    elif event == "stopped":
        st.stopped = True
    elif event == "end":
        st.ended = True


def status_of(st: RankState, step: str) -> tuple[str, float | None]:
    rec = st.steps.get(step)
    if rec is not None:
        return str(rec.get("status")), rec.get("seconds")
    if st.running == step:
        if st.died():  # the launcher saw it end by a fault of its own: that, even if others missed it
            return "died", None
        if st.overdue or step in st.missed:
            return "timeout", None
        return "stopped", None
    return "not run", None


def step_rows(states: Mapping[int | None, RankState]) -> list[dict[str, Any]]:
    rows = []
    for step in STEPS:
        for rank in sorted(states, key=_rank_key):
            st = states[rank]
            status, seconds = status_of(st, step)
            rows.append({"name": step, "rank": st.rank, "host": st.host, "status": status, "seconds": seconds})
    return rows


def first_failure(states: Mapping[int | None, RankState], backend: str = "gloo") -> dict[str, Any] | None:
    """The failure to look at first: a rank that died, then one that hung, then one that failed by
    itself, then one that failed waiting for others; the earliest step first, then the lowest rank."""
    named = _named_missing(states)
    candidates: list[tuple[tuple[int, int, int], dict[str, Any]]] = []
    for st in states.values():
        for step in STEPS:
            status, seconds = status_of(st, step)
            if status in ("ok", "skipped", "not run", "stopped") and not (status == "stopped" and st.rank in named):
                continue
            rec = st.steps.get(step, {})
            code = rec.get("code")
            if status == "died":
                kind, prio = "died", 0
            elif status in ("timeout", "stopped"):
                kind, prio = "hung", 1
            elif code in WAITING_CODES:
                kind, prio = "waited", 3
            else:
                kind, prio = "failed", 2
            sources = [r for r in (rec.get("details") or {}).get("wrong_sources") or [] if isinstance(r, int)]
            source = states.get(min(sources)) if sources else None
            if source is not None and source is not st:
                continue  # the rank whose data arrived wrong reports it too (its own all_gather)
            key = (prio, STEPS.index(step), _rank_key(st.rank))
            waiters = _waiters(states, st.rank, step) if kind == "hung" else []
            candidates.append((key, _failure(st, step, kind, rec, backend, waited_by=min(waiters, default=None))))
            break
    if not candidates:
        return None
    candidates.sort(key=lambda c: c[0])
    best = candidates[0][1]
    if best["kind"] == "waited" and named:
        # every failure is a wait; the waiting rank named who it waited for
        rank = min(named)
        st = states.get(rank) or RankState(rank=rank)
        return _failure(st, best["step"], "hung", {}, backend, waited_by=best["rank"])
    return best


def reach_text(reach: str | None, where: str) -> str:
    """What one TCP connect to the store's address said, in words."""
    return {
        "refused": f"connection refused: nothing listens at {where} (rank 0 or its launcher is not up)",
        "timeout": f"no answer from {where} (a firewall drops the packets, or the address is wrong)",
        "open": f"{where} accepts connections but the store never answered (another service on that port?)",
    }.get(str(reach), f"{where}: {reach}" if reach else f"no store reached at {where}")


def _waiters(states: Mapping[int | None, RankState], rank: int | None, step: str) -> list[int]:
    """The ranks whose wait at ``step`` failed because ``rank`` never arrived."""
    out = []
    for st in states.values():
        rec = st.steps.get(step) or {}
        if rank in ((rec.get("details") or {}).get("missing_ranks") or []) and st.rank is not None:
            out.append(st.rank)
    return sorted(out)


def _named_missing(states: Mapping[int | None, RankState]) -> set[int]:
    """Ranks another rank's record names as missing (monitored_barrier, the store's join count)."""
    out: set[int] = set()
    for st in states.values():
        for rec in st.steps.values():
            for r in (rec.get("details") or {}).get("missing_ranks") or []:
                if isinstance(r, int):
                    out.add(r)
    return out


def _failure(
    st: RankState, step: str, kind: str, rec: Mapping[str, Any], backend: str, waited_by: int | None = None
) -> dict[str, Any]:
    code = rec.get("code")
    message = rec.get("message") or ""
    if kind == "died":
        ex = st.exit or {}
        how = f"killed by {ex['signal']}" if ex.get("signal") else f"exited with code {ex.get('exitcode')}"
        message = f"rank {st.rank} ({how}) died during step {step}"
        code = ex.get("code") or "TD457"
    elif kind == "hung":
        message = f"rank {st.rank} did not finish step {step} within its deadline"
        if waited_by is not None:
            message = f"rank {st.rank} never arrived at step {step}; rank {waited_by} waited for it until its deadline"
        code = "TD452" if step in ("rendezvous", "init") else ("TD490" if backend == "nccl" else "TD455")
        master = ((st.steps.get("env") or {}).get("details") or {}).get("master")
        if step == "rendezvous" and st.rank not in (0, None):
            code = "TD453"  # a client that never got through to the store
            why = reach_text((st.notes.get("rendezvous") or {}).get("connect"), master or "MASTER_ADDR:MASTER_PORT")
            message = f"rank {st.rank} could not join the rendezvous within its deadline: {why}"
    info = lookup(code) if code else None
    return {
        "step": step,
        "rank": st.rank,
        "host": st.host,
        "pid": st.pid,
        "kind": kind,
        "code": info.code if info else None,
        "family": info.family if info else None,
        "message": message,
        "fix": rec.get("fix") or (info.plain_fix if info else ""),
        "title": info.title if info else "",
    }


def _rank_key(rank: int | None) -> int:
    return -1 if rank is None else rank


def _join(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks))
