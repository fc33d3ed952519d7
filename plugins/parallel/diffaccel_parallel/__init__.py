"""diffaccel strategy ``parallel``: commit several confident positions per masked-sampler step.

    [[strategy]]
    use = "parallel"
    rule = "threshold"   # threshold | factor | entropy
    scale = "ratio"      # confidence relative to the row's best candidate (or "prob")
    tau = 0.7            # threshold: commit every candidate at >= 0.7 of the row's best
"""

from __future__ import annotations

__version__ = "0.1.0"

from diffaccel import Strategy, hookimpl
from diffaccel.capabilities import MASK_CONFIDENCES, TOKEN_LOGITS

from .strategy import RULES, SCALES, Parallel, ParallelConfig, choose, entropies, scaled_confidence, spaced

_DESCRIPTION = "parallel commits: the masked sampler commits every position a rule finds confident, so a run needs fewer steps"


@hookimpl
def diffaccel_register(register):
    # the masked sampler's commits and confidences; the entropy rule reads the logits
    register(Strategy(name="parallel", config=ParallelConfig, factory=Parallel, requires=(MASK_CONFIDENCES, TOKEN_LOGITS),
                      description=_DESCRIPTION))


__all__ = ["RULES", "SCALES", "Parallel", "ParallelConfig", "__version__", "choose", "diffaccel_register", "entropies",
           "scaled_confidence", "spaced"]


@hookimpl
def diffaccel_register_commands(commands):
    """``diffaccel parallel-sweep`` (``sweep.py``; it imports only the core)."""
    from . import sweep  # the bench machinery, only when the command line asks for commands

    sweep.register(commands)
