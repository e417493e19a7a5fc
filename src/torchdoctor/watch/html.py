"""The self-contained HTML report of a ``watch`` timeline (``torchdoctor watch --report FILE.html``).

One page, nothing fetched: inline CSS and SVG drawn here, no script (a Content-Security-Policy
forbids scripts and every load, so the page works offline and a job's hostile output cannot act).
The header says how the job ended and the diagnosis; then one plot per resource over time (seconds
since the start), its limits as dashed lines, the warnings as vertical markers (their message as a
tooltip); then the warnings and a table per process. Everything the job wrote (command, process
names, messages) is HTML-escaped. Long series are reduced to a min/max per bucket, so a peak that
reaches a limit is never lost and the file stays small.
"""

from __future__ import annotations

import html
import math
import os
import shlex
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..units import human_bytes

Point = tuple[float, float]
ProcKey = tuple[int, str]

#: Most points drawn per series (the plot is ~900 px wide: a min and a max per pixel pair).
MAX_POINTS = 1000
#: Most points drawn per plot, all its series together (many processes share the budget).
PLOT_POINTS = 12000
#: A limit is drawn at its height when the data reaches this fraction of it; else on the top edge.
IN_VIEW = 0.2
#: Processes named in a plot's legend (the table below lists them all).
MAX_LEGEND = 16

WIDTH, HEIGHT = 960, 240
LEFT, RIGHT, TOP, BOTTOM = 80, 16, 16, 30
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
    "#393b79",
    "#ad494a",
    "#637939",
)
#: Plots left out when always 0 (torch's segments: none at all says nothing worth a plot).
ZERO_SKIPPED = frozenset({"segments"})
#: A warning's ``resource`` → the plot it is marked on.
WARNING_PLOT = {"maps": "maps", "fds": "fds", "shm": "shm", "cgroup_memory": "memory", "host_memory": "memory"}


def esc(value: object) -> str:
    """Text or attribute value, escaped (quotes too)."""
    return html.escape(str(value), quote=True)


# -- units ---------------------------------------------------------------------------------------


def fmt_value(unit: str, value: float | None) -> str:
    if value is None:
        return "–"
    if unit == "bytes":
        return human_bytes(value)
    if unit == "percent":
        return f"{value:.1f}%".replace(".0%", "%")
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def fmt_seconds(seconds: float) -> str:
    """A time since the start, for ticks and tables: ``12 s``, ``1.5 s``, ``3 min``, ``2 h 5 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s".replace(".0 s", " s")
    if seconds < 3600:
        m, s = divmod(round(seconds), 60)
        return f"{m} min" + (f" {s} s" if s else "")
    h, m = divmod(round(seconds) // 60, 60)
    return f"{h} h" + (f" {m} min" if m else "")


def nice_step(span: float, target: int = 5) -> float:
    """A 1, 2 or 5 × 10ⁿ step giving about ``target`` intervals over ``span``."""
    raw = max(span, 1e-9) / target
    mag = 10.0 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw * 0.999)


def time_step(span: float) -> float:
    """A tick step in seconds that reads well: 0.5 s, 10 s, 30 s, 5 min, 1 h..."""
    if span <= 60:
        return nice_step(span, 8)
    steps = (15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
    return next((s for s in steps if span / s <= 8), float(steps[-1]))


@dataclass(frozen=True)
class Axis:
    top: float
    ticks: list[float]
    fmt: Callable[[float], str]


def y_axis(peak: float, unit: str) -> Axis:
    """From 0 to a tick just above ``peak``; bytes step in whole KiB/MiB/GiB where they can."""
    peak = peak if peak > 0 else (1024.0 if unit == "bytes" else 1.0)
    if unit == "bytes":
        scale = next((1024.0**k for k in (4, 3, 2, 1) if peak / 1024.0**k >= 2), 1.0)
        step = max(nice_step(peak / scale) * scale, 1.0)
    else:
        step = nice_step(peak)
        step = max(step, 1.0) if unit == "count" else step
    top = math.ceil(peak * 1.02 / step) * step
    n = round(top / step)
    return Axis(top, [i * step for i in range(n + 1)], lambda v: fmt_value(unit, v))


def x_axis(span: float) -> Axis:
    span = span if span > 0 else 1.0
    step = time_step(span)
    n = int(span / step + 1e-9)
    return Axis(span, [i * step for i in range(n + 1)], fmt_seconds)


# -- data ----------------------------------------------------------------------------------------


@dataclass
class Series:
    key: ProcKey | None
    label: str
    points: list[Point] = field(default_factory=list)


@dataclass
class Limit:
    name: str
    value: float
    start: float | None = None
    end: float | None = None
    """When the limit held (seconds since the start); None: the whole run."""


@dataclass
class Plot:
    ident: str
    title: str
    unit: str
    series: list[Series]
    limits: list[Limit] = field(default_factory=list)


def number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def proc_key(p: dict[str, Any]) -> ProcKey:
    return (int(p.get("pid") or 0), str(p.get("name") or "?"))


def proc_label(key: ProcKey) -> str:
    return f"pid {key[0]} · {key[1]}"


def process_series(samples: Sequence[dict[str, Any]], fieldname: str, t0: float) -> list[Series]:
    """One series per process (pid and name) of ``fieldname``; processes without a value left out."""
    out: dict[ProcKey, Series] = {}
    for s in samples:
        t = float(s["t"]) - t0
        for p in s.get("processes") or []:
            v = number(p.get(fieldname))
            if v is not None:
                key = proc_key(p)
                out.setdefault(key, Series(key, proc_label(key))).points.append((t, v))
    return list(out.values())


def host_series(
    samples: Sequence[dict[str, Any]], label: str, value: Callable[[dict[str, Any]], Any], t0: float
) -> list[Series]:
    points = [(float(s["t"]) - t0, v) for s in samples if (v := number(value(s))) is not None]
    return [Series(None, label, points)] if points else []


def nofile_limits(samples: Sequence[dict[str, Any]], t0: float) -> list[Limit]:
    """Each distinct RLIMIT_NOFILE of the processes, over the time it was seen."""
    spans: dict[float, Limit] = {}
    for s in samples:
        t = float(s["t"]) - t0
        for p in s.get("processes") or []:
            v = number(p.get("nofile"))
            if v is not None and v > 0:
                lim = spans.setdefault(v, Limit("RLIMIT_NOFILE", v, t, t))
                lim.end = t
    if len(spans) > 1:
        for lim in spans.values():
            pids = sorted(
                {p["pid"] for s in samples for p in s.get("processes") or [] if number(p.get("nofile")) == lim.value}
            )
            lim.name = f"RLIMIT_NOFILE (pid {', '.join(map(str, pids[:4]))}{', …' if len(pids) > 4 else ''})"
    return list(spans.values())


def fixed_limit(name: str, value: Any) -> list[Limit]:
    v = number(value)
    return [Limit(name, v)] if v is not None and v > 0 else []


def memory_plot(samples: Sequence[dict[str, Any]], limits: dict[str, Any], t0: float) -> Plot:
    """The cgroup's memory against its limit when there is one (and it was read), else the host's."""
    if number(limits.get("cgroup_memory_bytes")):
        series = host_series(samples, "cgroup memory", lambda s: s.get("cgroup_memory"), t0)
        if series:
            return Plot(
                "memory", "cgroup memory", "bytes", series, fixed_limit("memory.max", limits["cgroup_memory_bytes"])
            )
    total = number(limits.get("mem_total_bytes"))

    def used(s: dict[str, Any]) -> float | None:
        avail = number(s.get("mem_available"))
        return total - avail if total is not None and avail is not None else None

    series = host_series(samples, "host memory in use", used, t0)
    return Plot(
        "memory", "Host memory in use (MemTotal − MemAvailable)", "bytes", series, fixed_limit("MemTotal", total)
    )


def build_plots(timeline: dict[str, Any]) -> list[Plot]:
    """Every plot with data, in reading order."""
    samples = timeline.get("samples") or []
    limits = timeline.get("limits") or {}
    t0 = float(timeline.get("started") or (samples[0]["t"] if samples else 0.0))

    def per_process(ident: str, fieldname: str, title: str, unit: str, lims: list[Limit] | None = None) -> Plot:
        return Plot(ident, title, unit, process_series(samples, fieldname, t0), lims or [])

    plots = [
        per_process(
            "maps",
            "maps",
            "Memory maps per process",
            "count",
            fixed_limit("vm.max_map_count", limits.get("max_map_count")),
        ),
        per_process("fds", "fds", "Open files per process", "count", nofile_limits(samples, t0)),
        per_process("rss", "rss", "RSS per process", "bytes"),
        per_process("threads", "threads", "Threads per process", "count"),
        per_process("cpu", "cpu_percent", "CPU per process (100% = one core)", "percent"),
        Plot(
            "shm",
            "/dev/shm used",
            "bytes",
            host_series(samples, "/dev/shm used", lambda s: s.get("shm_used"), t0),
            fixed_limit("/dev/shm size", limits.get("shm_bytes")),
        ),
        Plot(
            "segments",
            "torch_* segments in /dev/shm",
            "count",
            host_series(samples, "torch segments", lambda s: s.get("torch_segments"), t0),
        ),
        memory_plot(samples, limits, t0),
        per_process("gpu", "gpu_bytes", "GPU memory per process", "bytes"),
    ]
    return [p for p in plots if any(s.points for s in p.series) and (p.ident not in ZERO_SKIPPED or peak(p) > 0)]


def peak(plot: Plot) -> float:
    return max((v for s in plot.series for _, v in s.points), default=0.0)


def downsample(points: Sequence[Point], budget: int) -> list[Point]:
    """At most ``budget`` points: the first and last, and per bucket its lowest and highest, in order."""
    if len(points) <= budget or budget < 4:
        return list(points)
    buckets = (budget - 2) // 2
    inner = points[1:-1]
    size = len(inner) / buckets
    out = [points[0]]
    for b in range(buckets):
        chunk = inner[int(b * size) : int((b + 1) * size)]
        if chunk:
            lo, hi = min(chunk, key=lambda p: p[1]), max(chunk, key=lambda p: p[1])
            out.extend(sorted({lo, hi}))
    out.append(points[-1])
    return out


def colours(plots: Iterable[Plot]) -> dict[ProcKey | None, str]:
    """A process keeps its colour in every plot (in order of first appearance)."""
    out: dict[ProcKey | None, str] = {}
    for plot in plots:
        for s in plot.series:
            if s.key not in out:
                out[s.key] = PALETTE[len(out) % len(PALETTE)]
    return out


# -- SVG -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """Data to pixels."""

    x: Axis
    y: Axis

    def px(self, t: float) -> float:
        return LEFT + (t / self.x.top) * (WIDTH - LEFT - RIGHT)

    def py(self, v: float) -> float:
        return TOP + (1 - min(v, self.y.top) / self.y.top) * (HEIGHT - TOP - BOTTOM)


def svg_axes(f: Frame) -> Iterator[str]:
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    for v in f.y.ticks:
        y = f.py(v)
        yield f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}"/>'
        yield f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{esc(f.y.fmt(v))}</text>'
    for t in f.x.ticks:
        x = f.px(t)
        yield f'<line class="grid" x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{bottom}"/>'
        yield f'<text class="tick" x="{x:.1f}" y="{bottom + 18}" text-anchor="middle">{esc(f.x.fmt(t))}</text>'
    yield f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{right - LEFT}" height="{bottom - TOP}"/>'


def svg_series(f: Frame, s: Series, colour: str, budget: int) -> str:
    pts = downsample(s.points, budget)
    title = f"<title>{esc(s.label)}</title>"
    if len(pts) == 1:
        (t, v) = pts[0]
        return f'<circle class="series" cx="{f.px(t):.1f}" cy="{f.py(v):.1f}" r="2.5" fill="{colour}">{title}</circle>'
    coords = " ".join(f"{f.px(t):.1f},{f.py(v):.1f}" for t, v in pts)
    return f'<polyline class="series" stroke="{colour}" points="{coords}">{title}</polyline>'


def svg_limit(f: Frame, lim: Limit, unit: str) -> str:
    y = f.py(lim.value)
    x1 = f.px(lim.start) if lim.start is not None else LEFT
    x2 = f.px(lim.end) if lim.end is not None else WIDTH - RIGHT
    x2 = max(x2, x1 + 8)
    text = f"{lim.name} = {fmt_value(unit, lim.value)}"
    return (
        f'<g class="limit"><title>{esc(text)}</title>'
        f'<line x1="{x1:.1f}" y1="{y:.1f}" x2="{x2:.1f}" y2="{y:.1f}"/>'
        f'<text x="{WIDTH - RIGHT - 4}" y="{y - 4:.1f}" text-anchor="end">{esc(text)}</text></g>'
    )


def svg_offscale(f: Frame, lims: Sequence[Limit], unit: str, peak: float) -> str:
    """Limits far above the data: one dashed line on the top edge, saying how far the data got."""
    parts = [f"{lim.name} = {fmt_value(unit, lim.value)}" for lim in lims]
    reached = peak / min(lim.value for lim in lims)
    share = "0%" if reached == 0 else "<0.1%" if reached < 0.001 else f"{reached:.1%}"
    text = f"▲ above the scale: {'; '.join(parts)} (peak {share} of it)"
    return (
        f'<g class="limit off-scale"><title>{esc(text)}</title>'
        f'<line x1="{LEFT}" y1="{TOP}" x2="{WIDTH - RIGHT}" y2="{TOP}"/>'
        f'<text x="{WIDTH - RIGHT - 4}" y="{TOP + 12}" text-anchor="end">{esc(text)}</text></g>'
    )


def svg_warning(f: Frame, w: dict[str, Any], t0: float) -> str:
    x = f.px(min(max(float(w.get("t") or t0) - t0, 0.0), f.x.top))
    msg = esc(w.get("message") or "")
    return (
        f'<g class="warning"><title>{msg}</title>'
        f'<line class="hit" x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{HEIGHT - BOTTOM}"/>'
        f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{HEIGHT - BOTTOM}"/>'
        f'<text x="{x + 3:.1f}" y="{HEIGHT - BOTTOM - 4}">▲ {esc(w.get("code") or "")}</text></g>'
    )


def render_plot(
    plot: Plot, span: float, warnings: Sequence[dict[str, Any]], t0: float, palette: dict[ProcKey | None, str]
) -> str:
    top = peak(plot)
    shown = [lim for lim in plot.limits if top >= IN_VIEW * lim.value]
    above = [lim for lim in plot.limits if lim not in shown]
    f = Frame(x_axis(span), y_axis(max([top, *(lim.value for lim in shown)]), plot.unit))
    budget = max(50, min(MAX_POINTS, PLOT_POINTS // max(len(plot.series), 1)))
    body = [
        *svg_axes(f),
        *(svg_series(f, s, palette.get(s.key, PALETTE[0]), budget) for s in plot.series),
        *(svg_limit(f, lim, plot.unit) for lim in shown),
        *([svg_offscale(f, above, plot.unit, top)] if above else []),
        *(svg_warning(f, w, t0) for w in warnings),
    ]
    svg = (
        f'<svg class="chart" data-plot="{esc(plot.ident)}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{esc(plot.title)}">' + "".join(body) + "</svg>"
    )
    return (
        f'<section class="plot" id="plot-{esc(plot.ident)}"><h3>{esc(plot.title)}</h3>{svg}'
        f"{legend(plot, palette)}</section>"
    )


def legend(plot: Plot, palette: dict[ProcKey | None, str]) -> str:
    if all(s.key is None for s in plot.series):
        return ""
    items = [
        f'<li><span class="swatch" style="background:{palette.get(s.key, PALETTE[0])}"></span>{esc(s.label)}</li>'
        for s in plot.series[:MAX_LEGEND]
    ]
    if len(plot.series) > MAX_LEGEND:
        items.append(f"<li>… and {len(plot.series) - MAX_LEGEND} more (table below)</li>")
    return f'<ul class="legend">{"".join(items)}</ul>'


# -- header and tables ---------------------------------------------------------------------------


def command_text(timeline: dict[str, Any]) -> str:
    cmd = timeline.get("command")
    if not cmd:
        return f"attached to pid {timeline.get('pid')}"
    return shlex.join(str(a) for a in cmd)


def ending(timeline: dict[str, Any]) -> tuple[str, str]:
    """How the job ended, and a CSS class for it."""
    code, sig = timeline.get("exit_code"), timeline.get("signal")
    if sig:
        return f"killed by {sig} (exit {code})", "fail"
    if code is None:
        return "exit status unknown (attached)" if not timeline.get("command") else "exit status unknown", "unknown"
    return f"exit {code}", "ok" if code == 0 else "fail"


def header(timeline: dict[str, Any]) -> str:
    started, ended = number(timeline.get("started")), number(timeline.get("ended"))
    duration = fmt_seconds(ended - started) if started is not None and ended is not None else "–"
    when = datetime.fromtimestamp(started, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if started else "–"
    how, cls = ending(timeline)
    facts = [
        ("ended", f'<span class="{cls}">{esc(how)}</span>'),
        ("duration", esc(duration)),
        ("started", esc(when)),
        ("samples", f"{len(timeline.get('samples') or [])} (every {esc(timeline.get('interval'))} s)"),
        ("warnings", str(len(timeline.get("warnings") or []))),
    ]
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    return f'<header><h1>torchdoctor watch</h1><pre class="command">{esc(command_text(timeline))}</pre><dl class="facts">{dl}</dl></header>'


def diagnosis_box(d: dict[str, Any] | None) -> str:
    if not d:
        return ""
    before = d.get("warned_before_seconds")
    warned = (
        f'<p class="warned">warned {esc(fmt_seconds(float(before)))} before the end'
        + (f": {esc(d['warned'].get('message', ''))}" if isinstance(d.get("warned"), dict) else "")
        + "</p>"
        if before is not None
        else '<p class="warned none">no warning came before the end</p>'
    )
    fix = f'<p class="fix"><b>Fix:</b> {esc(d["fix"])}</p>' if d.get("fix") else ""
    return (
        f'<section class="diagnosis"><h2>✖ {esc(d.get("code", ""))} <span class="family">[{esc(d.get("family", ""))}]</span></h2>'
        f'<p class="message">{esc(d.get("message", ""))}</p>{fix}{warned}</section>'
    )


def table(cls: str, head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """``rows`` cells are HTML already (escape them before)."""
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def warnings_table(warnings: Sequence[dict[str, Any]], t0: float) -> str:
    if not warnings:
        return '<section><h2>Warnings</h2><p class="none">No warnings.</p></section>'
    unit = {"shm": "bytes", "cgroup_memory": "bytes", "host_memory": "bytes"}

    def row(w: dict[str, Any]) -> list[str]:
        u = unit.get(str(w.get("resource")), "count")
        proj = w.get("projected_seconds")
        return [
            esc(fmt_seconds(max(float(w.get("t") or t0) - t0, 0.0))),
            esc(w.get("code") or ""),
            esc(w.get("resource") or ""),
            esc(w.get("pid") if w.get("pid") is not None else "host"),
            esc(w.get("process") or ""),
            esc(f"{fmt_value(u, number(w.get('value')))} / {fmt_value(u, number(w.get('limit')))}"),
            esc("–" if proj is None else f"~{fmt_seconds(float(proj))}"),
            esc(w.get("message") or ""),
        ]

    head = ("at", "code", "resource", "pid", "process", "value / limit", "limit in", "message")
    return f"<section><h2>Warnings</h2>{table('warnings', head, map(row, warnings))}</section>"


@dataclass
class ProcStats:
    key: ProcKey
    ppid: Any = None
    first: float = 0.0
    last: float = 0.0
    peaks: dict[str, float] = field(default_factory=dict)

    def feed(self, t: float, p: dict[str, Any]) -> None:
        self.last = t
        for k in ("rss", "fds", "nofile", "maps", "threads", "cpu_percent", "gpu_bytes"):
            v = number(p.get(k))
            if v is not None and v >= self.peaks.get(k, -1.0):
                self.peaks[k] = v


def process_stats(samples: Sequence[dict[str, Any]], t0: float) -> list[ProcStats]:
    out: dict[ProcKey, ProcStats] = {}
    for s in samples:
        t = float(s["t"]) - t0
        for p in s.get("processes") or []:
            key = proc_key(p)
            if key not in out:
                out[key] = ProcStats(key, p.get("ppid"), t, t)
            out[key].feed(t, p)
    return sorted(out.values(), key=lambda st: (st.first, st.key[0]))


def processes_table(samples: Sequence[dict[str, Any]], t0: float) -> str:
    stats = process_stats(samples, t0)
    if not stats:
        return ""

    def row(st: ProcStats) -> list[str]:
        pk = st.peaks.get
        return [
            esc(st.key[0]),
            esc(st.ppid if st.ppid is not None else "–"),
            esc(st.key[1]),
            esc(fmt_seconds(st.first)),
            esc(fmt_seconds(st.last)),
            esc(fmt_value("bytes", pk("rss"))),
            esc(f"{fmt_value('count', pk('fds'))} / {fmt_value('count', pk('nofile'))}"),
            esc(fmt_value("count", pk("maps"))),
            esc(fmt_value("count", pk("threads"))),
            esc(fmt_value("percent", pk("cpu_percent"))),
        ]

    head = (
        "pid",
        "ppid",
        "name",
        "first seen",
        "last seen",
        "peak RSS",
        "peak fds / limit",
        "peak maps",
        "peak threads",
        "peak CPU",
    )
    return f"<section><h2>Processes</h2>{table('processes', head, map(row, stats))}</section>"


# -- page ----------------------------------------------------------------------------------------

CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1000px;color:#222;padding:0 12px}
h1{font-size:20px;margin:0 0 8px}h2{font-size:17px;margin:24px 0 8px}h3{font-size:15px;margin:20px 0 4px}
pre.command{background:#f4f4f4;padding:8px;white-space:pre-wrap;word-break:break-all;margin:0 0 8px}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:0}dt{color:#666}dd{margin:0}
.ok{color:#2a7a2a;font-weight:600}.fail{color:#b00020;font-weight:600}.unknown{color:#666}
.diagnosis{border:2px solid #b00020;border-radius:6px;padding:8px 14px;margin:16px 0;background:#fff5f5}
.diagnosis h2{margin:4px 0;color:#b00020}.family{color:#555;font-weight:400}.warned{color:#7a4a00}
svg.chart{width:100%;height:auto;display:block;font:11px system-ui,sans-serif}
svg .grid{stroke:#e6e6e6;stroke-width:1}svg .frame{fill:none;stroke:#999;stroke-width:1}svg .tick{fill:#555}
svg .series{fill:none;stroke-width:1.6;stroke-linejoin:round}svg circle.series{stroke:none}
svg .limit line{stroke:#b00020;stroke-width:1.4;stroke-dasharray:6 4}svg .limit text{fill:#b00020}
svg .warning line{stroke:#e08000;stroke-width:2}svg .warning line.hit{stroke:transparent;stroke-width:10}
svg .warning text{fill:#e08000;font-weight:600}
ul.legend{list-style:none;padding:0;margin:4px 0 0;display:flex;flex-wrap:wrap;gap:2px 16px;font-size:12px}
.swatch{display:inline-block;width:12px;height:3px;margin:0 6px 3px 0;vertical-align:middle}
table{border-collapse:collapse;width:100%;font-size:12px}th,td{border-bottom:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td{word-break:break-word}.none{color:#666}
"""

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def plots_section(timeline: dict[str, Any]) -> str:
    samples = timeline.get("samples") or []
    if not samples:
        return '<section><h2>Resources</h2><p class="none">No samples were taken.</p></section>'
    t0 = float(timeline.get("started") or samples[0]["t"])
    end = float(timeline.get("ended") or samples[-1]["t"])
    span = max(end - t0, float(samples[-1]["t"]) - t0, 1e-3)
    plots = build_plots(timeline)
    palette = colours(plots)
    warnings = timeline.get("warnings") or []
    body = "".join(
        render_plot(p, span, [w for w in warnings if WARNING_PLOT.get(str(w.get("resource"))) == p.ident], t0, palette)
        for p in plots
    )
    return f"<section><h2>Resources over time</h2>{body}</section>"


def render_html(timeline: dict[str, Any]) -> str:
    """The report page of a timeline (``Timeline.to_json()`` or a ``--timeline`` file, loaded)."""
    samples = timeline.get("samples") or []
    t0 = float(timeline.get("started") or (samples[0]["t"] if samples else 0.0))
    title = f"torchdoctor watch: {command_text(timeline)}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{esc(title[:200])}</title><style>{CSS}</style></head><body>"
        + header(timeline)
        + diagnosis_box(timeline.get("diagnosis"))
        + plots_section(timeline)
        + warnings_table(timeline.get("warnings") or [], t0)
        + processes_table(samples, t0)
        + "</body></html>\n"
    )


def write_report(timeline: dict[str, Any], path: str | os.PathLike[str]) -> None:
    Path(path).write_text(render_html(timeline), encoding="utf-8")
