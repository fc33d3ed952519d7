"""Learned anchor gates: per layer, sigmoid(W . E(t) + b) on an embedding of the time step.

``t`` is the position in the sampler's schedule, ``step / (steps - 1)`` in [0, 1] (the same for
text and images, whatever the sampler calls its time). ``E(t)`` is ``[t, cos(pi k t), sin(pi k t)
for k = 1..K]``; with K = 8 a layer has 17 weights and a bias. ``fit_gates`` fits them by logistic
regression on labels recorded along trajectories (1 where a state's relative change per step was
below the threshold); the file is JSON.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from diffaccel.contract.errors import ConfigValueError

FREQS = 8


def time_embedding(t: torch.Tensor, freqs: int = FREQS) -> torch.Tensor:
    """(n,) in [0, 1] -> (n, 1 + 2 * freqs)."""
    t = t.float().reshape(-1, 1)
    k = torch.arange(1, freqs + 1, dtype=torch.float32, device=t.device) * math.pi
    return torch.cat([t, torch.cos(k * t), torch.sin(k * t)], dim=1)


def schedule_fraction(num_steps: int) -> torch.Tensor:
    """The gate's time of each step of a run: step / (steps - 1)."""
    return torch.arange(num_steps, dtype=torch.float32) / max(1, num_steps - 1)


class Gate:
    """Per-layer gate parameters: ``weight`` (L, 1 + 2 * freqs), ``bias`` (L,)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, layers: list[str], meta: dict[str, Any] | None = None):
        self.weight, self.bias, self.layers = weight.float(), bias.float(), list(layers)
        self.meta = meta or {}

    @property
    def n_layers(self) -> int:
        return self.weight.shape[0]

    def probs(self, num_steps: int) -> torch.Tensor:
        """Gate value per (layer, step) of a run of ``num_steps`` steps: (L, steps)."""
        e = time_embedding(schedule_fraction(num_steps), (self.weight.shape[1] - 1) // 2)
        return torch.sigmoid(self.weight @ e.T + self.bias[:, None])

    def check(self, info: dict[str, Any]) -> None:
        """Reject a gate fitted on a model with other layers (``setup``)."""
        n = info.get("n_layers")
        if n is not None and n != self.n_layers:
            raise ConfigValueError("gate", f"the gate file has {self.n_layers} layers but the model has {n}; "
                                           f"calibrate it on this model (diffaccel time-anchor-calibrate)")
        names = info.get("layers")
        if names is not None and self.layers and list(names) != self.layers:
            raise ConfigValueError("gate", f"the gate file's layers {self.layers} are not the model's {list(names)}")

    def save(self, path: str | Path) -> None:
        data = {"format": "time-anchor-gate/1", "layers": self.layers, "n_layers": self.n_layers,
                "freqs": (self.weight.shape[1] - 1) // 2, "weight": self.weight.tolist(),
                "bias": self.bias.tolist(), **self.meta}
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "Gate":
        try:
            data = json.loads(Path(path).read_text())
            weight = torch.tensor(data["weight"], dtype=torch.float32)
            bias = torch.tensor(data["bias"], dtype=torch.float32)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigValueError("gate", f"{path} is not a gate file ({exc.__class__.__name__}: {exc})") from None
        if weight.dim() != 2 or bias.shape != (weight.shape[0],) or weight.shape[1] % 2 != 1:
            raise ConfigValueError("gate", f"{path}: 'weight' must be (layers, 1 + 2 * freqs) and 'bias' (layers,)")
        n = data.get("n_layers", weight.shape[0])
        if n != weight.shape[0]:
            raise ConfigValueError("gate", f"{path}: 'n_layers' is {n} but 'weight' has {weight.shape[0]} rows")
        meta = {k: v for k, v in data.items() if k not in ("weight", "bias", "layers", "n_layers", "freqs", "format")}
        return cls(weight, bias, data.get("layers") or [], meta)


def fit_gates(times: torch.Tensor, labels: torch.Tensor, layers: list[str], *, iters: int = 300,
              weight_decay: float = 1e-3) -> Gate:
    """Logistic regression per layer. ``times`` (n,) in [0, 1]; ``labels`` (L, n) in [0, 1]
    (the share of a layer's states found settled at that time)."""
    e = time_embedding(times)
    L = labels.shape[0]
    w = torch.zeros(L, e.shape[1], requires_grad=True)
    b = torch.zeros(L, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=iters, line_search_fn="strong_wolfe")
    y = labels.float()

    def closure():
        opt.zero_grad()
        logits = w @ e.T + b[:, None]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y) + weight_decay * (w**2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return Gate(w.detach(), b.detach(), layers)
