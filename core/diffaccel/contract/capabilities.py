"""What a model's layers and steps offer, named once: adapters declare these, strategies require them.

A strategy never asks which adapter drives a model; it says what it needs (``Strategy.requires``)
and, where it serves several kinds of model, picks its behaviour from ``run.capabilities``.
``diffaccel check`` and ``load_config`` refuse a strategy whose requirement the config's adapter
does not declare, with one line naming the missing capability.

Each constant's docstring is the contract: what an adapter that declares it must provide.
"""

from __future__ import annotations

from collections.abc import Iterable

TOKEN_POSITIONS = "token-positions"
"""Layers run over token positions (hidden states (B, N, D)) and may compute a subset of them:
``layer.compute(hidden, positions=mask)`` with a (B, N) bool mask, the other positions keeping
their cached outputs; ``layer.cached_output``, ``layer.step_positions`` and ``layer.select(mask)``
(the adapter's position set: ``.mask()``, ``.flat``, ``.pos``, ``.gather``, ``.count``) exist;
``StepPlan.positions`` narrows a whole step; ``post_step`` gets a step output with ``tokens``,
``top1``, ``top1_prob``, ``logits``, ``computed``, ``fixed``; ``run.info.tokens.length`` and
``run.info.n_layers`` are set."""

MASK_CONFIDENCES = "mask-confidences"
"""An absorbing (masked) sampler: a mask token, per-position confidences of the drawn tokens,
``masked`` (still-masked positions) in the step output, and a sequence that only changes where a
token was committed. ``run.info.tokens.sampler == "masked"`` on the runs that use it."""

TOKEN_LOGITS = "token-logits"
"""The denoiser's output is per-position logits over a vocabulary (B, N, V): ``denoiser_output``
may replace them, densely or truncated (``run.info.tokens.truncated_logits(values, indices,
vocab_size)`` builds the adapter's truncated form, k (value, token) pairs per position, which its
sampler draws from without a dense tensor), ``finalize`` may choose the tokens, ``run.info.tokens``
has ``vocab_size``, ``tokenizer``, ``prompt_lengths`` (and ``run.info.seeds``)."""

PINNED_TOKENS = "pinned-tokens"
"""``run.pinned`` (tokens held fixed) and ``run.condition`` (an external condition vector, for
models with ``run.info.tokens.cond_dim`` > 0) set in ``run_start`` are honoured."""

BLOCK_STACK = "block-stack"
"""Layers are blocks of an encoder-decoder stack with a skippable middle: each layer has a
``depth`` (0 outermost) and a ``kind`` (``down``, ``mid`` or ``up``); ``run.info.layers``,
``run.info.stack.depths`` and ``run.info.stack.kinds`` list them in forward order. Answering a block of depth >= d, and the
up block of depth d, with ``layer.cached_output`` (its last output in the branch) is valid: the
shallower blocks then read those cached deep features. In a flat stack of residual blocks (a
diffusion transformer: depth counted from both ends) ``cached_output`` is the block's last
residual added to its current input. ``layer.kept`` is what the block kept at its last
computation in the branch (its output; a diffusion transformer block's residual) and
``layer.served(value, (), hidden)`` the block's output from such a value (a strategy's own
estimate of it, e.g. extrapolated). ``StepPlan.skip`` is honoured."""

BLOCK_TAIL = "block-tail"
"""The outermost up block can run only its last layers on the features that entered them at its
last full run (``layer.tail_start``, ``layer.capture_tail``, ``layer.can_run_tail``,
``layer.run_tail``): DeepCache's shallow branch."""

SPATIAL_FEATURES = "spatial-features"
"""Blocks output feature maps (B, C, H, W); the step output has ``latents``, ``noise_pred`` and
``pred_original`` (the scheduler's clean estimate) of that shape."""

IMAGE_STEPS = "image-steps"
"""Steps denoise images or latents: the step output has ``latents``, ``noise_pred`` and
``pred_original`` (the scheduler's clean estimate), (B, C, H, W); ``run.info.images.sample_size``
is set. Blocks may output anything (a diffusion transformer's token states):
``spatial-features`` says more."""

INNER_MODULES = "inner-modules"
"""Modules inside a block (``down_blocks.1.attentions.0``...) can be hooked on request
(``diffaccel_hooked_modules``); they reach ``layer_output`` like blocks."""

GUIDANCE_BRANCHES = "guidance-branches"
"""Classifier-free guidance: ``run.branch`` is ``cond`` / ``uncond`` when the pipeline runs the
branches apart, and ``run.state`` keeps a state per branch."""

ALL = (TOKEN_POSITIONS, MASK_CONFIDENCES, TOKEN_LOGITS, PINNED_TOKENS, BLOCK_STACK, BLOCK_TAIL,
       SPATIAL_FEATURES, IMAGE_STEPS, INNER_MODULES, GUIDANCE_BRANCHES)
"""Every capability the core defines. Adapters may declare others (a strategy and an adapter from
the same third party can agree on one); these are the ones shipped strategies use."""

def describe(requirement: str | tuple[str, ...]) -> str:
    """``'a'`` or ``'a' or 'b'``: a requirement as messages show it."""
    alts = (requirement,) if isinstance(requirement, str) else tuple(requirement)
    return " or ".join(f"'{a}'" for a in alts)


def missing(requires: Iterable[str | tuple[str, ...]], offered: Iterable[str]) -> list[str | tuple[str, ...]]:
    """The requirements that ``offered`` does not meet, in order."""
    have = set(offered)
    out = []
    for req in requires:
        alts = (req,) if isinstance(req, str) else tuple(req)
        if not any(a in have for a in alts):
            out.append(req)
    return out
