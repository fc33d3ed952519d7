"""The public text-model protocol: what ``TextDiffusionPipeline`` drives, and the pieces a text
model kind is built from. Import them from here; everything else in ``diffaccel.adapters.text``
may change between releases.

The pipeline runs a denoiser one layer at a time, ``condition`` -> ``embed`` -> ``block(i, ...)``
for each layer -> ``logits``, on every position (a full step) or on a subset of them (a partial
step: ``Positions``, the T (row, position) pairs computed; the others keep their last outputs,
and serve keys and values from each layer's ``KVCache``). Shapes: B rows, N positions, D the
hidden size, V the vocabulary.

* Full step: ``embed(x)`` takes token ids (B, N) (continuous kinds: latents (B, N, E)) and
  returns (B, N, D); ``block(i, h, c, kv)`` takes and returns (B, N, D) and must set ``kv.k``,
  ``kv.v`` to the layer's keys and values at every position, (B, Hkv, N, dh) each (Hkv: key/value
  heads, fewer than the query heads with grouped-query attention); ``logits(h)`` maps (B, N, D)
  to (B, N, V).
* Partial step: ``embed(x, positions)`` returns (T, D), the embeddings at those positions only;
  ``block(i, h, c, kv, positions)`` takes and returns (T, D): its keys and values at those
  positions are written into ``kv`` in place and its queries attend over every position's
  cached keys (``attend_positions`` does both, with the same attention mask as the full step:
  a sliding window, block-causal attention); ``logits(h)`` maps (T, D) to (T, V).
  A partial call must equal the full call at its positions, to the dtype's tolerance: the
  conformance suite's ``partial`` check (``diffaccel.testing.check_adapter``) compares them.
* ``condition(t, batch, cond)`` returns what ``block`` reads as ``c`` (None for a model that is
  neither time-conditioned nor conditioned); the pipeline calls it once per step.

A model kind's loader (``Loader``: ``names``, ``recognises``, ``load``, ``facts``) turns a
checkpoint into ``Loaded`` components; registered as an entry point of ``KINDS_GROUP``
(``diffaccel.text_models``) it is asked before the masked-LM catch-all, and a config runs it with
``adapter = "text"`` and its folder as ``checkpoint``. ``check_options`` is the rule the
``[model]`` options are checked by against its facts, at load and in ``diffaccel check``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from .facts import check_options
from ..loading.loader import KINDS_GROUP, Loaded, Loader, ModelFacts, Source
from ..sampling.model import KVCache, attend_positions, write_positions
from ..sampling.pipeline import TextDiffusionPipeline
from ..sampling.positions import Positions
from ..sampling.tokenizer import HFTokenizer, TextTokenizer

__all__ = ["KINDS_GROUP", "OPTIONAL", "HFTokenizer", "KVCache", "Loaded", "Loader", "ModelFacts", "Positions", "Source",
           "TextDenoiser", "TextDiffusionPipeline", "TextTokenizer", "attend_positions", "check_options", "missing_members",
           "write_positions"]


@runtime_checkable
class TextDenoiser(Protocol):
    """What ``TextDiffusionPipeline`` requires of its denoiser (see the module docstring)."""

    kind: str
    """``masked`` (absorbing ``[MASK]`` state: the masked sampler) or ``continuous`` (embedding
    space: the ddim, ddpm and hybrid samplers)."""
    n_layers: int
    """Layers ``block`` runs, each a ``block.{i}`` layer strategies see."""
    vocab_size: int
    """V, the logits' last dimension."""
    mask_id: int
    """The ``[MASK]`` token id (masked kinds)."""
    max_len: int
    """The longest sequence it takes (``[model] length`` is checked against it)."""
    time_conditioned: bool
    """Whether ``condition`` reads the time step: a step's output can then change with the same
    input (strategies reusing whole steps and ``prefix_cache`` check it)."""
    cond_dim: int
    """Size of an external condition vector (``[[strategy]]`` conditions); 0: none."""
    special_ids: set[int]
    """Token ids the sampler never draws (mask, padding, ...)."""
    model: Any
    """The ``torch.nn.Module`` holding the weights: ``pipe.to(device, dtype)`` moves and casts it."""

    def condition(self, t: Any, batch: int, cond: Any = None) -> Any:
        """The per-step condition ``c`` handed to every ``block`` (None: none)."""

    def embed(self, x: Any, positions: Positions | None = None) -> Any:
        """Token ids (B, N) -> (B, N, D); with ``positions``, (T, D) at those positions only."""

    def block(self, i: int, h: Any, c: Any, kv: KVCache, positions: Positions | None = None) -> Any:
        """Layer i on (B, N, D), refilling ``kv``; or on (T, D) at ``positions``, writing their
        keys and values into ``kv`` and attending over every cached one."""

    def logits(self, h: Any) -> Any:
        """Hidden states (..., D) -> logits (..., V)."""


OPTIONAL = {
    "num_timesteps": "continuous kinds: the discrete training time steps (default 1000)",
    "token_latents": "continuous kinds: token_latents() -> (V, E), the normalised embedding of every token",
    "alphas_cumprod": "continuous kinds: (num_timesteps,) the noise schedule's cumulative alphas",
    "logit_shift": "1 for a shifted head (Dream): position p's logits read position p - 1's hidden state",
    "mask": "mask(i, n, device) -> (n, n) bool or None: layer i's attention mask, by convention (the sliding "
            "window of ModernBERT's layers); the pipeline does not read it, the denoiser passes it to its "
            "own attention and to attend_positions",
}
"""Members a denoiser may have, and when the pipeline reads them."""


def missing_members(denoiser: Any) -> list[str]:
    """The required members of ``TextDenoiser`` that ``denoiser`` lacks (empty: it conforms)."""
    names = [*TextDenoiser.__annotations__, "condition", "embed", "block", "logits"]
    return [n for n in names if not hasattr(denoiser, n)]
