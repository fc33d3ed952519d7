"""diffaccel strategy ``swd``: stable window decoding for text diffusion LMs.

    [[strategy]]
    use = "swd"
    K = 3        # a position is stable when its top-1 token held for 3 steps ...
    tau = 0.95   # ... with a mean probability of at least 0.95 (default: per sampler)
    R = 2        # compute the unstable positions widened by 2 on each side
"""

from __future__ import annotations

__version__ = "0.1.0"

from diffaccel import Strategy, Tunable, hookimpl

from .strategy import NEEDS, SWD, SWDConfig, SWDState, radius_at, update_stability, widen

_DESCRIPTION = "stable window decoding: compute only a window around the positions whose top-1 token still moves"


@hookimpl
def diffaccel_register(register):
    register(Strategy(name="swd", config=SWDConfig, factory=SWD, requires=NEEDS, description=_DESCRIPTION))


@hookimpl
def diffaccel_tunables(strategy):
    """What ``diffaccel tune`` may set: how long and how surely a top-1 must hold (K, tau), the window (R)
    and how old a position's logits may grow (max_age)."""
    if strategy != "swd":
        return None
    return [Tunable(key="tau", low=0.005, high=0.9, log=True), Tunable(key="K", low=1, high=5, integer=True),
            Tunable(key="R", low=0, high=3, integer=True), Tunable(key="max_age", low=2, high=24, integer=True)]


__all__ = ["SWD", "SWDConfig", "SWDState", "__version__", "diffaccel_register", "diffaccel_tunables", "radius_at", "update_stability", "widen"]


@hookimpl
def diffaccel_register_commands(commands):
    """``diffaccel swd-sweep`` (``sweep.py``; it imports only the core)."""
    from . import sweep  # the bench machinery, only when the command line asks for commands

    sweep.register(commands)
