"""``bench --plots DIR``: a picture of the anchor decisions over the steps, and the changes behind them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLOURS = {"W": "#9e9e9e", "C": "#1f77b4", "R": "#2ca02c", "M": "#ff7f0e", "F": "#7f7f7f", "-": "#ffffff"}
LABELS = {"W": "warm-up", "C": "computed (change >= threshold)", "R": "anchored (reused / tail only)",
          "M": "refresh after max_reuse", "F": "final full step", "-": "not asked"}


def plot_decisions(reports: list[dict[str, Any]], path: str | Path, name: str = "dct-anchor", threshold: float | None = None) -> None:
    """One figure for the first run of ``reports``: per guidance branch, a grid of the decision of
    every anchored block at every step, and the per-block relative low-band change (log scale)."""
    import matplotlib  # slow to import: only --plots needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    m = (reports[0].get("strategies") or {}).get(name) if reports else None
    if not m or not m.get("branches"):
        return
    branches = m["branches"]
    codes = list(COLOURS)
    fig, axes = plt.subplots(2, len(branches), figsize=(6.5 * len(branches), 5.5), squeeze=False,
                             gridspec_kw={"height_ratios": [1, 1.3]})
    for col, (branch, rec) in enumerate(branches.items()):
        blocks = list(rec)
        grid = [[codes.index(d) for d in rec[b]["decisions"]] for b in blocks]
        ax = axes[0][col]
        ax.imshow(grid, aspect="auto", interpolation="nearest", cmap=ListedColormap([COLOURS[c] for c in codes]),
                  vmin=-0.5, vmax=len(codes) - 0.5)
        ax.set_yticks(range(len(blocks)), blocks, fontsize=8)
        ax.set_title(f"{name}: decisions, branch {branch}", fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax = axes[1][col]
        for b in blocks:
            ys = rec[b]["change"]
            xs = [i for i, y in enumerate(ys) if y is not None and y > 0]
            if xs:
                ax.semilogy(xs, [ys[i] for i in xs], ".-", lw=0.8, ms=3, label=b)
        if threshold is not None:
            ax.axhline(threshold, color="k", ls="--", lw=0.8, label="threshold")
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel("relative low-band change", fontsize=8)
        ax.legend(fontsize=7)
    fig.legend(handles=[Patch(color=COLOURS[c], label=LABELS[c]) for c in codes], loc="lower center", ncol=3, fontsize=7)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=80)
    plt.close(fig)
