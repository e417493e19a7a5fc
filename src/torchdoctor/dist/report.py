"""The smoke test's report: the rank x step table, the first failure, findings, bandwidth.

JSON (``schema_version`` 1)::

    {"schema_version": 1, "ok": bool, "world_size": int, "nnodes": int, "backend": str, "mode": str,
     "seconds": float,
     "steps": [{"name", "rank", "host", "status", "seconds"}],
     "first_failure": {"step", "rank", "host", "pid", "kind", "code", "family", "message", "fix"} | null,
     "findings": [{<a finding>, "rank", "host"}],
     "bandwidth": [{"bytes", "seconds", "algbw", "busbw", "iterations"}], "latency_s": float | null,
     "ranks": [{"rank", "host", "pid", "local_rank", "node_rank", "last_step", "exit"}],
     "notes": [str]}

``status`` is ``ok``, ``failed``, ``timeout`` (no result within the deadline), ``died`` (the rank
ended by a signal or exit of its own mid-step), ``stopped`` (ended by the launcher after another
rank failed), ``skipped`` (an earlier step failed on that rank) or ``not run``.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from ..units import human_bytes
from .rules import STEPS, RankState, first_failure, rank_states, step_rows

SCHEMA_VERSION = 1


@dataclass
class DistReport:
    world_size: int | None
    nnodes: int
    backend: str
    mode: str
    seconds: float
    states: dict[int | None, RankState]
    first_failure: dict[str, Any] | None
    findings: list[dict[str, Any]] = field(default_factory=list)
    bandwidth: list[dict[str, Any]] = field(default_factory=list)
    latency_s: float | None = None
    notes: list[str] = field(default_factory=list)
    expected: int | None = None
    """Ranks this report should show (all of them, or this node's when another node gathers)."""

    @property
    def ok(self) -> bool:
        if self.first_failure is not None:
            return False
        ranks = [s for s in self.states.values() if s.rank is not None]
        expected = self.expected if self.expected is not None else self.world_size
        complete = expected is not None and len(ranks) == expected
        return complete and all(all(status_ok(st, s) for s in STEPS) for st in ranks)

    def steps(self) -> list[dict[str, Any]]:
        return step_rows(self.states)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "ok": self.ok,
            "world_size": self.world_size,
            "nnodes": self.nnodes,
            "backend": self.backend,
            "mode": self.mode,
            "seconds": round(self.seconds, 3),
            "steps": self.steps(),
            "first_failure": self.first_failure,
            "findings": self.findings,
            "bandwidth": self.bandwidth,
            "latency_s": self.latency_s,
            "ranks": [
                {
                    "rank": st.rank,
                    "host": st.host,
                    "pid": st.pid,
                    "local_rank": st.local_rank,
                    "node_rank": st.node_rank,
                    "last_step": st.last_step,
                    "exit": st.exit,
                }
                for st in sorted(self.states.values(), key=lambda s: -1 if s.rank is None else s.rank)
            ],
            "notes": self.notes,
        }


def status_ok(st: RankState, step: str) -> bool:
    rec = st.steps.get(step)
    return rec is not None and rec.get("status") == "ok"


def build(
    states: dict[int | None, RankState],
    *,
    world_size: int | None,
    nnodes: int,
    backend: str,
    mode: str,
    seconds: float,
    findings: Sequence[Mapping[str, Any]] = (),
    bandwidth: Sequence[Mapping[str, Any]] = (),
    latency_s: float | None = None,
    notes: Sequence[str] = (),
    failure: dict[str, Any] | None = None,
    local_only: bool = False,
) -> DistReport:
    """A report from the ranks' states; ``failure`` (the launcher's own, e.g. a port in use) comes first."""
    inits = [st.steps["init"] for st in states.values() if st.steps.get("init", {}).get("status") == "ok"]
    if inits and (inits[0].get("details") or {}).get("backend"):
        backend = inits[0]["details"]["backend"]  # what the ranks chose ("auto": nccl with GPUs, else gloo)
    first = failure or first_failure(states, backend)
    if not bandwidth:  # the slowest rank's times, as rank 0 measured them (every rank has the same)
        done = [st.steps["bandwidth"] for st in states.values() if st.steps.get("bandwidth", {}).get("status") == "ok"]
        details = (done[0].get("details") or {}) if done else {}
        bandwidth, latency_s = details.get("rows") or [], details.get("latency_s", latency_s)
    if first is None and world_size is not None and not local_only:
        missing = sorted(set(range(world_size)) - {s.rank for s in states.values() if s.rank is not None})
        if missing:
            first = _never_joined(missing)
    return DistReport(
        world_size=world_size,
        nnodes=nnodes,
        backend=backend,
        mode=mode,
        seconds=seconds,
        states=states,
        first_failure=first,
        findings=_dedupe(findings),
        bandwidth=[dict(b) for b in bandwidth],
        latency_s=latency_s,
        notes=list(notes),
        expected=len([s for s in states.values() if s.rank is not None]) if local_only else world_size,
    )


def _never_joined(missing: list[int]) -> dict[str, Any]:
    from ..registry import lookup

    code = lookup("TD452")
    return {
        "step": "rendezvous",
        "rank": missing[0],
        "host": None,
        "pid": None,
        "kind": "missing",
        "code": code.code,
        "family": code.family,
        "message": f"rank(s) {', '.join(map(str, missing))} never reported: they did not start or did not join",
        "fix": code.plain_fix,
        "title": code.title,
    }


def _dedupe(findings: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One finding per (code, message): ranks that found the same thing are listed together."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for f in findings:
        key = (str(f.get("code")), str(f.get("message")))
        if key in out:
            if f.get("rank") is not None:
                out[key].setdefault("ranks", []).append(f.get("rank"))
            continue
        out[key] = {**f, "ranks": [f["rank"]] if f.get("rank") is not None else []}
    return list(out.values())


def states_from_gathered(gathered: Mapping[str, Any]) -> dict[int | None, list[dict[str, Any]]]:
    """Each rank's records as it mirrored them to the store (its step results, and where it was last)."""
    records: dict[int | None, list[dict[str, Any]]] = {}
    for key, value in (gathered.get("ranks") or {}).items():
        if not str(key).isdigit() or not isinstance(value, dict):
            continue
        hello = {"event": "hello", "rank": int(key), **(value.get("hello") or {})}
        recs = [hello, *value.get("notes", []), *value.get("steps", [])]
        last = value.get("last") or {}
        if last.get("event") in ("stopped", "end") or (last.get("event") == "step" and last.get("status") == "running"):
            recs.append(last)
        records[int(key)] = recs
    return records


def report_from_gathered(gathered: Mapping[str, Any], backend: str) -> DistReport:
    """Rank 0's report under torchrun or srun, from every rank's records in the store."""
    import os

    records = states_from_gathered(gathered)
    states = rank_states(records)
    hosts = {st.host for st in states.values()}
    world = int(os.environ.get("WORLD_SIZE", "0") or 0) or None
    nnodes = int(os.environ.get("GROUP_WORLD_SIZE", "0") or 0) or max(1, len(hosts - {None}))
    return build(
        states,
        world_size=world,
        nnodes=nnodes,
        backend=backend,
        mode="slurm" if os.environ.get("SLURM_PROCID") and not os.environ.get("TORCHELASTIC_RUN_ID") else "torchrun",
        seconds=0.0,
        findings=gathered.get("findings") or [],
        bandwidth=gathered.get("bandwidth") or [],
    )


# -- rendering -------------------------------------------------------------------------------------

_STYLE = {
    "ok": "green",
    "failed": "bold red",
    "timeout": "bold yellow",
    "died": "bold red",
    "stopped": "dim",
    "skipped": "dim",
    "not run": "dim",
}
#: Above this many ranks, the table shows one row per step with counts instead of a column per rank.
WIDE = 8


def render(report: DistReport, fmt: str, out: IO[str], plot: str | None = None) -> None:
    if fmt == "json":
        json.dump(report.to_json(), out, indent=2, default=str)
        out.write("\n")
    elif fmt == "markdown":
        out.write(markdown(report))
    else:
        text(report, out)
    if plot:
        from .plot import plot_bandwidth

        plot_bandwidth(report.bandwidth, plot, title=f"{report.backend}, {report.world_size} ranks")


def _cell(status: str, seconds: float | None) -> str:
    if status == "ok" and seconds is not None:
        return f"ok {seconds:.2f}s"
    if status in ("failed", "timeout") and seconds is not None:
        return f"{status} {seconds:.1f}s"
    return status if status != "not run" else "·"


def _grid(report: DistReport) -> tuple[list[str], list[list[str]], list[list[str]]]:
    """Header, cells and statuses: one row per step, one column per rank (or counts when wide)."""
    ranks = sorted((s for s in report.states.values()), key=lambda s: -1 if s.rank is None else s.rank)
    rows = report.steps()
    by = {(r["name"], r["rank"]): r for r in rows}
    if len(ranks) <= WIDE:
        header = ["step"] + [f"rank {s.rank}" if s.rank is not None else "?" for s in ranks]
        cells, statuses = [], []
        for step in STEPS:
            line = [by[(step, s.rank)] for s in ranks]
            cells.append([step] + [_cell(r["status"], r["seconds"]) for r in line])
            statuses.append([""] + [r["status"] for r in line])
        return header, cells, statuses
    header = ["step", "ok", "not ok", "slowest"]
    cells, statuses = [], []
    for step in STEPS:
        line = [by[(step, s.rank)] for s in ranks]
        bad = [r for r in line if r["status"] != "ok"]
        secs = [r["seconds"] for r in line if r["seconds"] is not None]
        worst = ", ".join(f"rank {r['rank']} {r['status']}" for r in bad[:4]) + (" ..." if len(bad) > 4 else "")
        cells.append([step, str(len(line) - len(bad)), worst or "-", f"{max(secs):.2f}s" if secs else "-"])
        statuses.append(["", "ok", "failed" if bad else "ok", ""])
    return header, cells, statuses


def text(report: DistReport, out: IO[str]) -> None:
    from rich.table import Table
    from rich.text import Text

    from ..report.text import make_console

    console = make_console(out)
    verdict = "passed" if report.ok else "FAILED"
    style = "bold green" if report.ok else "bold red"
    hosts = sorted({s.host for s in report.states.values() if s.host}) or [socket.gethostname()]
    head = Text()
    head.append(f"torchdoctor dist {verdict}", style=style)
    head.append(
        f"  {report.world_size} rank(s) on {len(hosts) or report.nnodes} host(s) ({', '.join(hosts[:4])}), "
        f"{report.backend}, {report.mode}, {report.seconds:.1f} s"
    )
    console.print(head)
    if report.states:
        header, cells, statuses = _grid(report)
        table = Table(show_edge=False, header_style="bold")
        for name in header:
            table.add_column(name, no_wrap=True)
        for row, sts in zip(cells, statuses, strict=True):
            table.add_row(*[Text(c, style=_STYLE.get(s, "")) for c, s in zip(row, sts, strict=True)])
        console.print(table)
    else:
        console.print(Text("no rank started", style="dim"))
    ff = report.first_failure
    if ff:
        console.print()
        line = Text()
        who = f"rank {ff['rank']}" if ff.get("rank") is not None else "the launcher"
        line.append(f"✖ first failure: step {ff['step']}, {who}", style="bold red")
        line.append(f" on {ff['host'] or '?'}" + (f" (pid {ff['pid']})" if ff.get("pid") else ""))
        console.print(line)
        console.print(Text(f"  {ff['message']}"))
        if ff.get("code"):
            console.print(Text(f"  {ff['code']} [{ff['family']}] {ff.get('title', '')}", style="bold"))
        if ff.get("fix"):
            console.print(Text(f"  fix: {ff['fix']}"))
    if report.bandwidth:
        console.print()
        bw = Table(title=None, show_edge=False, header_style="bold")
        for name in ("size", "time", "algbw", "busbw"):
            bw.add_column(name, justify="right")
        for b in report.bandwidth:
            bw.add_row(
                human_bytes(b["bytes"]),
                f"{b['seconds'] * 1e3:.2f} ms",
                f"{human_bytes(int(b['algbw']))}/s",
                f"{human_bytes(int(b['busbw']))}/s",
            )
        console.print(Text("all_reduce, slowest rank (busbw as nccl-tests: algbw x 2(n-1)/n)", style="dim"))
        console.print(bw)
        if report.latency_s is not None:
            console.print(Text(f"latency (4-byte all_reduce, median of 20): {report.latency_s * 1e6:.0f} us"))
    others = [f for f in report.findings if not ff or f.get("code") != ff.get("code")]
    if others:
        console.print()
        for f in others:
            ranks = f.get("ranks") or []
            where = f" (rank {', '.join(map(str, ranks))})" if ranks else ""
            console.print(Text(f"▲ {f['code']} {f['name']}{where}: {f['message']}", style="yellow"))
    for note in report.notes:
        console.print(Text(note, style="dim"))


def markdown(report: DistReport) -> str:
    header, cells, _ = _grid(report)
    lines = [f"## torchdoctor dist: {'passed' if report.ok else 'FAILED'}", ""]
    lines.append(f"{report.world_size} rank(s), {report.backend}, {report.mode}, {report.seconds:.1f} s")
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    ff = report.first_failure
    if ff:
        lines += [
            "",
            f"**First failure**: step `{ff['step']}`, "
            f"{'rank ' + str(ff['rank']) if ff.get('rank') is not None else 'the launcher'} on {ff['host'] or '?'}: {ff['message']}",
            "",
            f"`{ff['code']}` ({ff['family']}). Fix: {ff['fix']}",
        ]
    if report.bandwidth:
        lines += ["", "| size | time | algbw | busbw |", "|---:|---:|---:|---:|"]
        for row in report.bandwidth:
            lines.append(
                f"| {human_bytes(row['bytes'])} | {row['seconds'] * 1e3:.2f} ms | {human_bytes(int(row['algbw']))}/s"
                f" | {human_bytes(int(row['busbw']))}/s |"
            )
    for f in report.findings:
        lines.append(f"- `{f['code']}` {f['name']}: {f['message']}")
    return "\n".join(lines) + "\n"
