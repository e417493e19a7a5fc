"""Throughput against num_workers, from a ``--tune`` run, as PNG or SVG (matplotlib, optional)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import UsageError

FORMATS = (".png", ".svg")


def plot_tune(tune: dict[str, Any], path: str | Path, title: str = "") -> Path:
    """Draw each setting's agreed throughput (numbered in the order the search first took them), every
    run when some were repeated, and mark the choice."""
    out = Path(path)
    if out.suffix.lower() not in FORMATS:
        raise UsageError(f"--plot {str(out)!r}: use a .png or .svg file name")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'torchdoctor[plot]'") from None
    points = tune["points"]
    settings = tune.get("settings") or [{**r, "runs": 1} for r in points]  # a record from before repeats
    first: dict[tuple[Any, Any], int] = {}
    for r in points:
        first.setdefault((r["num_workers"], r.get("prefetch_factor")), r.get("step", 0))
    rows = [x for x in settings if x.get("prefetch_factor") in (None, 2) or x["num_workers"] == 0]
    extra = [x for x in settings if x not in rows]
    chosen = tune["chosen"]
    by_w: dict[int, dict[str, Any]] = {}
    for x in rows:
        by_w.setdefault(x["num_workers"], x)
    xs = sorted(by_w)
    ys = [by_w[w]["samples_per_s"] for w in xs]
    runs = [r for r in points if r.get("prefetch_factor") in (None, 2) or r["num_workers"] == 0]

    fig, ax = plt.subplots(figsize=(7.5, 4.4), dpi=130)
    ax.plot(xs, ys, "-", color="#9aa5b1", linewidth=1.5, zorder=1)
    if any(x.get("runs", 1) > 1 for x in rows):
        ax.scatter(
            [r["num_workers"] for r in runs],
            [r["samples_per_s"] for r in runs],
            s=12,
            color="#9aa5b1",
            zorder=1,
            label="each run",
        )
    ax.scatter(xs, ys, s=46, color="#2f6db3", zorder=2, label="agreed (prefetch_factor 2)")
    for w in xs:
        step = first.get((w, by_w[w].get("prefetch_factor")), 0)
        ax.annotate(
            f"#{step}",
            (w, by_w[w]["samples_per_s"]),
            textcoords="offset points",
            xytext=(0, 7),
            ha="center",
            fontsize=7,
            color="#52606d",
        )
    for x in extra:
        ax.scatter(
            [x["num_workers"]],
            [x["samples_per_s"]],
            s=46,
            marker="D",
            color="#e8a33d",
            zorder=2,
            label=f"prefetch_factor {x['prefetch_factor']}",
        )
    cw, cy = chosen["num_workers"], chosen["samples_per_s"]
    ax.scatter([cw], [cy], s=260, marker="*", color="#d64545", zorder=3, label="recommended")
    label = f"num_workers={cw}"
    if chosen.get("prefetch_factor") not in (None, 2):
        label += f", prefetch_factor={chosen['prefetch_factor']}"
    right = cw > (xs[0] + xs[-1]) / 2
    ax.annotate(
        f"{label}\n{cy:,.0f} samples/s",
        (cw, cy),
        textcoords="offset points",
        xytext=(-14, 12) if right else (14, 12),
        ha="right" if right else "left",
        fontsize=9,
        color="#d64545",
        fontweight="bold",
    )
    ax.set_xlabel("num_workers")
    ax.set_ylabel("samples / s")
    ax.set_xticks(xs)
    pad = max(0.5, (xs[-1] - xs[0]) * 0.04)
    ax.set_xlim(xs[0] - pad, xs[-1] + pad)
    ax.set_ylim(bottom=0, top=max(ys + [cy]) * 1.22)
    ax.grid(True, alpha=0.3)
    ax.set_title(title or "DataLoader throughput against num_workers", fontsize=11)
    n, secs = len(points), tune.get("seconds")
    ax.text(
        0.99,
        0.02,
        f"{n} runs of {len(settings)} settings in {secs:.0f} s (adaptive search, max "
        f"{tune.get('max_workers')} workers)",
        transform=ax.transAxes,
        ha="right",
        va="bottom",
        fontsize=7,
        color="#52606d",
    )
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), loc="upper left", fontsize=8, frameon=False)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
