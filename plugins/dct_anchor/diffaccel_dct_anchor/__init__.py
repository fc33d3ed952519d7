"""diffaccel strategy ``dct-anchor``: DCT frequency anchors for image diffusion UNets and transformers.

    [[strategy]]
    use = "dct-anchor"
    threshold = 0.01                      # relative change of the low-band DCT energy
    band = 4                              # the 4x4 lowest frequencies of each input map
    blocks = ["down_blocks.2", "mid_block", "up_blocks.0"]
"""

from __future__ import annotations

__version__ = "0.1.0"

from diffaccel import Strategy, Tunable, hookimpl
from diffaccel.contract.capabilities import BLOCK_STACK, IMAGE_STEPS, SPATIAL_FEATURES

from .config import DCTAnchorConfig
from .dct import band_energy, dct2, dct_basis, low_band, relative_band_change, relative_energy_change
from .strategy import DCTAnchor, decide


@hookimpl
def diffaccel_register(register):
    register(Strategy(name="dct-anchor", config=DCTAnchorConfig, factory=DCTAnchor, requires=(BLOCK_STACK, (SPATIAL_FEATURES, IMAGE_STEPS)),
                      description="reuse UNet or DiT blocks while a low-frequency DCT band holds still",
                      reports=("deep_steps",)))


@hookimpl
def diffaccel_tunables(strategy):
    """What ``diffaccel tune`` may set: the change threshold, the warm-up and the longest run of reuses."""
    if strategy != "dct-anchor":
        return None
    return [Tunable(key="threshold", low=0.005, high=1.0, log=True), Tunable(key="warmup", low=0, high=6, integer=True),
            Tunable(key="max_reuse", low=1, high=10, integer=True)]

__all__ = ["DCTAnchor", "DCTAnchorConfig", "__version__", "band_energy", "dct2", "dct_basis", "decide",
           "diffaccel_register", "diffaccel_tunables", "low_band", "relative_band_change", "relative_energy_change"]
