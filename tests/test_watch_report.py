"""`torchdoctor watch --report`: the HTML report of a timeline (torchdoctor.watch.html).

On timelines recorded from real jobs (tests/fixtures/watch, see its README), and variants derived
from them in memory (hostile names, null-only resources, a long run); then the page in a real
headless Chromium (installed by `make browser`, which `make test` runs).
"""

from __future__ import annotations

import copy
import html
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from torchdoctor.watch.html import MAX_POINTS, downsample, render_html, write_report

from .conftest import FIXTURES

WATCH = FIXTURES / "watch"
FD_LEAK = WATCH / "fd-leak.json"
LOADER = WATCH / "dataloader-3-workers.json"
HOSTILE = "<script>alert(1)</script>"
HOSTILE_ATTR = '"><img src=x onerror=alert(2)>'
#: Every plot the recorded timelines have data for (no GPU there; torch segments are always 0).
RECORDED_PLOTS = {"maps", "fds", "rss", "threads", "cpu", "shm", "memory"}


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def plots(page: str) -> dict[str, str]:
    """Plot id → its section's HTML."""
    return dict(re.findall(r'<section class="plot" id="plot-([\w-]+)">(.*?)</section>', page, re.S))


def polylines(section: str) -> list[list[tuple[float, float]]]:
    out = []
    for pts in re.findall(r'<polyline class="series"[^>]* points="([^"]*)"', section):
        out.append([(float(x), float(y)) for x, y in (p.split(",") for p in pts.split())])
    return out


def search(pattern: str, text: str) -> re.Match[str]:
    m = re.search(pattern, text, re.S)
    assert m is not None, pattern
    return m


def limit_groups(section: str) -> list[str]:
    return re.findall(r'<g class="limit[^"]*">.*?</g>', section, re.S)


def tick_labels(section: str) -> list[str]:
    return re.findall(r'<text class="tick"[^>]*>([^<]*)</text>', section)


class Tags(HTMLParser):
    """Every element and attribute name of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attrs: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs.update(name for name, _ in attrs)


def tags_of(page: str) -> Tags:
    parser = Tags()
    parser.feed(page)
    parser.close()
    return parser


def hostile(timeline: dict[str, Any]) -> dict[str, Any]:
    """The timeline with a job that names itself (and says things) in HTML."""
    t = copy.deepcopy(timeline)
    t["command"] = ["python", HOSTILE, HOSTILE_ATTR, "a&b 'q'"]
    for s in t["samples"]:
        for p in s["processes"]:
            p["name"] = f"{HOSTILE}{HOSTILE_ATTR}"
    for w in t["warnings"]:
        w["process"] = HOSTILE
        w["message"] = f"pid 1 ({HOSTILE}{HOSTILE_ATTR}): 65/256 open files"
    if t.get("diagnosis"):
        t["diagnosis"]["message"] = f"failed in {HOSTILE}"
        t["diagnosis"]["fix"] = f"do not run {HOSTILE_ATTR}"
        t["diagnosis"]["warned"]["message"] = HOSTILE
    return t


# -- the recorded timelines ------------------------------------------------------------------------


def test_fixtures_are_small_real_timelines() -> None:
    for path in (FD_LEAK, LOADER):
        assert path.stat().st_size < 200_000, path
        t = load(path)
        assert t["schema_version"] == 1 and t["samples"], path
    assert len({p["pid"] for s in load(LOADER)["samples"] for p in s["processes"]}) == 4
    assert [w["resource"] for w in load(FD_LEAK)["warnings"]] == ["fds"]


@pytest.mark.parametrize("path", [FD_LEAK, LOADER], ids=lambda p: p.stem)
def test_every_expected_plot_is_present(path: Path) -> None:
    page = render_html(load(path))
    found = plots(page)
    assert set(found) == RECORDED_PLOTS
    for ident, section in found.items():
        assert "<svg" in section and ("<polyline" in section or "<circle" in section), ident
    assert page.count('<svg class="chart"') == len(RECORDED_PLOTS)


def test_each_process_is_a_series_with_a_legend() -> None:
    t = load(LOADER)
    pids = {p["pid"] for s in t["samples"] for p in s["processes"]}
    found = plots(render_html(t))
    for ident in ("maps", "fds", "rss", "threads", "cpu"):
        assert len(polylines(found[ident])) == 4, ident
        assert all(f"pid {pid} ·" in found[ident] for pid in pids), ident
    for ident in ("shm", "memory"):
        assert len(polylines(found[ident])) == 1, ident
        assert 'class="legend"' not in found[ident]


def test_limit_lines() -> None:
    fd = plots(render_html(load(FD_LEAK)))
    (nofile,) = limit_groups(fd["fds"])
    assert "off-scale" not in nofile and "RLIMIT_NOFILE = 256" in nofile
    assert "stroke-dasharray" in render_html(load(FD_LEAK)).split("</style>")[0]  # limits are dashed
    # drawn at its height: the last sample (248 fds) just under the line at 256
    limit_y = float(search(r'<line x1="[\d.]+" y1="([\d.]+)"', nofile).group(1))
    last_y = polylines(fd["fds"])[0][-1][1]
    assert limit_y < last_y < limit_y + 10
    loader = plots(render_html(load(LOADER)))
    expected = {
        "maps": "vm.max_map_count = 65,530",
        "fds": "RLIMIT_NOFILE = 20,000",
        "shm": "/dev/shm size = 23.5 GiB",
        "memory": "MemTotal = 23.5 GiB",
    }
    for ident, text in expected.items():
        (group,) = limit_groups(loader[ident])
        assert text in group, ident
        assert "off-scale" in group and "above the scale" in group, ident  # far above what was used
    for ident in ("rss", "threads", "cpu"):
        assert limit_groups(loader[ident]) == [], ident


def test_axes_have_human_units() -> None:
    found = plots(render_html(load(LOADER)))
    assert tick_labels(found["rss"])[:6] == ["0 B", "50 MiB", "100 MiB", "150 MiB", "200 MiB", "250 MiB"]
    assert tick_labels(found["cpu"])[1] == "20%"
    assert "8 s" in tick_labels(found["maps"]) and "100" in tick_labels(found["maps"])


def test_warnings_are_marked_on_their_plot_and_listed() -> None:
    t = load(FD_LEAK)
    (w,) = t["warnings"]
    page = render_html(t)
    found = plots(page)
    markers = re.findall(r'<g class="warning"><title>([^<]*)</title><line class="hit" x1="([\d.]+)"', found["fds"])
    assert len(markers) == 1
    message, x = markers[0]
    assert message == w["message"]
    # at the warning's time: between the samples it falls between
    xs = [p[0] for p in polylines(found["fds"])[0]]
    i = next(i for i, s in enumerate(t["samples"]) if s["t"] >= w["t"])
    assert xs[i - 1] < float(x) <= xs[i] + 0.1
    assert all('class="warning"' not in s for ident, s in found.items() if ident != "fds")
    table = page.split("<h2>Warnings</h2>")[1]
    assert w["message"] in table and "TD153" in table and "65 / 256" in table


def test_header_and_diagnosis() -> None:
    t = load(FD_LEAK)
    page = render_html(t)
    head = page.split("<h2>Resources over time</h2>")[0]
    assert ".venv/bin/python /tmp/wr/fdleak.py" in head
    assert '<span class="fail">exit 1</span>' in head
    assert "<dd>5.2 s</dd>" in head and "<dd>21 (every 0.25 s)</dd>" in head and "<dt>warnings</dt><dd>1</dd>" in head
    box = search(r'<section class="diagnosis">.*?</section>', page).group(0)
    assert "TD153" in box and "[fd-exhausted]" in box and "Too many open files" in box
    assert "Fix:" in box and "ulimit -n" in box
    assert "warned 4 s before the end" in box
    ok = render_html(load(LOADER))
    assert '<span class="ok">exit 0</span>' in ok and 'class="diagnosis"' not in ok


def test_processes_table() -> None:
    t = load(LOADER)
    page = render_html(t)
    table = page.split("<h2>Processes</h2>")[1]
    rows = re.findall(r"<tr><td>(\d+)</td><td>(\d+)</td><td>([^<]*)</td>(.*?)</tr>", table)
    assert [int(r[0]) for r in rows][0] == t["pid"] and len(rows) == 4
    main = rows[0][3]
    peak_rss = max(p["rss"] for s in t["samples"] for p in s["processes"] if p["pid"] == t["pid"])
    peak_maps = max(p["maps"] for s in t["samples"] for p in s["processes"] if p["pid"] == t["pid"])
    assert "222.8 MiB" in main and peak_rss // 2**20 == 222
    assert f"<td>{peak_maps}</td>" in main and "/ 20,000" in main
    assert all(r[2].startswith("pt_data_worker") and int(r[1]) == t["pid"] for r in rows[1:])


# -- escaping, null-only resources, long runs ------------------------------------------------------


@pytest.mark.parametrize("path", [FD_LEAK, LOADER], ids=lambda p: p.stem)
def test_everything_the_job_wrote_is_escaped(path: Path) -> None:
    page = render_html(hostile(load(path)))
    assert "<script" not in page.lower() and "<img" not in page.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in page
    parsed = tags_of(page)
    assert parsed.tags <= {
        *("html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "h3", "pre", "dl", "dt", "dd"),
        *("span", "section", "p", "b", "ul", "li", "table", "thead", "tbody", "tr", "th", "td"),
        *("svg", "g", "line", "text", "rect", "polyline", "circle"),
    }
    assert not [a for a in parsed.attrs if a.startswith("on")]
    assert html.escape(shlex.join(["python", HOSTILE, HOSTILE_ATTR, "a&b 'q'"])) in page  # as a shell takes it back


def test_null_only_resources_are_skipped() -> None:
    t = load(LOADER)
    for s in t["samples"]:
        s["shm_used"] = s["mem_available"] = None
        for p in s["processes"]:
            p["cpu_percent"] = None
    assert set(plots(render_html(t))) == RECORDED_PLOTS - {"cpu", "shm", "memory"}
    t["samples"][10]["processes"][0]["cpu_percent"] = 50.0  # one value: a point, the plot is back
    cpu = plots(render_html(t))["cpu"]
    assert "<circle" in cpu and "<polyline" not in cpu


def test_gpu_and_cgroup_memory_when_sampled() -> None:
    t = load(LOADER)
    t["limits"]["cgroup_memory_bytes"] = 4 * 2**30
    for i, s in enumerate(t["samples"]):
        s["cgroup_memory"] = (1 + i / 10) * 2**30
        s["processes"][0]["gpu_bytes"] = i * 2**20
    found = plots(render_html(t))
    assert set(found) == RECORDED_PLOTS | {"gpu"}
    assert len(polylines(found["gpu"])) == 1 and "MiB" in "".join(tick_labels(found["gpu"]))
    assert "cgroup memory" in found["memory"] and "MemTotal" not in found["memory"]
    (group,) = limit_groups(found["memory"])
    assert "memory.max = 4 GiB" in group and "off-scale" not in group


def test_a_long_run_is_downsampled_and_keeps_its_peaks() -> None:
    t = load(LOADER)
    base = t["samples"]
    span = base[-1]["t"] - base[0]["t"] + t["interval"]
    long = [dict(s, t=s["t"] + k * span) for k in range(600) for s in base]  # 21,000 samples, ~1.5 h
    spike = copy.deepcopy(long[9000])
    spike["processes"][0]["maps"] = 60_000  # one sample near vm.max_map_count
    long[9000] = spike
    t["samples"] = long
    t["ended"] = long[-1]["t"] + 0.1
    page = render_html(t)
    raw = len(json.dumps(t))
    assert len(page) < 600_000 and len(page) < raw / 10, (len(page), raw)
    found = plots(page)
    for ident, section in found.items():
        assert all(len(line) <= MAX_POINTS for line in polylines(section)), ident
    maps = found["maps"]
    assert "off-scale" not in maps and "vm.max_map_count = 65,530" in maps  # the spike brings it in view
    top_y = min(y for line in polylines(maps) for _, y in line)
    tick_y = float(search(r'<text class="tick" x="[\d.]+" y="([\d.]+)"[^>]*>60,000<', maps).group(1)) - 4
    assert top_y == pytest.approx(tick_y, abs=0.2)  # the one sample at 60,000 drawn, not averaged away
    assert "1 h 30 min" in tick_labels(maps) or "1 h" in tick_labels(maps)


def test_downsample_keeps_first_last_and_extremes() -> None:
    points = [(float(i), float((i * 7919) % 1000)) for i in range(50_000)]
    points[31_337] = (31_337.0, 5000.0)
    points[4_242] = (4_242.0, -5.0)
    out = downsample(points, 1000)
    assert len(out) <= 1000 and out[0] == points[0] and out[-1] == points[-1]
    assert (31_337.0, 5000.0) in out and (4_242.0, -5.0) in out
    assert [p[0] for p in out] == sorted(p[0] for p in out)
    assert downsample(points[:500], 1000) == points[:500]


def test_no_samples_and_attached() -> None:
    t = load(FD_LEAK)
    t.update(samples=[], warnings=[], diagnosis=None, command=None, exit_code=None)
    page = render_html(t)
    assert "No samples were taken." in page and f"attached to pid {t['pid']}" in page
    assert "exit status unknown" in page and "<svg" not in page


def test_write_report(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    write_report(load(FD_LEAK), out)
    assert out.read_text(encoding="utf-8") == render_html(load(FD_LEAK))


def test_reports_are_self_contained() -> None:
    for path in (FD_LEAK, LOADER):
        page = render_html(load(path))
        assert not re.search(r"(?:src|href)\s*=|url\(|@import|https?://(?!www\.w3\.org/2000/svg)", page), path
        assert "default-src 'none'" in page
        assert len(page.encode()) < 60_000, path


def test_the_cli_writes_the_report(tmp_path: Path) -> None:
    report = tmp_path / "run.html"
    proc = subprocess.run(
        [sys.executable, "-m", "torchdoctor", "watch", "--interval", "0.1", "--report", str(report), "--"]
        + [sys.executable, "-c", "import time; time.sleep(0.6)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    page = report.read_text(encoding="utf-8")
    assert '<span class="ok">exit 0</span>' in page and {"maps", "fds", "rss"} <= set(plots(page))


# -- a real browser --------------------------------------------------------------------------------


def chromium() -> str:
    """The browser, or why the test cannot run: a failure where `make browser` could have installed it."""
    path = shutil.which("chromium")
    if path:
        return path
    if os.geteuid() == 0 and shutil.which("apt-get"):
        pytest.fail("chromium is not installed: `make browser` (run by `make test`) installs it with apt-get")
    pytest.skip("chromium is not installed, and `make browser` cannot install it (needs root and apt-get)")


def browse(browser: str, page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}"]
    argv += ["--enable-logging=stderr", "--v=0", *args, page.as_uri()]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def console_errors(stderr: str) -> list[str]:
    """The page's console (errors, CSP refusals, uncaught exceptions), not Chromium's own noise (D-Bus...)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def test_the_report_renders_in_a_real_browser(tmp_path: Path) -> None:
    from PIL import Image

    browser = chromium()
    page = tmp_path / "report.html"
    write_report(hostile(load(FD_LEAK)), page)
    shot = tmp_path / "shot.png"
    proc = browse(browser, page, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,2000")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert console_errors(proc.stderr) == []
    assert shot.stat().st_size > 10_000
    with Image.open(shot) as im:
        rgb = im.convert("RGB")
        assert rgb.size == (1280, 2000)
        colours = rgb.getcolors(maxcolors=1 << 20) or []
        assert len(colours) > 50  # text, lines, fills: not a blank or one-colour page
        white = sum(n for n, c in colours if c == (255, 255, 255))
        assert white < 0.97 * 1280 * 2000
        present = {c for _, c in colours}
        assert (0x1F, 0x77, 0xB4) in present  # the process's series
        assert (0xB0, 0x00, 0x20) in present  # the limit lines and the diagnosis

    dom = browse(browser, page, tmp_path / "profile", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-3000:]
    assert console_errors(dom.stderr) == []
    rendered = dom.stdout
    assert rendered.count('<svg class="chart"') == len(RECORDED_PLOTS)
    assert rendered.count('<polyline class="series"') == len(RECORDED_PLOTS)
    assert rendered.count('<g class="warning">') == 1 and rendered.count('<g class="limit') == 4
    assert "<script" not in rendered and "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered
