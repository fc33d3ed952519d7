"""Offline fitting from recorded trajectories: learned gates and semantic position clusters.

``Recorder`` is a strategy that computes everything in full and records, per layer, step and
position (text) or batch row (UNet), the relative change of the layer's output since the step
before. From those rates:

* ``gate_from_rates``: per layer, the share of states that moved less than ``threshold`` at each
  step, fitted by logistic regression on the time embedding (``gate.fit_gates``);
* ``clusters_from_rates``: k-means over each position's mean log change rate per layer (text).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import torch

import diffaccel
from diffaccel import hookimpl
from diffaccel.contract.capabilities import TOKEN_POSITIONS

from .gate import Gate, fit_gates, schedule_fraction


@attrs.define(eq=False)
class RecorderState:
    """What the recorder keeps for one generation and guidance branch."""

    prev: dict[int, torch.Tensor] = attrs.Factory(dict)
    """Per layer index, its output at the last step."""
    rates: dict[int, dict[int, torch.Tensor]] = attrs.Factory(dict)
    """Per layer index and step, the relative change of each state since the step before."""


class Recorder:
    """Computes every layer in full; records relative changes per (layer, step, position or row)."""

    name = "time-anchor-recorder"

    def __init__(self):
        self.runs: list[dict[str, Any]] = []  # one per finished generation (and branch)

    @hookimpl
    def diffaccel_new_state(self, run) -> RecorderState:
        return RecorderState()

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        st = run.state(self)
        out = layer.compute(hidden)
        main = out[0] if isinstance(out, tuple) else out
        per_position = TOKEN_POSITIONS in run.capabilities  # a rate per position, else per row
        cur = main.float().reshape(main.shape[0], main.shape[1], -1) if per_position else main.float().reshape(main.shape[0], 1, -1)
        prev = st.prev.get(layer.index)
        if prev is not None and prev.shape == cur.shape:
            rate = torch.linalg.vector_norm(cur - prev, dim=-1) / torch.linalg.vector_norm(prev, dim=-1).clamp(min=1e-6)
            st.rates.setdefault(layer.index, {})[run.step] = rate.flatten().cpu()
        st.prev[layer.index] = cur.clone()
        return out

    @hookimpl
    def diffaccel_run_end(self, run):
        for branch in ("main", "uncond", "cond"):
            saved, run.branch = run.branch, branch
            st = run.state(self, factory=lambda _r: None)
            run.branch = saved
            if st is not None and st.rates:
                names = layer_names(run.info.as_dict())
                L = len(names)
                steps = sorted(st.rates[0])
                # rates: (L, steps, states); step 0 has no predecessor
                rates = torch.stack([torch.stack([st.rates[i][s] for s in steps]) for i in range(L)])
                self.runs.append({"layers": names, "num_steps": run.num_steps,
                                  "steps": steps, "rates": rates})


def layer_names(info: dict[str, Any]) -> list[str]:
    """Layer names of a run or model (the text adapter's run info has only their number)."""
    return list(info.get("layers") or [f"block.{i}" for i in range(info["n_layers"])])


def record(config_path: str, seeds: int = 3) -> tuple[Recorder, Any]:
    """Run the config's [model] without its strategies on ``seeds`` seeds, recording changes."""
    run = diffaccel.Run(config_path)  # the config read, its adapter found; the model loads below
    cfg, rec = run.config, Recorder()
    with diffaccel.apply(run.pipe, strategies=[rec]):  # the recorder alone, no [guard] of the config
        for k in range(seeds):
            run.adapter.run(run.pipe, cfg, cfg.model.seed + k * cfg.model.batch, progress=False)
    return rec, cfg


def config_threshold(cfg, default: float = 0.02) -> float:
    for s in cfg.strategies:
        if s.name == "time-anchor":
            return s.config.threshold
    return default


def gate_from_rates(runs: list[dict[str, Any]], threshold: float) -> Gate:
    """Fit one gate per layer to the share of states that moved less than ``threshold``."""
    times, labels = [], []
    for r in runs:
        frac = schedule_fraction(r["num_steps"])[r["steps"]]
        times.append(frac)
        labels.append((r["rates"] < threshold).float().mean(-1))  # (L, steps)
    gate = fit_gates(torch.cat(times), torch.cat(labels, dim=1), runs[0]["layers"])
    gate.meta = {"threshold": threshold, "runs": len(runs)}
    return gate


def clusters_from_rates(runs: list[dict[str, Any]], k: int, iters: int = 50) -> dict[str, Any]:
    """k-means over each position's profile of mean log change rate per layer (text runs)."""
    feats = torch.stack([r["rates"].clamp(min=1e-8).log().mean(1) for r in runs]).mean(0).T  # (N, L)
    n = feats.shape[0]
    k = min(k, n)
    order = feats.mean(1).argsort()
    centers = feats[order[torch.linspace(0, n - 1, k).round().long()]].clone()  # deterministic spread
    for _ in range(iters):
        assign = torch.cdist(feats, centers).argmin(1)
        for c in range(k):
            members = feats[assign == c]
            if members.numel():
                centers[c] = members.mean(0)
    assign = torch.cdist(feats, centers).argmin(1)
    used = sorted(set(assign.tolist()))  # renumber so that ids are 0..k'-1
    remap = {c: i for i, c in enumerate(used)}
    return {"format": "time-anchor-clusters/1", "length": n, "n_clusters": len(used),
            "assign": [remap[int(a)] for a in assign], "centers": centers[used].tolist()}


def write_json(data: dict[str, Any], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1))
