"""How far an entry's gen_ppl sits from the fewer-steps line, with a paired bootstrap interval.

    python plugins/parallel/line_ci.py runs/ci/probe.json "parallel: rule=factor factor=5 spacing=6" [--at 36.8]

Reads ``probe.py --json`` output (every sample's judge nll and tokens, per entry, on the same
seeds). The line is the ``steps=N`` entries and the baseline (128 steps): log gen_ppl linear in
the steps between the two peers around ``--at`` (default: the entry's mean steps run, i.e. equal
steps; pass the steps the line needs for the entry's wall-clock speedup to compare at equal
speed). The bootstrap resamples seeds, the same ones for the entry and every peer (paired), and
recomputes each gen_ppl (exp of summed nll over summed tokens) and the line. Prints the entry's
gen_ppl, the line's, their ratio less 1 with a 95% percentile interval, and the share of
resamples where the entry is below the line.
"""

from __future__ import annotations

import argparse
import json
import math

import torch


def line_at(x: float, peers: dict[int, torch.Tensor]) -> torch.Tensor:
    """log gen_ppl of the line at x steps, linear between the neighbouring peers (steps -> log ppl)."""
    ns = sorted(peers)
    if not ns[0] <= x <= ns[-1]:
        raise SystemExit(f"line_ci.py: {x:.1f} steps is outside the peers' {ns[0]} to {ns[-1]}")
    hi = next(n for n in ns if n >= x)
    lo = max((n for n in ns if n <= x), default=hi)
    if hi == lo:
        return peers[lo]
    w = (x - lo) / (hi - lo)
    return (1 - w) * peers[lo] + w * peers[hi]


def log_ppl(entry: dict, idx: torch.Tensor) -> torch.Tensor:
    """log gen_ppl (the mean nll per judged token) of an entry's samples ``idx`` (..., n)."""
    nll, tok = (torch.tensor(entry[k], dtype=torch.float64) for k in ("nll", "tokens"))
    return nll[idx].sum(-1) / tok[idx].sum(-1)


def line_entries(data: dict) -> dict[int, str]:
    """Steps -> entry name of the line's points: every ``steps=N`` entry and the baseline (128)."""
    return {**{int(k.split("=")[1]): k for k in data if k.startswith("steps=")}, 128: "baseline"}


def against_line(data: dict, entry: str, at: float | None = None, resamples: int = 4000, seed: int = 0) -> dict:
    """The entry's gen_ppl against the line at ``at`` steps (default: its mean steps run):
    ``diff`` (ratio less 1), its 95% interval ``lo``, ``hi`` and the share ``below`` of resamples
    where the entry is under the line, seeds resampled the same for every entry (paired)."""
    peers = line_entries(data)
    n = len(data["baseline"]["nll"])
    steps = sum(data[entry]["steps_run"]) / n
    x = steps if at is None else at

    def diff(idx):
        line = line_at(x, {k: log_ppl(data[v], idx) for k, v in peers.items()})
        return (log_ppl(data[entry], idx) - line).exp() - 1, line

    full = torch.arange(n)
    point, line = diff(full)
    boot, _ = diff(torch.randint(0, n, (resamples, n), generator=torch.Generator().manual_seed(seed)))
    lo, hi = torch.quantile(boot, torch.tensor([0.025, 0.975], dtype=boot.dtype)).tolist()
    return {"steps": steps, "at": x, "gen_ppl": math.exp(float(log_ppl(data[entry], full))), "line": math.exp(float(line)),
            "diff": float(point), "lo": lo, "hi": hi, "below": float((boot < 0).double().mean())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json")
    ap.add_argument("entry", nargs="+", help="probe spec names of the entries to place against the line")
    ap.add_argument("--at", type=float, nargs="*", help="steps at which to read the line, one per entry")
    ap.add_argument("--resamples", type=int, default=4000)
    a = ap.parse_args(argv)
    data = json.load(open(a.json))["entries"]
    n = len(data["baseline"]["nll"])
    peers = sorted(line_entries(data).items())
    print(f"{n} samples; line: " + ", ".join(f"{k} steps {math.exp(float(log_ppl(data[v], torch.arange(n)))):.1f}" for k, v in peers))
    for i, entry in enumerate(a.entry):
        r = against_line(data, entry, a.at[i] if a.at else None, a.resamples)
        print(f"{entry}: {r['steps']:.1f} steps run, gen_ppl {r['gen_ppl']:.1f}; line at {r['at']:.1f} steps {r['line']:.1f}; "
              f"difference {100 * r['diff']:+.1f}% (95% CI {100 * r['lo']:+.1f}% to {100 * r['hi']:+.1f}%), "
              f"below the line in {100 * r['below']:.0f}% of resamples")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
