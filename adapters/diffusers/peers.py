"""The fewer-steps and solver peers of the diffusers adapters (``[[peer]] use = "steps"``, and
the line ``bench --solver-line`` adds), and the bench's entries whose ``[model]`` differs from
the baseline's in ``scheduler`` and ``steps`` only (``variant_peer``).

A steps peer runs the bare pipeline with another step count and, when it names one, another
scheduler, built from the scheduler the checkpoint shipped (``diffusers_schedulers``), so a
DDIM line next to a DPM-Solver++ baseline is the checkpoint's DDIM, not one respaced for DPM.
The image analogue of the text adapter's ``steps-N`` peers: lowering the steps or changing the
solver is the one-line speedup every image strategy must beat."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import attrs

from diffaccel.contract.errors import DiffaccelError

from .hooks import session_of
from .schedulers import StepsPeer, build_scheduler, shipped_scheduler

SOLVER = "dpm++2m"
"""The multistep solver of the solver line: on the digits models the best at 10-12 steps (DPM-Solver++
2M; UniPC is within 0.3 dB of it, Euler below at 5x or more)."""
STEPS_RATIOS = (2, 3, 4, 5)
"""The fewer-steps line: the config's steps divided by these (2x to 5x, where the shipped strategies are)."""
SOLVER_RATIOS = (3, 4, 5, 6, 7)
"""The solver line: from 3x to 7x (the composition's target is 7x over DDIM-50)."""


def peer_name(peer: StepsPeer) -> str:
    return peer.name or (f"{peer.scheduler}-{peer.steps}" if peer.scheduler else f"steps-{peer.steps}")


def run_config(config: Any, peer: Any) -> Any:
    """The config a peer entry runs: a steps peer's steps and scheduler; any other peer: ``config``."""
    if not isinstance(peer, StepsPeer):
        return config
    options = attrs.evolve(config.options, scheduler=peer.scheduler) if peer.scheduler else config.options
    return attrs.evolve(config, model=attrs.evolve(config.model, steps=peer.steps), options=options)


@contextmanager
def steps_context(pipe: Any, peer: StepsPeer, checkpoint: str = "the pipeline"):
    """``pipe`` with the peer's scheduler (if it names one) for a ``with`` block, then its own again."""
    if session_of(pipe) is not None:
        raise DiffaccelError("a peer runs on the bare pipeline: leave diffaccel.apply first")
    own = pipe.scheduler
    if peer.scheduler:
        pipe.scheduler = build_scheduler(peer.scheduler, shipped_scheduler(pipe), checkpoint)
    try:
        yield pipe
    finally:
        pipe.scheduler = own


def solver_peers(config: Any) -> list[StepsPeer]:
    """The peers ``bench --solver-line`` adds for ``config``: the config's scheduler at fewer steps
    (``steps-N``) and the multistep solver (``dpm++2m-N``), at step counts spanning 2x to 7x."""
    steps = config.model.steps or 50
    own = [StepsPeer(steps=n) for n in _counts(steps, STEPS_RATIOS)]
    if config.options.scheduler == SOLVER:
        return own
    return own + [StepsPeer(steps=n, scheduler=SOLVER) for n in _counts(steps, SOLVER_RATIOS)]


def _counts(steps: int, ratios: tuple[int, ...]) -> list[int]:
    counts = sorted({max(2, round(steps / r)) for r in ratios}, reverse=True)
    return [n for n in counts if n < steps]


def variant_peer(base: Any, config: Any) -> StepsPeer:
    """The steps peer that runs ``config``'s model on ``base``'s pipeline (its ``[model]`` differs
    in ``steps`` and ``scheduler`` only): the solver alone, which a cache on it is judged against."""
    scheduler = config.options.scheduler if config.options.scheduler != base.options.scheduler else None
    return StepsPeer(steps=config.model.steps or 50, scheduler=scheduler)
