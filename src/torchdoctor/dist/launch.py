"""``torchdoctor dist --nproc N``: start the ranks with torch's elastic launcher and watch them.

The launcher agent (:mod:`.agent`, torch's ``elastic_launch``: what torchrun runs) lives in a child
of ours, in a session of its own, under :func:`torchdoctor.supervise.supervise`. Each rank writes
its journal (:mod:`.journal`) into a directory of this run; this process reads the journals as they
grow, and when a rank's step outlives its deadline plus :data:`MARGIN` (a hang the rank's own
watchdog could not end, e.g. a stopped process) it ends that rank and the agent, by PID and by
session. Nothing is left running, whatever ends this process (the supervisor reaps on any exit).
"""

from __future__ import annotations

import json
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..facts.dist_env import free_port
from ..supervise import Limits, child_env, reap_session, start, supervise
from .journal import DIR_VAR, journals, rank_of, read_records
from .probe import CONFIG_VAR, DEFAULT_SIZES, DEFAULT_TIMEOUT, RENDEZVOUS_SLACK, WATCHDOG_SLACK, Fault, ProbeConfig
from .report import DistReport, build, states_from_gathered
from .rules import STEPS, WAITING_CODES, RankState, rank_states

#: How long past a step's deadline (and the rank's own watchdog) this process waits before ending a rank.
MARGIN = 0.5
LOOPBACK = "127.0.0.1"


@dataclass
class LaunchOptions:
    nproc: int = 2
    nnodes: int = 1
    node_rank: int = 0
    endpoint: str | None = None
    backend: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    sizes: tuple[int, ...] = DEFAULT_SIZES
    fault: Fault | None = None
    log_dir: str | None = None


def endpoint_of(opts: LaunchOptions, env: dict[str, str]) -> tuple[str, int, str]:
    """Host, port, and where they came from: ``--rdzv-endpoint``, MASTER_ADDR/MASTER_PORT, or a free local port."""
    if opts.endpoint:
        host, sep, port = opts.endpoint.rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise UsageError(f"--rdzv-endpoint {opts.endpoint!r}: expected HOST:PORT with a port 1-65535")
        return host.strip("[]"), int(port), "--rdzv-endpoint"
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        port_text = env["MASTER_PORT"].strip()
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise UsageError(f"MASTER_PORT={port_text!r} is not a port (1-65535): unset it or fix it")
        return env["MASTER_ADDR"], int(port_text), "MASTER_ADDR/MASTER_PORT"
    if opts.nnodes > 1:
        raise UsageError(
            f"--nnodes {opts.nnodes} needs --rdzv-endpoint HOST:PORT (a host every node can reach, and a free port), "
            "the same on every node"
        )
    return LOOPBACK, free_port(), "a free local port"


def port_failure(host: str, port: int, source: str) -> dict[str, Any] | None:
    """The foundation's port check (TD407) on the rendezvous endpoint, before anything starts."""
    from ..checks import run_checks
    from ..facts import GatherContext, gather
    from ..options import CheckOptions
    from ..registry import Hit, lookup

    ctx = GatherContext(env={"MASTER_ADDR": host, "MASTER_PORT": str(port)}, dist=True, torch=False)
    facts = gather(ctx, sections=["host", "dist"])
    found = run_checks(facts, CheckOptions(dist=True), codes=[lookup("TD407"), lookup("TD408")])
    store = facts.dist.store
    holder = store.holder if store else None
    if not found and store is not None and store.in_use:
        # the check spares a holder that is an ancestor (torchrun's own store); we launch, so nothing may hold it
        code = lookup("TD407")
        who = f" by pid {holder.pid} ({holder.name or '?'})" if holder and holder.pid else ""
        found = [code.finding(Hit({"port": port}))]
        found[0] = replace(found[0], message=f"port {port} is already in use on this host{who}")
    if not found:
        return None
    f = found[0]
    return {
        "step": "rendezvous",
        "rank": None,
        "host": socket.gethostname(),
        "pid": None,
        "kind": "preflight",
        "code": f.code,
        "family": f.family,
        "message": f"rendezvous endpoint {host}:{port} ({source}): {f.message}",
        "fix": f.fix,
        "title": f.title,
        "holder_pid": holder.pid if holder else None,
        "port": port,
    }


class Watcher:
    """Reads the journals as they grow; ends the run when a step is overdue."""

    def __init__(self, directory: Path, timeout: float, agent_pid: int, progress: Callable[[str], None] | None) -> None:
        self.directory = directory
        self.timeout = timeout
        self.agent_pid = agent_pid
        self.progress = progress
        self.offsets: dict[Path, int] = {}
        self.records: dict[Path, list[dict[str, Any]]] = {}
        self.overdue: tuple[str, float] | None = None
        self.ended_by_us = False

    def poll(self) -> None:
        for path in journals(self.directory):
            recs, self.offsets[path] = read_records(path, self.offsets.get(path, 0))
            self.records.setdefault(path, []).extend(recs)
        states = self.states()
        now = time.time()
        for st in states.values():
            slack = RENDEZVOUS_SLACK if st.running == "rendezvous" else WATCHDOG_SLACK
            late = self.timeout + slack + MARGIN
            if st.running and st.running_since and not st.ended and now - st.running_since > late:
                self.overdue = self.overdue or (str(st.running), now)
                st.overdue = True
        if self.overdue and not self.ended_by_us:
            self.end(states)
        if self.progress:
            self.progress(_progress_line(states))

    def end(self, states: dict[int | None, RankState]) -> None:
        """End every rank (by the PID it wrote) and the agent's session."""
        import os
        import signal

        self.ended_by_us = True
        for st in states.values():
            if st.pid:
                try:
                    os.kill(int(st.pid), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        reap_session(self.agent_pid)

    def by_rank(self) -> dict[int | None, list[dict[str, Any]]]:
        return {rank_of(path): recs for path, recs in self.records.items()}

    def states(self) -> dict[int | None, RankState]:
        states = rank_states(self.by_rank())
        if self.overdue:
            for st in states.values():
                if st.running == self.overdue[0] and not st.stopped and not st.ended:
                    st.overdue = True
        return states


def _progress_line(states: dict[int | None, RankState]) -> str:
    if not states:
        return "starting ranks (rendezvous)..."
    running = [st.running for st in states.values() if st.running]
    step = min(running, key=STEPS.index) if running else "finishing"
    done = sum(1 for st in states.values() if st.ended)
    return f"{len(states)} rank(s) started, {done} finished; step: {step}"


def run(opts: LaunchOptions, progress: Callable[[str], None] | None = None) -> DistReport:
    """Run the smoke test on this node and return its report."""
    import os

    started = time.perf_counter()
    env = dict(os.environ)
    host, port, source = endpoint_of(opts, env)
    world = opts.nproc * opts.nnodes
    common: dict[str, Any] = {
        "world_size": world,
        "nnodes": opts.nnodes,
        "backend": opts.backend or "auto",
        "mode": "local",
    }
    if opts.node_rank == 0:
        failure = port_failure(host, port, source)
        if failure:
            return build({}, seconds=time.perf_counter() - started, failure=failure, **common)
    if opts.log_dir:
        Path(opts.log_dir).mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="torchdoctor-dist-", dir=opts.log_dir))
    else:
        work = Path(tempfile.mkdtemp(prefix="torchdoctor-dist-"))
    try:
        return _run(opts, work, host, port, world, common, started, progress)
    finally:
        if not opts.log_dir:
            shutil.rmtree(work, ignore_errors=True)


def _run(
    opts: LaunchOptions,
    work: Path,
    host: str,
    port: int,
    world: int,
    common: dict[str, Any],
    started: float,
    progress: Callable[[str], None] | None,
) -> DistReport:
    jdir = work / "ranks"
    jdir.mkdir()
    probe_cfg = ProbeConfig(
        backend=opts.backend,
        timeout=opts.timeout,
        sizes=opts.sizes,
        fault=opts.fault,
        gather=opts.nnodes > 1,
        report=None,
        nproc_per_node=opts.nproc,
    )
    agent_cfg = {
        "nnodes": opts.nnodes,
        "nproc": opts.nproc,
        "run_id": f"torchdoctor-{port}",
        "endpoint": f"{host}:{port}",
        "join_timeout": max(1, int(round(opts.timeout))),
        "is_host": opts.node_rank == 0,
        "log_dir": str(work / "logs"),
        "out": str(work / "agent.json"),
    }
    (work / "agent-config.json").write_text(json.dumps(agent_cfg))
    extra = {DIR_VAR: str(jdir), CONFIG_VAR: probe_cfg.to_env()}
    # the agent sets the rank variables for its ranks; stray ones of ours would only confuse torch
    env = {k: v for k, v in child_env(extra).items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    if host in (LOOPBACK, "localhost") and "GLOO_SOCKET_IFNAME" not in env:
        env["GLOO_SOCKET_IFNAME"] = "lo"  # keep gloo's connections where the rendezvous is
    with open(work / "agent.log", "wb") as log:
        proc = start([sys.executable, "-m", "torchdoctor.dist.agent", str(work / "agent-config.json")], env, log, log)
        watcher = Watcher(jdir, opts.timeout, proc.pid, progress)
        overall = opts.timeout * (len(STEPS) + 2) + 60
        result = supervise(proc, Limits(timeout=overall), poll=watcher.poll)
    watcher.poll()
    states = watcher.states()
    agent = _read_json(work / "agent.json")
    notes: list[str] = []
    for rank, f in (agent.get("failures") or {}).items():
        if str(rank).isdigit() and int(rank) in states:
            states[int(rank)].exit = {"exitcode": f.get("exitcode"), "signal": f.get("signal")}
    failure = None
    if agent.get("state") == "error" and not states:
        failure = _agent_failure(agent, work, host, port, opts)
    if result.timed_out and not states:
        failure = failure or _agent_failure(
            {"error": {"type": "timeout", "message": f"no rank started within {overall:g} s"}}, work, host, port, opts
        )
    for st in states.values():
        if st.died():
            st.exit = {**(st.exit or {}), "code": _explained_log(work / "logs", st)}
    gathered = next((r for recs in watcher.by_rank().values() for r in recs if r.get("event") == "gathered"), None)
    if gathered:
        for rank, recs in states_from_gathered(gathered).items():
            if rank not in states:
                states.update(rank_states({rank: recs}))
    local_only = opts.nnodes > 1 and gathered is None and failure is None and bool(states)
    if local_only:
        notes.append("this node's ranks only: the node that runs rank 0 reports every rank")
    if opts.log_dir:
        notes.append(f"journals and rank logs kept in {work}")
    return build(
        states, seconds=time.perf_counter() - started, notes=notes, failure=failure, local_only=local_only, **common
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _agent_failure(agent: dict[str, Any], work: Path, host: str, port: int, opts: LaunchOptions) -> dict[str, Any]:
    """The agent failed before any rank started: the rendezvous (a node missing, an endpoint unreachable)."""
    from ..explain import explain
    from ..registry import lookup

    err = agent.get("error") or {}
    message = f"{err.get('type', 'error')}: {err.get('message', '')}".strip()
    log = (work / "agent.log").read_text(errors="replace") if (work / "agent.log").exists() else ""
    report = explain(f"{log}\n{message}")
    top = report.top
    timeout = "Timeout" in str(err.get("type")) or "timed out" in message.lower() or err.get("type") == "timeout"
    code = "TD452" if timeout or top is None else top.code
    info = lookup(code)
    if timeout and opts.nnodes > 1:
        text = (
            f"node {opts.node_rank} waited {opts.timeout:g} s at the rendezvous {host}:{port} but not all "
            f"{opts.nnodes} nodes joined: start `torchdoctor dist` on every node with the same --rdzv-endpoint"
        )
    else:
        text = f"the launcher failed at the rendezvous {host}:{port}: {message[:300]}"
    return {
        "step": "rendezvous",
        "rank": None,
        "host": socket.gethostname(),
        "pid": None,
        "kind": "rendezvous",
        "code": info.code,
        "family": info.family,
        "message": text,
        "fix": info.plain_fix,
        "title": info.title,
    }


def _explained_log(logs: Path, st: RankState) -> str | None:
    """The code explain finds in a rank's own output (its root cause), when it names one."""
    if st.local_rank is None or not logs.exists():
        return None
    from ..explain import explain

    dirs = sorted({p.parent for p in logs.rglob("*.log") if p.parent.name == str(st.local_rank)})
    if not dirs:
        return None
    report = explain(dirs[-1])  # its stdout.log and stderr.log (the last attempt)
    top = report.root_cause
    return top.code if top is not None and top.code not in WAITING_CODES else None
