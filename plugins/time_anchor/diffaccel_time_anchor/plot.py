"""``bench --plots``: the anchored fraction per layer over the steps, averaged over the runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def plot_anchored(reports: list[dict[str, Any]], name: str, path: str | Path) -> None:
    import matplotlib  # slow to import: only --plots needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # a run the cost gate kept plain has its verdict but no per-step record: nothing to draw
    runs = [m for r in reports if "anchored_by_step" in (m := r.get("strategies", {}).get(name, {}))]
    if not runs:
        return
    grid = np.mean([np.asarray(m["anchored_by_step"], dtype=float) for m in runs], axis=0)  # (layers, steps)
    layers = runs[0]["layers"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 0.45 * len(layers) + 2.2), gridspec_kw={"width_ratios": [3, 1]})
    im = ax.imshow(grid, aspect="auto", origin="lower", vmin=0, vmax=1, cmap="viridis", interpolation="nearest")
    ax.set_yticks(range(len(layers)), layers, fontsize=8)
    ax.set_xlabel("step")
    ax.set_title(f"anchored fraction per layer ({len(runs)} runs)")
    fig.colorbar(im, ax=ax, fraction=0.04)
    bx.barh(range(len(layers)), grid.mean(1), color="tab:blue")
    bx.set_yticks(range(len(layers)), [])
    bx.set_xlim(0, 1)
    bx.set_xlabel("mean over steps")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
