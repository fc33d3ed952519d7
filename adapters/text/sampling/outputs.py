"""What the text samplers hand strategies and return: the post-step output (``TextStepOutput``),
the commit proposal (``CommitProposal``), the final tokens (``TextFinal``) and the run's result
(``TextOutput``). Shared by every text sampler (``pipeline``, ``diffusion_gemma``)."""

from __future__ import annotations

from typing import Any

import attrs
import torch

from diffaccel.contract.adapter import Committed

from .logits import TopKLogits


@attrs.define
class CommitProposal:
    """What ``diffaccel_commit`` receives from the masked sampler at a step (all (B, N) unless said)."""

    candidates: torch.Tensor
    """bool: the positions that may be committed (masked, in the row's current block)."""
    tokens: torch.Tensor
    """long: the token drawn at each candidate."""
    confidence: torch.Tensor
    """float: the drawn token's probability (at the sampler's temperature) at each candidate."""
    scheduled: torch.Tensor
    """bool: what the sampler commits anyway (each row's most confident, per its schedule)."""
    logits: Any
    """The logits the sampler drew from: a (B, N, V) tensor or a ``TopKLogits``."""
    computed: torch.Tensor | None
    """bool: the positions whose logits this step recomputed; None: all may have changed."""
    temperature: float
    steps_left: list[int]
    """Per row: the steps its block's schedule has left, this one included."""


@attrs.define(kw_only=True)
class TextStepOutput:
    """What ``diffaccel_post_step`` receives from the text adapter. ``top1`` and ``top1_prob``
    are computed when a strategy first reads them (a softmax over the vocabulary at every
    position: a few percent of a small model's step, wasted for strategies that never look)."""

    _tokens: torch.Tensor | None = attrs.field(alias="tokens")
    _top1: torch.Tensor | None = attrs.field(default=None, alias="top1")
    _top1_prob: torch.Tensor | None = attrs.field(default=None, alias="top1_prob")
    _top1_of: Any = attrs.field(default=None, alias="top1_of")
    """Instead of ``top1`` and ``top1_prob``: a callable returning (top1_prob, top1), called
    at most once, on the first read of either during the post-step call."""
    logits: torch.Tensor
    """Last logits per position (B, N, V); positions not computed this step keep older ones.
    Valid during the call: the adapter updates its cache in place, so clone what you keep. These
    are what the sampler used, except when a strategy truncated them to a ``TopKLogits`` (then
    the denoiser's own logits; the truncated ones are in ``topk``)."""
    computed: torch.Tensor | None
    """Positions the step ran through the model (B, N) bool, or None for all (a reused step: all
    False). Their logits are current: the head ran where the last layer ran, and elsewhere the
    last layer's output, hence the logits, had not changed."""
    masked: torch.Tensor | None = None
    """Masked sampler: positions still masked after this step (B, N) bool."""
    fixed: torch.Tensor | None = None
    """Positions held fixed by the prompt or a condition (B, N) bool."""
    latents: torch.Tensor | None = None
    """Continuous samplers: the latents (B, N, E) after this step's update, the next step's input.
    A strategy may write into it (e.g. to hold some positions' latents)."""

    topk: TopKLogits | None = None
    """The truncated logits the sampler used, when a strategy returned a ``TopKLogits``;
    ``top1``/``top1_prob`` come from them."""

    @property
    def tokens(self) -> torch.Tensor:
        """Current sequence (B, N); masked positions hold the mask id (masked sampler). Continuous
        samplers: the current top-1 (computed on first read, as ``top1`` is)."""
        return self.top1 if self._tokens is None else self._tokens

    @tokens.setter
    def tokens(self, value: torch.Tensor) -> None:
        self._tokens = value

    @property
    def top1(self) -> torch.Tensor:
        """Most probable token per position (B, N). Read it during the call: later, the
        adapter's state has moved on to the next step."""
        if self._top1 is None:
            self._resolve_top1()
        return self._top1

    @property
    def top1_prob(self) -> torch.Tensor:
        """Its probability (B, N)."""
        if self._top1_prob is None:
            self._resolve_top1()
        return self._top1_prob

    def _resolve_top1(self) -> None:
        if self._top1_of is None:
            raise RuntimeError("TextStepOutput.top1 was not read during the post-step call; read it there")
        prob, top1 = self._top1_of()
        self._top1_of = None
        self._top1_prob = prob
        if self._top1 is None:  # an adapter may give the tokens and leave only their probability lazy
            self._top1 = top1

    def close(self) -> None:
        """After the post-step call: an unread top-1 can no longer be computed correctly."""
        self._top1_of = None

    def probs(self) -> torch.Tensor:
        """Full probabilities (B, N, V) of what the sampler used, computed on request."""
        return (self.topk.dense() if self.topk is not None else self.logits).float().softmax(-1)


@attrs.define
class TextFinal:
    """What ``diffaccel_finalize`` receives: set ``tokens`` to choose the result."""

    logits: torch.Tensor
    draft: torch.Tensor
    """The sampler's sequence; masked positions (if any remain) still hold the mask id."""
    fixed: torch.Tensor
    mask_id: int
    tokens: torch.Tensor | None = None
    base: torch.Tensor | None = None
    """The prompt and pinned tokens at ``fixed`` positions: the run returns
    ``where(fixed, base, tokens)``."""

    def apply_default(self) -> None:
        if self.tokens is None:
            fill = self.logits.argmax(-1)
            self.tokens = torch.where(self.draft == self.mask_id, fill, self.draft)


@attrs.define
class TextOutput:
    texts: list[str]
    tokens: torch.Tensor
    """(B, N) generated ids, prompt included."""
    prompt_lengths: list[int]
    report: dict[str, Any]
    """Counters and what each strategy reported (``RunState.report()``)."""
    task: Any = None
    """A task model's run (``tasks.mode.TaskRun``): its problems; ``task.scores(output)`` scores the rows."""

    @property
    def task_scores(self) -> list[dict[str, float]] | None:
        """A task run's per-row scores (``acc`` and the task's second metric); None otherwise."""
        return None if self.task is None else self.task.scores(self)


def committed_blocks(x: torch.Tensor, mask_id: int, ends: list[int], decode) -> Committed:
    """The masked sampler's ``Committed`` (``StreamsBlocks``): row r is final up to ``ends[r]``
    (the start of its current block), or up to its first masked position if that is earlier (a
    block left with positions masked: given no steps, or a run stopped early; finalize fills
    them). Decoded on demand from ``x``, which the sampler edits in place only past that."""
    masked = x == mask_id
    first = torch.where(masked.any(1), masked.int().argmax(1), torch.full_like(masked[:, 0], x.shape[1], dtype=torch.long))
    counts = [min(e, int(f)) for e, f in zip(ends, first.tolist())]
    return Committed(counts, lambda r: decode(x[r, :counts[r]].cpu().tolist()))
