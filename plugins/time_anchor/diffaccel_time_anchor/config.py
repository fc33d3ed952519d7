"""Keys of ``[[strategy]] use = "time-anchor"`` and the files they may point to (gate, clusters)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from diffaccel.contract.errors import ConfigValueError
from diffaccel.contract.validators import in_range, non_negative, one_of
from diffaccel.kit.paygate import MODES


def _open_unit(_inst, attribute, value):
    """A threshold strictly between 0 and 1."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1
    if not ok:
        raise ConfigValueError(attribute.name, f"must be in (0, 1), got {value!r}")


def _positive_int(_inst, attribute, value):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigValueError(attribute.name, f"must be a positive integer, got {value!r}")


def _existing_json(_inst, attribute, value):
    if value is None:
        return
    if not isinstance(value, str) or not value:
        raise ConfigValueError(attribute.name, f"must be a path to a JSON file, got {value!r}")
    path = Path(value)
    if not path.is_file():
        raise ConfigValueError(attribute.name, f"file not found: {value} (paths are relative to the working directory)")
    try:
        json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigValueError(attribute.name, f"{value} is not a readable JSON file ({exc.__class__.__name__})") from None


@attrs.frozen(kw_only=True)
class TimeAnchorConfig:
    """Keys of ``[[strategy]] use = "time-anchor"``."""

    threshold: float = attrs.field(default=0.02, validator=_open_unit)
    """Training-free anchor test: a (layer, position) is anchored when the relative change of its output, per step since it was last computed, is below this; in (0, 1)."""
    warmup: int = attrs.field(default=5, validator=non_negative)
    """Steps computed in full (every layer, every position) before any reuse."""
    max_age: int = attrs.field(default=2, validator=_positive_int)
    """An entry written more than this many steps ago is never served: its state is recomputed."""
    max_entries: int = attrs.field(default=2**20, validator=_positive_int)
    """Most cache entries held at once (per generation and guidance branch); least recently used entries are evicted."""
    max_bytes: int = attrs.field(default=256 * 2**20, validator=_positive_int)
    """Most bytes of cached tensors held at once (per generation and guidance branch); least recently used entries are evicted."""
    fp16: bool = False
    """Store cached reference states in float16 (half the bytes)."""
    neighbors: int = attrs.field(default=2, validator=non_negative)
    """Text: positions within this distance of a position whose input token changed are recomputed at every layer in that step (a committed token changes its neighbours most)."""
    prompt_interval: int = attrs.field(default=0, validator=non_negative)
    """Text, masked sampler: the prompt apart from the response (dLLM-Cache's split). A prompt position's state is anchored whenever it is computed (no change test) and served for this many steps, then the whole prompt is refreshed; the response keeps the change test and ``max_age``. A long prompt is then computed once every prompt_interval steps. 0: one rule for every position."""
    response_test: bool = True
    """Text, with prompt_interval: false leaves the response out of the cache, its positions computed at every step, so that no layer runs any bookkeeping: the step's plan is the response between the prompt's refreshes, and the adapter keeps the prompt's keys and values from its last full step (the cheapest form where the response is short, and exact for it). With prompt_interval 0 every step runs whole (a point tune may try)."""
    narrow_step: bool = True
    """Text, masked sampler: narrow the whole step to the positions some layer must compute (``pre_step``'s plan). false: leave the step's positions to the strategies before it in the config (e.g. swd's window) and only leave anchored states out within them; the core ORs plans, so a plan of its own would add every position whose entry expired."""
    stride: int = attrs.field(default=1, validator=_positive_int)
    """Text: cache and anchor only every n-th position (the others are always computed); trades hit rate for memory."""
    clusters: str | None = attrs.field(default=None, validator=_existing_json)
    """Text: JSON file of semantic position clusters (``diffaccel time-anchor-clusters``); entries are then keyed by (layer, cluster) instead of position."""
    gate: str | None = attrs.field(default=None, validator=_existing_json)
    """JSON file of learned per-layer gates (``diffaccel time-anchor-calibrate``); replaces the change test: a state is anchored where the layer's gate is above gate_threshold."""
    gate_threshold: float = attrs.field(default=0.5, validator=_open_unit)
    """With a gate: anchor where sigmoid(W.E(t) + b) is above this; in (0, 1)."""
    min_depth: int = attrs.field(default=1, validator=non_negative)
    """UNet: the shallowest depth that may be skipped (0: the outermost down/up pair too; 1 keeps the shallow branch, as DeepCache does)."""
    tail_layers: int = attrs.field(default=0, validator=non_negative)
    """UNet, with min_depth 0: when the outermost depth is anchored, the last up block runs only its last tail_layers layers, on the features that entered them at its last full run and the fresh skip samples (DeepCache's shallow branch); every other block is skipped. 0: it is served whole (the model's output is reused)."""
    extrapolate: bool = False
    """Block stack: serve a skipped block from the first-order extrapolation of what it kept (a DiT block: its residual) through its last two computed steps instead of the last one alone (``diffaccel.kit.extrapolate``); with tail_layers, the features entering the tail likewise (DeepCache's cached deep features, extended along their last two full runs)."""
    cost_gate: str = attrs.field(default="auto", validator=one_of(MODES))
    """Text: whether skipping pays on this model and batch. auto: at the first run, 3 plain steps (time-anchor aside) and 4 anchoring steps after its warm-up are timed (real steps), and where its steps are not faster every later step is plain; on: always anchor; off: never. The verdict is kept for the instance's later runs of the same model, batch and length; the run summary says it in one line."""
    sketch: int = attrs.field(default=1024, validator=in_range(16, 65536))
    """UNet: coordinates per row sampled from a block's output for the change test (the reference states the cache holds)."""

    def __attrs_post_init__(self):
        if self.tail_layers and self.min_depth != 0:
            raise ConfigValueError("tail_layers", f"needs min_depth = 0 (the outermost depth is the one with a tail), got min_depth {self.min_depth}")
        if self.stride > 1 and self.clusters is not None:
            raise ConfigValueError("stride", "cannot be combined with clusters (keys are either every n-th position or clusters)")


def load_clusters(path: str) -> dict[str, Any]:
    """Read and check a clusters file: ``{"length": N, "n_clusters": k, "assign": [N ints in 0..k-1]}``."""
    data = json.loads(Path(path).read_text())
    assign = data.get("assign") if isinstance(data, dict) else None
    k = data.get("n_clusters") if isinstance(data, dict) else None
    if not isinstance(assign, list) or not isinstance(k, int) or k <= 0:
        raise ConfigValueError("clusters", f"{path} needs 'assign' (a list of cluster ids) and 'n_clusters' (a positive integer)")
    if any(not isinstance(a, int) or not 0 <= a < k for a in assign):
        raise ConfigValueError("clusters", f"{path}: every 'assign' value must be an integer in [0, {k})")
    return data
