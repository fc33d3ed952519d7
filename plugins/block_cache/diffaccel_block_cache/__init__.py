"""diffaccel strategy ``block-cache``: Fast-dLLM's approximate dual cache for bidirectional
masked text diffusion LMs run in semi-autoregressive blocks (``[model] block_size``).

    [model]
    block_size = 16     # the sampler's blocks; the cache needs more than one
    [[strategy]]
    use = "block-cache"
    refresh = 0         # a full pass at each block's first step only (4: also every 4th step of a block)
    mode = "dual"       # the other steps compute the active block alone ("prefix": and the suffix)
"""

from __future__ import annotations

__version__ = "0.1.0"

from diffaccel import Strategy, Tunable, hookimpl

from .strategy import MODES, NEEDS, BlockCache, BlockCacheConfig, BlockCacheState, active_blocks, step_positions

_DESCRIPTION = ("approximate block cache (Fast-dLLM's dual cache): a full pass at each block's first step, then only "
                "the active block, reading the prefix's and the suffix's keys and values from that pass")


@hookimpl
def diffaccel_register(register):
    register(Strategy(name="block-cache", config=BlockCacheConfig, factory=BlockCache, requires=NEEDS,
                      description=_DESCRIPTION))


@hookimpl
def diffaccel_tunables(strategy):
    """What ``diffaccel tune`` may set: the refresh period within a block (0: never) and the mode."""
    if strategy != "block-cache":
        return None
    return [Tunable(key="refresh", low=0, high=16, integer=True), Tunable(key="mode", choices=MODES)]


__all__ = ["MODES", "NEEDS", "BlockCache", "BlockCacheConfig", "BlockCacheState", "__version__", "active_blocks",
           "diffaccel_register", "diffaccel_tunables", "step_positions"]
