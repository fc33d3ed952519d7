"""``tune``'s report folder: every trial's speed against each budgeted metric, the feasible front,
the chosen point and the config as given (held-out), as ``index.md`` with one PNG per metric."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .budget import Budget
from .search import feasible, feasible_front


def write_report(folder: Path, study: Any, budgets: Sequence[Budget], figures: dict[str, Any], chosen: str | None,
                 shipped: str) -> Path:
    import matplotlib  # deferred: a heavy import only the report needs

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trials = [t for t in study.trials if t.values is not None or t.state.name == "PRUNED"]
    front = {t.number for t in feasible_front(study)}
    lines = ["# diffaccel tune", "", f"Budget: {' and '.join(f'`{b.text}`' for b in budgets)}. "
             f"{len(study.trials)} trials on the tuning seeds ({sum('pruned_after' in t.user_attrs for t in study.trials)} "
             "stopped early, far over budget); the held-out figures below come from the ordinary bench on seeds the "
             "search never saw.", ""]
    for i, b in enumerate(budgets, start=1):
        fig, ax = plt.subplots(figsize=(6, 4))
        for label, pick, style in (("over budget", lambda t: t.values is not None and not feasible(t), dict(c="#d62728", marker="x")),
                                   ("within budget", lambda t: t.values is not None and feasible(t) and t.number not in front,
                                    dict(c="#1f77b4", marker="o")),
                                   ("feasible front", lambda t: t.number in front, dict(c="#2ca02c", marker="D"))):
            pts = [(t.values[0], t.values[i]) for t in trials if pick(t)]
            if pts:
                ax.scatter(*zip(*pts), label=label, s=24, **style)
        for name, style in ((chosen, dict(c="k", marker="*", s=160)), (shipped, dict(c="#ff7f0e", marker="s", s=60))):
            f = figures.get(name) if name else None
            q = (f or {}).get("quality", {}).get(b.metric)
            if f and q and q.get("value") is not None:
                speed = list(f["speedup"].values())[-1]
                ax.scatter([speed], [q["value"]], label=f"{'chosen' if name == chosen else 'as given'} (held-out)", **style)
        base = next((f["quality"][b.metric]["baseline"] for f in figures.values() if b.metric in f.get("quality", {})), None)
        if base is not None:
            try:
                ax.axhline(b.limit(base), color="grey", ls="--", lw=1, label=f"budget {b.text}")
            except ValueError:
                pass
        ax.set_xlabel("speedup (tuning seeds; held-out points at the configured batch)")
        ax.set_ylabel(b.metric)
        ax.legend(fontsize=7)
        fig.tight_layout()
        png = f"trials-{b.metric}.png"
        fig.savefig(folder / png, dpi=100)
        plt.close(fig)
        lines += [f"![{b.metric} against speedup]({png})", ""]
    if figures:
        metrics = [b.metric for b in budgets]
        batches = sorted({bb for f in figures.values() for bb in f["speedup"]})
        lines += ["| entry | " + " | ".join(f"speedup b{bb}" for bb in batches) + " | " + " | ".join(metrics) + " | within budget |",
                  "| --- " * (2 + len(batches) + len(metrics)) + "|"]
        for name, f in figures.items():
            tag = _tag(name, chosen, shipped)
            qs = []
            for m in metrics:
                q = f["quality"].get(m, {})
                iv = q.get("interval")
                qs.append("-" if q.get("value") is None else f"{q['value']:.4g}" + (f" ({iv[0]:.4g}-{iv[1]:.4g})" if iv else ""))
            lines.append(f"| {name}{tag} | " + " | ".join(f"{f['speedup'].get(bb, float('nan')):.2f}x" for bb in batches)
                         + " | " + " | ".join(qs) + f" | {'yes' if all(f['met'].values()) else 'no'} |")
    else:
        lines.append("No trial met the budget on the tuning seeds: nothing was re-measured on held-out seeds.")
    path = folder / "index.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def tune_blocks(folder: Path, title: str, command: str) -> list[tuple]:
    """A tune report folder (its ``tune.json``) as report blocks for a combined page
    (``diffaccel.bench.report.combine``'s ``extra``): the command, the budget, the held-out figures of
    every re-measured point and the config as given, and the trial plots (paths relative to
    ``folder``)."""
    import json

    data = json.loads((folder / "tune.json").read_text())
    chosen, shipped, figures = data.get("chosen"), data.get("shipped"), data.get("figures", {})
    budgets = data["budgets"]
    metrics = [_metric(t) for t in budgets]
    trials = data.get("trials")
    what = (f"{trials} trials on {len(data['tune_seeds'])} tuning seed batches" if trials is not None and data.get("tune_seeds")
            else "the trials of its study")
    blocks: list[tuple] = [("h2", title), ("pre", command),
                           ("p", f"Budget: {' and '.join(budgets)}. {what}; the points below were then re-measured by the "
                                 "ordinary bench on held-out seeds the search never saw"
                                 + (f" (from {data['heldout_seed']}, {data['heldout']} samples)" if data.get("heldout") else "")
                                 + ". Acceptance reads the held-out point estimate at the configured batch against the budget; "
                                   "the interval beside it is the bench's 95% bootstrap interval over the seeds."
                                 + _sessions_text(data.get("sessions", [])))]
    if not figures:
        return blocks + [("p", "No trial met the budget on the tuning seeds: nothing was re-measured.")]
    batches = sorted({int(b) for f in figures.values() for b in f["speedup"]})
    head = ["entry", *[f"speedup b{b}" for b in batches], *metrics, "within budget"]
    rows = []
    for name, f in figures.items():
        tag = _tag(name, chosen, shipped)
        cells = [f"{name}{tag}"]
        for b in batches:
            v = f["speedup"].get(str(b), f["speedup"].get(b))
            iv = (f.get("speedup_ci") or {}).get(str(b)) or (f.get("speedup_ci") or {}).get(b)
            cells.append("-" if v is None else f"{v:.2f}x" + (f" [{iv[0]:.2f}-{iv[1]:.2f}]" if iv else ""))
        for m in metrics:
            q = f["quality"].get(m, {})
            iv = q.get("interval")
            cells.append("-" if q.get("value") is None else f"{q['value']:.4g} (baseline {q['baseline']:.4g})"
                         + (f" [{iv[0]:.4g}-{iv[1]:.4g}]" if iv else ""))
        cells.append("yes" if all(f["met"].values()) else "no")
        rows.append(cells)
    blocks.append(("table", head, rows))
    if chosen is None:
        blocks.append(("p", "None of the re-measured points met the budget faster than the baseline: no config was written."))
    for m in metrics:
        if (folder / f"trials-{m}.png").is_file():
            blocks.append(("img", f"trials-{m}.png", f"{m} against speedup, every trial"))
    return blocks


def _tag(name: str, chosen: str | None, shipped: str) -> str:
    """How an entry of the held-out table is marked: the chosen point, the config as given, both."""
    return {(True, True): " (as given, chosen)", (True, False): " (chosen)", (False, True): " (as given)"}.get(
        (name == chosen, name == shipped), "")


def _sessions_text(sessions: list[dict]) -> str:
    """How long the tune took, from its recorded sessions (trials and held-out benches)."""
    if not sessions:
        return ""
    total = sum(x["wall_s"] for x in sessions)
    if len(sessions) == 1:
        return f" The tune took {total / 60:.1f} minutes of wall time (one session, started {sessions[0]['started']})."
    return (f" The tune took {total / 60:.1f} minutes of wall time over {len(sessions)} sessions (interrupted and resumed): "
            + ", ".join(f"{x['wall_s'] / 60:.1f} min ({x['trials_after'] - x['trials_before']} trials)" for x in sessions) + ".")


def _metric(budget_text: str) -> str:
    from .budget import parse

    return parse(budget_text).metric
