"""Bus bandwidth against message size, as PNG or SVG (matplotlib, optional)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..probes.plot import FORMATS
from ..units import human_bytes


def plot_bandwidth(rows: Sequence[Mapping[str, Any]], path: str | Path, title: str = "") -> Path:
    out = Path(path)
    if out.suffix.lower() not in FORMATS:
        raise UsageError(f"--plot {str(out)!r}: use a .png or .svg file name")
    if not rows:
        raise UsageError("--plot: no bandwidth was measured (the bandwidth step did not run)")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'torchdoctor[plot]'") from None
    sizes = [r["bytes"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(sizes, [r["busbw"] / 1e9 for r in rows], marker="o", label="bus bandwidth")
    ax.plot(sizes, [r["algbw"] / 1e9 for r in rows], marker=".", linestyle="--", label="algorithm bandwidth")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [human_bytes(s) for s in sizes])
    ax.set_xlabel("all_reduce message size")
    ax.set_ylabel("GB/s (slowest rank)")
    ax.set_title(f"torchdoctor dist: {title}" if title else "torchdoctor dist")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out
