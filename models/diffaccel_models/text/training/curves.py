"""The reference model's training curves (``diffaccel train text``): the loss, and the entropy of the
predictions per noise level at each checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_curves(path: Path, losses: list[float], entropy_history: list[tuple[int, list[float]]], kind: str) -> None:
    import matplotlib  # slow to import: only the training curves need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    k = max(1, len(losses) // 100)
    smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
    a.plot(losses, alpha=0.3, label="loss")
    a.plot(np.arange(len(smooth)) + k - 1, smooth, label=f"mean of {k}")
    a.set(xlabel="step", ylabel="cross-entropy", title=f"{kind} model: training loss")
    a.legend()
    for step, ent in entropy_history:
        b.plot((np.arange(len(ent)) + 0.5) / len(ent), ent, marker="o", label=f"step {step}")
    b.set(xlabel="noise level (mask rate time / t/T)", ylabel="mean entropy (nats)", title="token-confidence entropy per noise level")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
