"""diffaccel strategy ``topk``: top-k sampling and top-k logit truncation for text diffusion.

    [[strategy]]
    use = "topk"
    k = 5            # draw each token from its 5 most probable
    k_keep = 128     # hold 128 logits per position across steps instead of the vocabulary
"""

from __future__ import annotations

__version__ = "0.1.0"

from diffaccel import Strategy, Tunable, hookimpl
from diffaccel.contract.capabilities import TOKEN_LOGITS

from .strategy import TopK, TopKConfig, draw_topk, self_similarity


@hookimpl
def diffaccel_register(register):
    register(Strategy(name="topk", config=TopKConfig, factory=TopK, requires=(TOKEN_LOGITS,),
                      description="top-k sampling (seeded, per batch row) and top-k logit truncation",
                      reports=("self_similarity",)))


@hookimpl
def diffaccel_tunables(strategy):
    """What ``diffaccel tune`` may set: how many logits each position keeps across steps (k_keep:
    the cheaper draws); k itself changes what is sampled, not how fast, so it stays as written."""
    if strategy != "topk":
        return None
    return [Tunable(key="k_keep", choices=(16, 32, 64, 128, 256))]

__all__ = ["TopK", "TopKConfig", "__version__", "diffaccel_register", "diffaccel_tunables", "draw_topk", "self_similarity"]


@hookimpl
def diffaccel_register_commands(commands):
    """``diffaccel topk-truncation`` (``truncation.py``; it imports only the core)."""
    from . import truncation  # only when the command line asks for it

    truncation.register(commands)
