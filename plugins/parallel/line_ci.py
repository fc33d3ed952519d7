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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json")
    ap.add_argument("entry", nargs="+", help="probe spec names of the entries to place against the line")
    ap.add_argument("--at", type=float, nargs="*", help="steps at which to read the line, one per entry")
    ap.add_argument("--resamples", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    data = json.load(open(a.json))["entries"]
    g = torch.Generator().manual_seed(a.seed)

    def logppl(name: str, idx: torch.Tensor) -> torch.Tensor:
        nll, tok = torch.tensor(data[name]["nll"], dtype=torch.float64), torch.tensor(data[name]["tokens"], dtype=torch.float64)
        return nll[idx].sum(-1) / tok[idx].sum(-1)  # log gen_ppl: the mean nll per judged token

    names = {int(k.split("=")[1]): k for k in data if k.startswith("steps=")}
    names[128] = "baseline"
    n = len(data["baseline"]["nll"])
    full = torch.arange(n)[None]
    boot = torch.randint(0, n, (a.resamples, n), generator=g)
    print(f"{n} samples; line: {', '.join(f'{k} steps {math.exp(float(logppl(v, full))):.1f}' for k, v in sorted(names.items()))}")
    for i, entry in enumerate(a.entry):
        steps = sum(data[entry]["steps_run"]) / n
        x = a.at[i] if a.at else steps
        for idx, tag in ((full, "point"), (boot, "boot")):
            peers = {k: logppl(v, idx) for k, v in names.items()}
            d = (logppl(entry, idx) - line_at(x, peers)).exp() - 1
            if tag == "point":
                point, ppl, line = float(d), math.exp(float(logppl(entry, idx))), math.exp(float(line_at(x, peers)))
            else:
                lo, hi = torch.quantile(d, torch.tensor([0.025, 0.975], dtype=d.dtype)).tolist()
                below = float((d < 0).double().mean())
        print(f"{entry}: {steps:.1f} steps run, gen_ppl {ppl:.1f}; line at {x:.1f} steps {line:.1f}; "
              f"difference {100 * point:+.1f}% (95% CI {100 * lo:+.1f}% to {100 * hi:+.1f}%), below the line in {100 * below:.0f}% of resamples")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
