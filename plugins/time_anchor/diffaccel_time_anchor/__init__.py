"""diffaccel strategy ``time-anchor``: reuse the (layer, position) states that have settled.

    [[strategy]]
    use = "time-anchor"
    threshold = 0.02   # anchored when the relative change per step is below this
    max_age = 2        # an anchored entry is served for at most this many steps
    warmup = 5         # steps computed in full first

Text models: anchored positions are left out of the layer's computation. UNet models: a block
depth whose blocks are anchored in every row is skipped (with every deeper depth).
"""

from __future__ import annotations

__version__ = "0.1.0"

from diffaccel import Strategy, hookimpl

from .cache import LatentCache
from .config import TimeAnchorConfig
from .gate import Gate, fit_gates
from .strategy import TimeAnchor


@hookimpl
def diffaccel_register(register):
    register(Strategy(name="time-anchor", config=TimeAnchorConfig, factory=TimeAnchor, adapters=("text", "unet"),
                      description="skip settled (layer, position) states, served from a bounded versioned cache"))


__all__ = ["Gate", "LatentCache", "TimeAnchor", "TimeAnchorConfig", "__version__", "diffaccel_register", "fit_gates"]
