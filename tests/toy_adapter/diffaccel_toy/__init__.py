"""A toy adapter from outside diffaccel: a U-shaped MLP denoiser over vectors, DDIM sampling.

The denoiser predicts the noise of a vector x (B, dim) at time t through five blocks with skip
connections, an encoder-decoder stack like a UNet's, flattened:

    down.0 (depth 0) -> down.1 (depth 1) -> mid (depth 2) -> up.1 (depth 1, reads down.1)
    -> up.0 (depth 0, reads down.0) -> noise prediction

Weights are random (seeded): the toy exists to prove the adapter contract, not to sample
anything meaningful. It declares only ``block-stack``: its blocks have depths and kinds, and a
block may be answered with its cached output. It knows nothing of token positions, logits or
feature maps, so strategies needing those are refused by ``diffaccel check``.

What the adapter writes is only the model: its run drives the core's ``RunSequence`` (which
calls the hooks in order, counts every computed and skipped block, honours ``run.stop``), and
it passes ``diffaccel.testing.check_adapter`` (tests/test_conformance.py).
"""

from __future__ import annotations

import math
import sys
from contextlib import contextmanager
from typing import Any

import attrs
import torch

from diffaccel import Accelerator, Layer, RunState
from diffaccel.adapterkit import RunSequence, StepModel
from diffaccel.contract.capabilities import BLOCK_STACK
from diffaccel.contract.errors import DiffaccelError
from diffaccel.contract.validators import positive

__version__ = "0.3.1"

BLOCKS = (("down.0", 0, "down"), ("down.1", 1, "down"), ("mid", 2, "mid"), ("up.1", 1, "up"), ("up.0", 0, "up"))


@attrs.frozen(kw_only=True)
class ToyOptions:
    """Keys of ``[model]`` only the toy adapter reads."""

    dim: int = attrs.field(default=8, validator=positive)
    """Length of the generated vectors."""
    hidden: int = attrs.field(default=32, validator=positive)
    """Width of the MLP blocks."""


class ToyDenoiser(torch.nn.Module):
    def __init__(self, dim: int, hidden: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)

        def lin(i, o):
            layer = torch.nn.Linear(i, o)
            with torch.no_grad():
                layer.weight.copy_(torch.randn(o, i, generator=g) / math.sqrt(i))
                layer.bias.copy_(0.1 * torch.randn(o, generator=g))
            return layer

        self.time = lin(1, hidden)
        # ModuleDict keys may not hold dots: block "down.0" is fns["down_0"]
        self.fns = torch.nn.ModuleDict({"down_0": lin(dim, hidden), "down_1": lin(hidden, hidden), "mid": lin(hidden, hidden),
                                        "up_1": lin(2 * hidden, hidden), "up_0": lin(2 * hidden, dim)})

    def block(self, name: str, hidden: dict[str, torch.Tensor]) -> torch.Tensor:
        x = hidden["x"] if "skip" not in hidden else torch.cat([hidden["x"], hidden["skip"]], dim=-1)
        y = self.fns[name.replace(".", "_")](x)
        if name == "down.0":
            y = y + self.time(hidden["t"])
        return y if name == "up.0" else torch.tanh(y)


class ToyBlock(Layer):
    """One block of the toy denoiser. ``hidden`` is a dict: ``x`` (B, width) the block's input,
    ``skip`` (up blocks) the output of the down block of the same depth, ``t`` (``down.0``) the
    time (B, 1). ``depth`` and ``kind`` place it in the stack; ``cached_output`` is its last output."""

    def __init__(self, name: str, index: int, depth: int, kind: str, pipe: "ToyPipeline"):
        super().__init__(name, index, kind)
        self.depth = depth
        self.pipe = pipe
        self.cached_output: torch.Tensor | None = None

    def compute(self, hidden: dict[str, torch.Tensor], positions: Any = None) -> torch.Tensor:
        if positions is not None:
            raise ValueError(f"{self.name}: toy blocks compute every row")
        out = self.pipe.denoiser.block(self.name, hidden)  # counted by the core
        self.cached_output = out
        return out


@attrs.define
class ToyStepOutput:
    """What ``diffaccel_post_step`` receives: the vectors after the step and the noise prediction."""

    latents: torch.Tensor
    noise_pred: torch.Tensor


@attrs.define
class ToyFinal:
    draft: torch.Tensor
    latents: torch.Tensor | None = None

    def apply_default(self) -> None:
        if self.latents is None:
            self.latents = self.draft


@attrs.define
class ToyOutput:
    vectors: torch.Tensor
    report: dict[str, Any]


class ToyStep(StepModel):
    """One evaluation of the toy denoiser for ``RunSequence.denoise``."""

    def __init__(self, pipe: "ToyPipeline", seq: RunSequence):
        self.pipe, self.seq, self.x = pipe, seq, None

    def compute(self) -> torch.Tensor:
        return self.pipe._eps(self.seq, self.x, self.seq.run.timestep)


class ToyPipeline:
    """``pipe(seed=0, batch=1, steps=20)``: DDIM (eta 0) over a linear noise schedule."""

    def __init__(self, dim: int = 8, hidden: int = 32, seed: int = 0):
        self.denoiser = ToyDenoiser(dim, hidden, seed).eval()
        self.dim = dim
        self.accelerator: Accelerator | None = None
        """Set by ``attach``; None: runs go through the core's null accelerator (untouched)."""
        self.blocks = [ToyBlock(name, i, depth, kind, self) for i, (name, depth, kind) in enumerate(BLOCKS)]

    def _eps(self, seq: RunSequence, x: torch.Tensor, t: float) -> torch.Tensor:
        accel, run = seq.accel, seq.run
        plan = run.plan  # merged by RunSequence.denoise (pre_step)
        skip = plan.skip if plan is not None else frozenset()
        run.positions_per_layer = x.shape[0]
        tt = torch.full((x.shape[0], 1), t)
        outs: dict[str, torch.Tensor] = {}
        h = x
        for b in self.blocks:
            if b.name in skip and b.cached_output is not None:
                seq.skipped(b)
                h = b.cached_output
            else:
                hidden = {"x": h, "t": tt} if b.name == "down.0" else {"x": h}
                if b.kind == "up":
                    hidden["skip"] = outs["down." + b.name.split(".")[1]]
                h = accel.layer_output(run, b, hidden)
            outs[b.name] = h
        return h

    @torch.no_grad()
    def __call__(self, seed: int = 0, batch: int = 1, steps: int = 20) -> ToyOutput:
        run = RunState(adapter="toy", num_steps=steps, batch_size=batch, capabilities=ToyAdapter.capabilities)
        run.info.set(layers=[b.name for b in self.blocks], depths=[b.depth for b in self.blocks],
                        kinds=[b.kind for b in self.blocks], n_layers=len(self.blocks), seeds=[seed + r for r in range(batch)])
        for b in self.blocks:
            b.cached_output = None
        x = torch.stack([torch.randn(self.dim, generator=torch.Generator().manual_seed(seed + r)) for r in range(batch)])
        ab = torch.linspace(0.02, 0.999, steps + 1)  # alpha-bar from noisy (index 0) to clean
        seq = RunSequence(self.accelerator, run)
        step = ToyStep(self, seq)
        seq.start()
        try:
            for s in range(steps):
                run.step, run.timestep = s, 1.0 - s / steps
                step.x = x
                eps = seq.denoise(step)
                x0 = (x - (1 - ab[s]).sqrt() * eps) / ab[s].sqrt()
                x = ab[s + 1].sqrt() * x0 + (1 - ab[s + 1]).sqrt() * eps
                seq.post_step(lambda: ToyStepOutput(latents=x, noise_pred=eps))
                if seq.stopped:
                    break
            final = seq.finalize(ToyFinal(draft=x))
        finally:
            seq.end()
        return ToyOutput(vectors=final.latents, report=run.report())


class ToyAdapter:
    name = "toy"
    Options = ToyOptions
    capabilities = frozenset({BLOCK_STACK})
    PEERS: dict[str, type] = {}
    layer_types = (ToyBlock,)

    @staticmethod
    def accepts(pipe: Any) -> bool:
        return isinstance(pipe, ToyPipeline)

    @staticmethod
    def load(config) -> ToyPipeline:
        if config.model.checkpoint != "default":
            raise DiffaccelError(f"{config.source}: [model] key 'checkpoint': the toy adapter has only 'default'")
        return ToyPipeline(config.options.dim, config.options.hidden)

    @staticmethod
    def info(pipe: ToyPipeline) -> dict[str, Any]:
        return {"adapter": "toy", "n_layers": len(pipe.blocks), "layers": [b.name for b in pipe.blocks],
                "depths": [b.depth for b in pipe.blocks], "kinds": [b.kind for b in pipe.blocks],
                "capabilities": sorted(ToyAdapter.capabilities)}

    @staticmethod
    def attach(pipe: ToyPipeline, accelerator) -> None:
        pipe.accelerator = accelerator

    @staticmethod
    def detach(pipe: ToyPipeline) -> None:
        pipe.accelerator = None

    @staticmethod
    def run(pipe: ToyPipeline, config, seed: int, progress: bool = True, **extra) -> ToyOutput:
        return pipe(seed=seed, batch=config.model.batch, steps=config.model.steps or 20)

    @staticmethod
    def reference_run(pipe, config, seed: int) -> None:
        return None

    @staticmethod
    def write(outputs: list[ToyOutput], out: str | None) -> str:
        text = "\n".join(" ".join(f"{v:.6f}" for v in row.tolist()) for o in outputs for row in o.vectors)
        if out is None:
            sys.stdout.write(text + "\n")
            return "stdout"
        with open(out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        return out

    @staticmethod
    def quality(baseline: list[ToyOutput], outputs: list[ToyOutput], references=None) -> dict[str, float]:
        """Relative L2 error of the vectors against the baseline's of the same seeds."""
        errs = [float((o.vectors - b.vectors).norm() / b.vectors.norm().clamp(min=1e-12)) for b, o in zip(baseline, outputs)]
        return {"rel_error": sum(errs) / len(errs)}

    @staticmethod
    def peer_name(entry) -> str:
        return entry.name

    @staticmethod
    @contextmanager
    def peer_context(pipe, peer):
        raise DiffaccelError("the toy adapter offers no peers")
        yield pipe
