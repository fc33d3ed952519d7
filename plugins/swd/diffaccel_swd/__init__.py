"""diffaccel strategy ``swd``: stable window decoding for text diffusion LMs.

    [[strategy]]
    use = "swd"
    K = 3        # a position is stable when its top-1 token held for 3 steps ...
    tau = 0.95   # ... with a mean probability of at least 0.95 (default: per sampler)
    R = 2        # compute the unstable positions widened by 2 on each side
"""

from __future__ import annotations

__version__ = "0.1.0"

from diffaccel import Strategy, hookimpl

from .strategy import NEEDS, SWD, SWDConfig, SWDState, radius_at, update_stability, widen

_DESCRIPTION = "stable window decoding: compute only a window around the positions whose top-1 token still moves"


@hookimpl
def diffaccel_register(register):
    register(Strategy(name="swd", config=SWDConfig, factory=SWD, requires=NEEDS, description=_DESCRIPTION))


__all__ = ["SWD", "SWDConfig", "SWDState", "__version__", "diffaccel_register", "radius_at", "update_stability", "widen"]


@hookimpl
def diffaccel_register_commands(commands):
    """``diffaccel swd-sweep`` (``sweep.py``; it imports only the core)."""
    from . import sweep  # the bench machinery, only when the command line asks for commands

    sweep.register(commands)
