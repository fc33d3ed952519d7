"""diffaccel strategy ``parallel``: commit several confident positions per masked-sampler step.

    [[strategy]]
    use = "parallel"
    rule = "threshold"   # threshold | factor | entropy
    scale = "ratio"      # confidence relative to the row's best candidate (or "prob")
    tau = 0.7            # threshold: commit every candidate at >= 0.7 of the row's best
"""

from __future__ import annotations

__version__ = "0.1.0"

from diffaccel import Strategy, Tunable, hookimpl
from diffaccel.contract.capabilities import MASK_CONFIDENCES, TOKEN_LOGITS

from .strategy import RULES, SCALES, Parallel, ParallelConfig, choose, entropies, scaled_confidence, spaced

_DESCRIPTION = "parallel commits: the masked sampler commits every position a rule finds confident, so a run needs fewer steps"


@hookimpl
def diffaccel_register(register):
    # the masked sampler's commits and confidences; the entropy rule reads the logits
    register(Strategy(name="parallel", config=ParallelConfig, factory=Parallel, requires=(MASK_CONFIDENCES, TOKEN_LOGITS),
                      description=_DESCRIPTION))


@hookimpl
def diffaccel_tunables(strategy):
    """What ``diffaccel tune`` may set: the factor rule's f (the confidence each extra commit needs)
    and the spacing between a step's commits; the rule itself stays as the config writes it."""
    if strategy != "parallel":
        return None
    return [Tunable(key="factor", low=0.5, high=12.0, log=True), Tunable(key="tau", low=0.3, high=0.99),
            Tunable(key="spacing", low=0, high=10, integer=True)]

__all__ = ["RULES", "SCALES", "Parallel", "ParallelConfig", "__version__", "choose", "diffaccel_register", "diffaccel_tunables", "entropies",
           "scaled_confidence", "spaced"]


@hookimpl
def diffaccel_register_commands(commands):
    """``diffaccel parallel-sweep`` (``sweep.py``) and ``diffaccel parallel-line`` (``line.py``);
    both import only the core."""
    from . import line, sweep  # the bench machinery, only when the command line asks for commands

    sweep.register(commands)
    line.register(commands)
