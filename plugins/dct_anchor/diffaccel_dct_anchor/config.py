"""``[[strategy]] use = "dct-anchor"``: its keys, their checks, and the checks against the model."""

from __future__ import annotations

from typing import Any

import attrs

from diffaccel.contract.capabilities import BLOCK_STACK, BLOCK_TAIL, IMAGE_STEPS, SPATIAL_FEATURES
from diffaccel.contract.errors import ConfigValueError
from diffaccel.contract.validators import in_range, non_negative, one_of, positive

from .dct import CRITERIA

# Up-block classes whose last layers the strategy can run alone (their forward is a loop of
# resnet [+ attention] layers, then upsamplers; see the adapter's block-tail layer methods).
TAIL_BLOCK_TYPES = ("UpBlock2D", "CrossAttnUpBlock2D")


def _block_names(_inst, attribute, value):
    if value is None:
        return
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) for v in value):
        raise ConfigValueError(attribute.name, f"must be a non-empty list of block names such as [\"mid_block\"], got {value!r}")
    dup = next((v for v in value if list(value).count(v) > 1), None)
    if dup is not None:
        raise ConfigValueError(attribute.name, f"lists '{dup}' twice; list each block once")


@attrs.frozen(kw_only=True)
class DCTAnchorConfig:
    """Keys of ``[[strategy]] use = "dct-anchor"``."""

    threshold: float = attrs.field(default=0.01, validator=positive)
    """A block is anchored (its cached output reused, the block not run) while the relative change of the low-band DCT energy of its input since its last computed step stays below this, in every batch row."""
    band: int = attrs.field(default=4, validator=in_range(1, None))
    """Side of the low-frequency band: the band x band lowest DCT-II frequencies of each input map. At most the smallest map among the anchored blocks (e.g. 8 for the 8x8 maps of a 64x64 latent)."""
    criterion: str = attrs.field(default="energy", validator=one_of(tuple(CRITERIA)))
    """energy: per-channel low-band energies compared channel by channel (sum |E - E_ref| / sum E_ref). band: the energy of the low-band difference over the low-band energy (||L - L_ref||^2 / ||L_ref||^2), which also sees the layout move at constant energy."""
    signal: str = attrs.field(default="x0", validator=one_of(("x0", "input", "output")))
    """What the change is measured on. x0: the denoised estimate of the last step (the scheduler's pred_original, i.e. the UNet's output mapped to the image): its low band now against when the block was last computed; it settles as the layout settles. input: the block's input maps now against those at its cached step (exact, needs the input). output: the block's own output, whose low-band change per step is measured between its last two computations and extrapolated to the steps since the cached one."""
    blocks: list[str] | None = attrs.field(default=None, validator=_block_names)
    """Blocks that may be anchored, by name (down_blocks.i, mid_block, up_blocks.i). Default: the deepest down block, the mid block and the first up block. The last up block is never served whole: when anchored it runs its last tail_layers layers only, on the cached features entering them (DeepCache's shallow branch)."""
    warmup: int = attrs.field(default=2, validator=non_negative)
    """The first warmup steps compute every block in full."""
    max_reuse: int = attrs.field(default=3, validator=in_range(1, None))
    """A block is recomputed after this many consecutive reuses, whatever its input does."""
    final_full: int = attrs.field(default=0, validator=non_negative)
    """The last final_full steps compute every block in full."""
    extrapolate: bool = False
    """Serve a reused block from the first-order extrapolation of what it keeps (a DiT block: its residual) through its last two computed steps, rather than from the last one alone (TaylorSeer's idea, on whole blocks): between refreshes the block's update keeps drifting the way it drifted between its last two computations. Not for the last up block (its tail runs)."""
    tail_layers: int = attrs.field(default=1, validator=in_range(1, None))
    """When the last up block is listed and anchored: how many of its last layers (resnet, with its attention) still run. At most its number of layers."""

    def block_list(self, layers: list[str], kinds: list[str] | None = None) -> list[str]:
        """The listed blocks, or the default (deepest down, mid, first up) for this model's
        ``layers`` (their ``kinds`` from the block stack; UNet names when not given)."""
        if self.blocks is not None:
            return list(self.blocks)
        kinds = kinds or block_kinds(layers)
        downs = [n for n, k in zip(layers, kinds) if k == "down"]
        mids = [n for n, k in zip(layers, kinds) if k == "mid"]
        ups = [n for n, k in zip(layers, kinds) if k == "up"]
        return downs[-1:] + mids + ups[:1]


def block_kinds(layers: list[str]) -> list[str]:
    """down / mid / up of each UNet block from its name."""
    return ["down" if n.startswith("down_blocks.") else "up" if n.startswith("up_blocks.") else "mid" for n in layers]


def last_up(layers: list[str], kinds: list[str] | None = None) -> str | None:
    """The last up block: the model's output block, never served whole."""
    ups = [n for n, k in zip(layers, kinds or block_kinds(layers)) if k == "up"]
    return ups[-1] if ups else None


def input_sizes(layers: list[str], sample_size: int) -> dict[str, int]:
    """Side of the input map of each block of a standard UNet2DConditionModel at ``sample_size``:
    every down block but the last halves the map, every up block but the last doubles it."""
    n_down = sum(1 for n in layers if n.startswith("down_blocks."))
    sizes = {f"down_blocks.{i}": sample_size >> i for i in range(n_down)}
    deepest = sample_size >> max(n_down - 1, 0)
    sizes["mid_block"] = deepest
    n_up = sum(1 for n in layers if n.startswith("up_blocks."))
    sizes.update({f"up_blocks.{j}": deepest << j for j in range(n_up)})
    return sizes


def output_sizes(layers: list[str], sample_size: int) -> dict[str, int]:
    """Side of the map signal 'output' measures per block: the block's output (down blocks but the
    last halve, up blocks but the last double); for the last up block, the features entering its tail."""
    sizes = input_sizes(layers, sample_size)
    downs = [n for n in layers if n.startswith("down_blocks.")]
    ups = [n for n in layers if n.startswith("up_blocks.")]
    out = dict(sizes)
    out.update({n: sizes[n] >> 1 for n in downs[:-1]})
    out.update({n: sizes[n] << 1 for n in ups[:-1]})
    return out


def check_against_model(config: DCTAnchorConfig, info: dict[str, Any]) -> None:
    """Reject what depends on the model: its capabilities, block names, band vs the maps, tail blocks."""
    caps = info.get("capabilities")
    if caps is not None:
        if BLOCK_STACK not in caps:
            raise ConfigValueError("use", f"dct-anchor needs a model with capability '{BLOCK_STACK}'")
        if SPATIAL_FEATURES not in caps and IMAGE_STEPS not in caps:
            raise ConfigValueError("use", f"dct-anchor needs image steps; this model lacks capability '{IMAGE_STEPS}'")
        if config.signal != "x0" and SPATIAL_FEATURES not in caps:
            raise ConfigValueError("signal", f"'{config.signal}' measures blocks' feature maps; this model's blocks output "
                                             f"none (no capability '{SPATIAL_FEATURES}'): use signal = \"x0\"")
    layers = list(info.get("layers") or [])
    kinds = info.get("kinds")
    names = config.block_list(layers, kinds)
    unknown = [n for n in names if n not in layers]
    if unknown:
        raise ConfigValueError("blocks", f"unknown block '{unknown[0]}'; this model's blocks are: {', '.join(layers)}")
    if not names:
        raise ConfigValueError("blocks", f"this model has no default blocks to anchor; list some of: {', '.join(layers)}")
    size = info.get("sample_size")
    if isinstance(size, int) and size > 0:
        if config.signal == "x0":
            if config.band > size:
                raise ConfigValueError("band", f"{config.band} is larger than the {size}x{size} denoised estimate (the model's "
                                               f"sample size) that signal 'x0' measures; use at most {size}")
        else:
            sizes = input_sizes(layers, size) if config.signal == "input" else output_sizes(layers, size)
            where = min(names, key=lambda n: sizes[n])
            if config.band > sizes[where]:
                s = sizes[where]
                raise ConfigValueError("band", f"{config.band} is larger than the {s}x{s} {config.signal} map of '{where}' "
                                               f"(at sample size {size}); use at most {s}")
    out_block = last_up(layers, kinds)
    if out_block is not None and out_block in names:
        if caps is not None and BLOCK_TAIL not in caps:
            raise ConfigValueError("blocks", f"'{out_block}' is the model's last block: anchored whole it would freeze the "
                                             f"output, and this model cannot run its tail alone (no capability '{BLOCK_TAIL}')")
        block = next((b for b in info.get("blocks", []) if b.get("name") == out_block), None)
        if block is not None and block.get("type") not in TAIL_BLOCK_TYPES:
            raise ConfigValueError("blocks", f"'{out_block}' is a {block.get('type')}; the last up block can be anchored "
                                             f"only as one of {', '.join(TAIL_BLOCK_TYPES)} (its last layers run alone)")
