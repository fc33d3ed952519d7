"""The stability curve that ``diffaccel bench --plots DIR`` writes for an swd entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _mean_curve(curves: list[list[float]]) -> list[float]:
    """Mean over runs, step by step; a run that stopped early keeps its last value."""
    n = max(len(c) for c in curves)
    padded = [c + [c[-1]] * (n - len(c)) for c in curves if c]
    return [sum(col) / len(padded) for col in zip(*padded)]


def stability_curve(reports: list[dict[str, Any]], path: str | Path) -> None:
    """PNG: fraction of positions stable after each step, and fraction computed at each step.

    One thin line per run, the mean in bold; the legend gives the mean fraction computed.
    """
    import matplotlib  # slow to import: only --plots needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r["strategies"]["swd"] for r in reports if "swd" in r.get("strategies", {})]
    if not runs:
        return
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    for key, color, label in (("stable_per_step", "tab:blue", "stable"), ("computed_per_step", "tab:orange", "computed")):
        curves = [m[key] for m in runs if m[key]]
        for c in curves:
            ax.plot(range(len(c)), c, color=color, alpha=0.25, linewidth=0.8)
        mean = _mean_curve(curves)
        avg = sum(m["mean_computed"] for m in runs) / len(runs)
        extra = f" (mean {avg:.0%})" if key == "computed_per_step" else ""
        ax.plot(range(len(mean)), mean, color=color, linewidth=2, label=f"{label}{extra}")
    m = runs[0]
    ax.set_title(f"swd ({m['sampler']}): tau={m['tau']}, K={m['K']}, R={m['R']}"
                 + (f"->{m['R_end']}" if m["R_end"] is not None else "") + f", {len(runs)} run(s)", fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("fraction of positions")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="center right")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
