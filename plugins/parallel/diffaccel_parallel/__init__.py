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


TAU_CHOICES = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995, 0.998, 0.999)
"""The thresholds ``tune`` tries: the ratio scale's range (0.3 to 0.99) and, denser at the top,
the probability scale's, up to 0.999 (a confident task model keeps its accuracy only above 0.99:
the sudoku model loses 10 points at Fast-dLLM's 0.9; docs/task-models.md)."""


@hookimpl
def diffaccel_tunables(strategy):
    """What ``diffaccel tune`` may set: the rule (threshold, factor, entropy) and each rule's
    knob: the threshold tau (``TAU_CHOICES``, up to 0.999), the factor rule's f (the confidence
    each extra commit needs; 0.01 is a near-certain model's, 12 a flat one's), the entropy rule's
    gamma, and the spacing between a step's commits. The scale stays as the config writes it."""
    if strategy != "parallel":
        return None
    return [Tunable(key="rule", choices=RULES), Tunable(key="tau", choices=TAU_CHOICES),
            Tunable(key="factor", low=0.01, high=12.0, log=True), Tunable(key="gamma", low=0.001, high=4.0, log=True),
            Tunable(key="spacing", low=0, high=10, integer=True)]

__all__ = ["RULES", "SCALES", "TAU_CHOICES", "Parallel", "ParallelConfig", "__version__", "choose", "diffaccel_register", "diffaccel_tunables", "entropies",
           "scaled_confidence", "spaced"]


@hookimpl
def diffaccel_register_commands(commands):
    """``diffaccel parallel-sweep`` (``sweep.py``) and ``diffaccel parallel-line`` (``line.py``);
    both import only the core."""
    from . import line, sweep  # the bench machinery, only when the command line asks for commands

    sweep.register(commands)
    line.register(commands)
