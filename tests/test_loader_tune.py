"""`torchdoctor loader --tune` on real loaders (tests/fixtures/loader/tune_targets.py), its table and
plot, and (slow) the seed case's prediction against the real failure reproduced by the lab."""

from __future__ import annotations

import json
import time

import pytest

from torchdoctor.probes import ProbeOptions, probe_loader

from .conftest import FIXTURES, run_cli
from .support.lab import slow_requested

pytest.importorskip("torch")

TUNE = FIXTURES / "loader" / "tune_targets.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def slow_only(request: pytest.FixtureRequest) -> None:
    if not slow_requested(request.config):
        pytest.skip("slow: runs with -m slow or TORCHDOCTOR_LAB_SLOW=1")


def test_tune_io_bound_prefers_more_workers_and_plots(tmp_path) -> None:  # type: ignore[no-untyped-def]
    png = tmp_path / "tune.png"
    proc = run_cli(
        "loader",
        f"{TUNE}:io_bound",
        "--tune",
        "--max-workers",
        "4",
        "--tune-seconds",
        "0.4",
        "--plot",
        str(png),
        "--format",
        "json",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    tune = doc["probe"]["tune"]
    measured = {x["num_workers"]: x["samples_per_s"] for x in tune["settings"] if x["prefetch_factor"] in (None, 2)}
    assert len(tune["points"]) == sum(x["runs"] for x in tune["settings"])  # every run is kept, in order
    assert set(measured) >= {0, 1, 2, 4}
    chosen = tune["chosen"]
    assert chosen["num_workers"] in measured and chosen["num_workers"] >= 2  # 4 ms waits: workers overlap them
    assert measured[chosen["num_workers"]] >= 0.98 * max(measured.values()) or chosen["prefetch_factor"] == 4
    assert measured[4] > 1.5 * measured[0]
    assert doc["plot"] == str(png) and png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000


def test_tune_text_shows_the_table_and_svg(tmp_path) -> None:  # type: ignore[no-untyped-def]
    svg = tmp_path / "tune.svg"
    proc = run_cli(
        "loader",
        f"{TUNE}:cpu_bound",
        "--tune",
        "--max-workers",
        "2",
        "--tune-seconds",
        "0.3",
        "--plot",
        str(svg),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "tuning (settings in the order first measured)" in proc.stdout and "★" in proc.stdout
    assert "recommended" in proc.stdout and str(svg) in proc.stdout
    assert svg.read_text().lstrip().startswith(("<?xml", "<svg")) and "num_workers" in svg.read_text()


def test_plot_needs_tune_and_a_known_suffix(tmp_path) -> None:  # type: ignore[no-untyped-def]
    proc = run_cli("loader", f"{TUNE}:io_bound", "--plot", str(tmp_path / "x.png"))
    assert proc.returncode == 2 and "--plot draws the --tune results" in proc.stderr
    from torchdoctor.errors import UsageError
    from torchdoctor.probes.plot import plot_tune

    with pytest.raises(UsageError, match=r"\.png or \.svg"):
        plot_tune({"points": [], "chosen": {}}, tmp_path / "x.jpg")


def test_cli_formats_and_exit_codes() -> None:
    seed = str(FIXTURES / "loader" / "loader_targets.py")
    js = run_cli("loader", f"{seed}:seed", "--parent-start-method", "spawn", "--static", "--format", "json")
    assert js.returncode == 1
    doc = json.loads(js.stdout)
    assert doc["command"] == "loader" and doc["schema_version"] == 1 and doc["summary"]["error"] >= 1
    assert doc["findings"][0]["code"] == "TD511" and doc["probe"]["static"]["storages"]["count"] == 70_000
    md = run_cli(
        "loader",
        f"{seed}:seed",
        "--parent-start-method",
        "spawn",
        "--static",
        "--format",
        "markdown",
        "--fail-on",
        "never",
    )
    assert md.returncode == 0 and md.stdout.startswith("## torchdoctor loader") and "TD511" in md.stdout
    text = run_cli("loader", f"{seed}:seed_fork", "--parent-start-method", "spawn", "--static")
    assert text.returncode == 0 and "TD510 loader-start-method" in text.stdout and "TD511" not in text.stdout


@pytest.mark.slow
def test_seed_prediction_matches_the_real_failure_and_is_faster(slow_only: None) -> None:
    from torchdoctor.explain import explain
    from torchdoctor.lab import get
    from torchdoctor.lab.runner import run

    t0 = time.perf_counter()
    pred = probe_loader(
        f"{FIXTURES / 'loader' / 'loader_targets.py'}:seed", ProbeOptions(parent_start_method="spawn", static=True)
    )
    predicted_s = time.perf_counter() - t0
    real = run(get("map-count-spawn"))
    if real.skipped:
        pytest.skip(real.skipped)
    root = explain(real.text()).root_cause
    assert real.failed and root is not None and root.family == "shm-map-count"
    assert pred.by_code("TD511").family == root.family  # type: ignore[union-attr]
    assert predicted_s < 0.3 * real.seconds, (predicted_s, real.seconds)
