"""diffaccel strategy ``time-anchor``: reuse the (layer, position) states that have settled.

    [[strategy]]
    use = "time-anchor"
    threshold = 0.02   # anchored when the relative change per step is below this
    max_age = 2        # an anchored entry is served for at most this many steps
    warmup = 5         # steps computed in full first

Models with token positions (text): anchored positions are left out of the layer's computation
(``tokens.py``). Models with a block stack (UNets): a depth whose blocks are anchored in every row
is skipped, with every deeper depth (``blocks.py``). The policy follows the model's capabilities.
"""

from __future__ import annotations

__version__ = "0.1.0"

from diffaccel import Strategy, Tunable, hookimpl
from diffaccel.contract.capabilities import BLOCK_STACK, TOKEN_POSITIONS

from .cache import LatentCache
from .config import TimeAnchorConfig
from .gate import Gate, fit_gates
from .strategy import TimeAnchor
from .tokens import TokenPolicy, TokenState
from .blocks import BlockPolicy, BlockStackState


@hookimpl
def diffaccel_register(register):
    register(Strategy(name="time-anchor", config=TimeAnchorConfig, factory=TimeAnchor, requires=((TOKEN_POSITIONS, BLOCK_STACK),),
                      description="skip settled (layer, position) states, served from a bounded versioned cache"))


@hookimpl
def diffaccel_tunables(strategy):
    """What ``diffaccel tune`` may set: the anchoring threshold, the full warm-up and how long an
    anchored entry is served (text and block stacks alike), and the prompt's refresh interval
    (text; 0 keeps one rule for prompt and response) and whether the response is tested at all
    (false: the prompt alone is served, no per-layer bookkeeping). The warm-up reaches 12 steps: on the
    digits UNet the first fifth of 50 DDIM steps, where the layout forms, is worth computing."""
    if strategy != "time-anchor":
        return None
    return [Tunable(key="threshold", low=0.001, high=0.3, log=True), Tunable(key="warmup", low=0, high=12, integer=True),
            Tunable(key="max_age", low=1, high=10, integer=True), Tunable(key="prompt_interval", low=0, high=32, integer=True),
            Tunable(key="response_test", choices=(True, False))]


@hookimpl
def diffaccel_register_commands(commands):
    """``diffaccel time-anchor-calibrate`` and ``diffaccel time-anchor-clusters`` (``cli.py``)."""
    from . import cli

    cli.register(commands)


__all__ = ["BlockPolicy", "BlockStackState", "Gate", "LatentCache", "TimeAnchor", "TokenPolicy", "TokenState", "TimeAnchorConfig", "__version__", "diffaccel_register", "diffaccel_register_commands", "diffaccel_tunables", "fit_gates"]
