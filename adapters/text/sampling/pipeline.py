"""``TextDiffusionPipeline``: the sampling loops of text diffusion LMs, with diffaccel's hooks.

Samplers:

* ``masked``: absorbing-state diffusion as in MDLM / LLaDA. Each step predicts every masked
  position, draws a token per position (``temperature`` 0 takes the argmax), and commits the
  most confident ones (low-confidence remasking): a fixed number per step, spread evenly over
  the steps, optionally in semi-autoregressive blocks of ``block_size`` positions.
* ``ddim``, ``ddpm``, ``hybrid``: continuous diffusion in the model's normalised embedding
  space; the model predicts clean tokens, whose expected embedding is the clean estimate.
  ``hybrid`` runs DDIM for the first third of the steps, DDPM for the middle third, DDIM last.

The denoiser runs layer by layer through ``TextLayer`` handles. A step may compute a subset of
positions (``StepPlan.positions``) and a strategy may compute a layer on fewer still; the other
positions keep their last outputs, and serve keys and values from a per-layer cache, so the cost
of a step falls with the positions computed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from diffaccel.adapterkit import RunSequence, StepModel
from diffaccel.contract.capabilities import MASK_CONFIDENCES, PINNED_TOKENS, TOKEN_LOGITS, TOKEN_POSITIONS
from diffaccel.contract.state import RunState

from .continuous import continuous_loop
from .logits import TopKLogits, draw, most_probable
from .masked import commit_most_confident_, masked_loop, most_confident  # noqa: F401 - importable here as before
from .model import KVCache
from .outputs import CommitProposal, TextFinal, TextOutput, TextStepOutput  # noqa: F401
from .positions import Positions
from .run_context import _NOT_RUN, TextLayer, _refresh_computed, _RunContext

__all__ = ["SAMPLERS", "CommitProposal", "TextDiffusionPipeline", "TextFinal", "TextLayer", "TextOutput", "TextStepOutput",
           "check_prefix_cache", "commit_most_confident_", "most_confident", "row_seed", "run_capabilities"]

SAMPLERS = ("masked", "ddim", "ddpm", "hybrid")


def run_capabilities(sampler: str) -> frozenset[str]:
    """What a run of ``sampler`` offers strategies: masked confidences with the masked sampler only."""
    caps = {TOKEN_POSITIONS, TOKEN_LOGITS, PINNED_TOKENS}
    if sampler == "masked":
        caps.add(MASK_CONFIDENCES)
    return frozenset(caps)


def row_seed(seed: int) -> int:
    """The generator seed of a batch row. Mixed, so that seed 0 does not replay torch's default
    stream: a model initialised under manual_seed(0) would otherwise find its own initial token
    embeddings in the starting noise (the continuous sampler then spelled the vocabulary)."""
    return (seed * 0x9E3779B97F4A7C15 + 0x5DEECE66D) % (2**63 - 1)


def check_prefix_cache(den, sampler: str, block_size: int | None, length: int) -> None:
    """Why ``prefix_cache`` cannot run here (``ValueError`` naming the option), or nothing."""
    if sampler != "masked":
        raise ValueError(f"prefix_cache needs the masked sampler, not {sampler!r}")
    if not block_size or block_size >= length:
        raise ValueError("prefix_cache needs block_size smaller than length (semi-autoregressive blocks)")
    if length % block_size:
        raise ValueError(f"prefix_cache needs length ({length}) to be a multiple of block_size ({block_size})")
    if den.time_conditioned:
        raise ValueError("prefix_cache needs a model that is not time-conditioned (the prefix's keys and values "
                         "would change with the time step)")


def check_prompt_room(prompt_ids: list[list[int]], length: int) -> None:
    """``ValueError`` (its ``key``: ``length``) when a prompt fills every position of ``length``, which
    counts the prompt's positions: at a run's start, and at load for a config's own prompts."""
    longest = max((len(p) for p in prompt_ids), default=0)
    if longest >= length:
        exc = ValueError(f"a prompt fills all {length} positions (it is {longest} tokens); use a length of at least {longest + 1}")
        exc.key = "length"  # type: ignore[attr-defined]  # the option to change: serve names its field (max_tokens)
        raise exc


def _shift_hidden(h: torch.Tensor) -> torch.Tensor:
    """(B, N, D) hidden states as the logits of a shifted-head model (Dream) read them: position
    p from p - 1, position 0 from itself."""
    return torch.cat([h[:, :1], h[:, :-1]], dim=1)


def _shifted_positions(sel: Positions) -> Positions:
    """The logit positions a shifted head refreshes when the hidden states at ``sel`` changed."""
    m = sel.mask()
    out = torch.zeros_like(m)
    out[:, 1:] = m[:, :-1]
    out[:, 0] |= m[:, 0]
    return Positions(out)


def _prefix_mask(B: int, N: int, lo: int, device) -> torch.Tensor:
    m = torch.zeros(B, N, dtype=torch.bool, device=device)
    m[:, :lo] = True
    return m


class _TextStep(StepModel):
    """One denoiser evaluation of the text pipeline, for ``RunSequence.denoise``: the step's
    positions under ``run.plan``, the logits (B, N, V) as its output."""

    def __init__(self, pipe: "TextDiffusionPipeline", ctx: _RunContext, accel):
        self.pipe, self.ctx, self.accel = pipe, ctx, accel
        self.x_in: torch.Tensor | None = None
        self.t: torch.Tensor | None = None

    def compute(self) -> torch.Tensor:
        self.pipe._denoise(self.ctx, self.accel, self.x_in, self.t)
        return self.ctx.logits

    def reuse(self) -> torch.Tensor | None:
        ctx = self.ctx
        if ctx.logits is None:
            return None
        ctx.step_sel = ctx.head_sel = Positions(torch.zeros(self.x_in.shape[:2], dtype=torch.bool, device=ctx.logits.device))
        ctx.step_logits = None
        return ctx.logits

    def fresh(self, raw: torch.Tensor) -> torch.Tensor:
        # the finite check reads what the step computed: its rows of logits, or all of them
        ctx = self.ctx
        return raw if ctx.step_logits is None else ctx.step_logits

    def output(self, raw: torch.Tensor) -> torch.Tensor:
        pipe = self.pipe
        if pipe._logit_noise:
            return raw + pipe._logit_noise * torch.randn(raw.shape, generator=pipe._noise_gen).to(raw)
        return raw


class TextDiffusionPipeline:
    """Generate text with a diffusion LM. ``pipe(prompt, length=128, steps=128, seed=0)``."""

    adapter: str | None = None
    """The adapter that loaded or attached this pipeline (``TextAdapter`` and its subclasses set
    their own name), named in run reports (None: ``text``) and preferred by ``diffaccel.apply``."""

    model_kind: str | None = None
    """The text model kind that loaded the denoiser (``loading.load_pipeline`` sets it), named in
    run reports as ``report["model"]``."""

    def __init__(self, denoiser, tokenizer, name: str = "text"):
        self.denoiser = denoiser
        self.tokenizer = tokenizer
        self.name = name
        self.accelerator = None
        self.device = torch.device("cpu")

    def to(self, device=None, dtype=None) -> "TextDiffusionPipeline":
        """Move the denoiser to ``device`` and/or cast its floating weights to ``dtype`` (as
        ``diffusers`` pipelines' ``to``); the sampler's tensors follow the model's."""
        if device is not None:
            self.device = torch.device(device)
        model = self.denoiser.model.to(self.device)
        if dtype is not None:  # real floating tensors only: Module.to(dtype) would make the complex RoPE tables real
            model._apply(lambda t: t.to(dtype) if t.is_floating_point() else t)
        return self

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the denoiser's floating weights."""
        return next(p.dtype for p in self.denoiser.model.parameters() if p.is_floating_point())

    @property
    def kind(self) -> str:
        return self.denoiser.kind

    # -- one denoiser evaluation ---------------------------------------------------------------
    def _denoise(self, ctx: _RunContext, accel, x_in: torch.Tensor, t: torch.Tensor | None) -> None:
        run, den = ctx.run, ctx.den
        B, N = x_in.shape[:2]
        ctx.c = den.condition(t, B, run.condition)
        run.positions_per_layer = B * N
        plan = run.plan
        wanted = None if plan is None or plan.positions is None else plan.positions.to(self.device)
        lo, prefix = ctx.prefix_lo, None
        if lo and ctx.logits is None:  # no caches yet: fill them (the prefix is redone just below)
            ctx.prefix_lo = 0
            self._denoise(ctx, accel, x_in, t)
            ctx.prefix_lo = lo
        if lo:
            done = _prefix_mask(B, N, lo, self.device)
            if ctx.prefix_done != lo:  # a new block: the prefix runs once; cached for its other steps
                self._prefix_pass(ctx, x_in, lo)
                prefix = _prefix_mask(B, N, lo + getattr(den, "logit_shift", 0), self.device)  # logits it wrote
            wanted = ~done if wanted is None else wanted & ~done
        if ctx.rows_done is not None and ctx.logits is not None:  # finished rows cost nothing
            keep = ~ctx.rows_done[:, None]
            wanted = keep.expand(B, N) if wanted is None else wanted & keep
        # a plan naming every position is a full step: the full path skips the gathers and scatters
        ctx.step_logits = None
        ctx.last_layer_sel = _NOT_RUN
        if ctx.logits is None or wanted is None or bool(wanted.all()):
            sel = ctx.step_sel = None
            h = ctx.h0 = den.embed(x_in)
        else:
            sel = ctx.step_sel = Positions(wanted)
            h = sel.scatter_(ctx.h0, den.embed(x_in, sel)) if sel.count else ctx.h0
        for layer in ctx.layers:
            h = accel.layer_output(run, layer, h)
        # The head runs where the last layer ran: elsewhere its output, hence the logits, did not
        # change (a strategy whose hook returned something else than the layer's own output gets
        # the head on every position of the step).
        head = sel
        if ctx.logits is not None and ctx.last_layer_sel is not _NOT_RUN and h is ctx.out[-1]:
            head = ctx.last_layer_sel
        shift = getattr(den, "logit_shift", 0)
        if shift and head is not None:
            head = _shifted_positions(head)  # the logits read from the hidden states that changed
        ctx.head_sel = head
        if head is None:
            ctx.logits = den.logits(_shift_hidden(h) if shift else h)
        elif head.count:
            if shift:  # position p's logits come from position p - 1's hidden state (0: its own)
                src = head.rows * N + (head.pos - 1).clamp(min=0)
                rows = h.reshape(B * N, -1).index_select(0, src)
            else:
                rows = head.gather(h)
            ctx.step_logits = den.logits(rows)  # (T, V): the head runs on those rows only
            head.scatter_(ctx.logits, ctx.step_logits)
        if prefix is not None and head is not None:
            # the prefix pass refreshed the finished blocks' logits too: they count as computed
            ctx.head_sel = ctx.step_sel = Positions(head.mask() | prefix)
            ctx.step_logits = None

    def _prefix_pass(self, ctx: _RunContext, x_in: torch.Tensor, lo: int) -> None:
        """Exact prefix cache: the finished blocks (positions < lo) run once per block, as a
        sequence of their own (they attend among themselves only); their outputs, keys, values
        and logits go into the run's caches, where the block's steps read them. Not hooked: a
        strategy sees the steps, whose positions are the active block and what follows it."""
        den = ctx.den
        B = x_in.shape[0]
        h = den.embed(x_in[:, :lo])
        ctx.h0[:, :lo] = h
        for i in range(den.n_layers):
            tmp = KVCache()
            h = den.block(i, h, ctx.c, tmp)
            ctx.out[i][:, :lo] = h
            kv = ctx.kv[i]
            kv.k, kv.v = kv.k.contiguous(), kv.v.contiguous()  # partial steps write into them in place
            kv.k[:, :, :lo] = tmp.k
            kv.v[:, :, :lo] = tmp.v
            ctx.seq.computed_unhooked(B * lo)
        if getattr(den, "logit_shift", 0):  # logits 0..lo read hidden states 0, 0, 1, .., lo - 1
            ctx.logits[:, : lo + 1] = den.logits(torch.cat([h[:, :1], h], dim=1))[:, : ctx.logits.shape[1]]
        else:
            ctx.logits[:, :lo] = den.logits(h)
        ctx.prefix_done = lo

    def _step_model(self, ctx, seq: RunSequence, x_in, t) -> torch.Tensor:
        step = ctx.step_model
        step.x_in, step.t = x_in, t
        return seq.denoise(step)

    # -- public call -----------------------------------------------------------------------------
    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str] | None = None,
        *,
        length: int = 128,
        steps: int | None = None,
        seed: int = 0,
        batch: int = 1,
        sampler: str | None = None,
        temperature: float = 1.0,
        block_size: int | None = None,
        prefix_cache: bool = False,
        progress: bool = True,
        logit_noise: float = 0.0,
        seeds: list[int] | None = None,
    ) -> TextOutput:
        """Generate ``batch`` sequences of ``length`` tokens (prompt included).

        Row ``i`` uses seed ``seed + i``, so a row is the same whether generated alone or in a
        batch; ``seeds`` (one per row) gives each row its own seed instead (``diffaccel serve``
        batches requests with unrelated seeds). ``logit_noise`` perturbs the logits by that
        standard deviation (noise-floor runs).
        ``prefix_cache`` (masked sampler with ``block_size``): the finished blocks attend among
        themselves only, so their keys and values are computed once per block, exactly.
        """
        den, tok = self.denoiser, self.tokenizer
        sampler = sampler or ("masked" if den.kind == "masked" else "hybrid")
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        if (sampler == "masked") != (den.kind == "masked"):
            raise ValueError(f"sampler {sampler!r} does not fit a {den.kind} model")
        if length > den.max_len:
            raise ValueError(f"length {length} exceeds the model's {den.max_len} positions")
        if prefix_cache:
            check_prefix_cache(den, sampler, block_size, length)
        steps = steps or length
        prompt_ids = self._prompt_ids(prompt, batch, length)
        batch = len(prompt_ids)
        if seeds is not None and len(seeds) != batch:
            raise ValueError(f"seeds: {len(seeds)} given for {batch} rows")
        seeds = list(seeds) if seeds is not None else [seed + r for r in range(batch)]
        gens = [torch.Generator().manual_seed(row_seed(s)) for s in seeds]
        self._logit_noise = logit_noise
        self._noise_gen = torch.Generator().manual_seed(10_000_019 + seed)
        run = self._text_run(sampler, steps, seeds, temperature, length, prompt_ids)
        ctx = _RunContext(den, run)
        fixed = torch.zeros(batch, length, dtype=torch.bool, device=self.device)
        base = torch.full((batch, length), den.mask_id, dtype=torch.long, device=self.device)
        for r, ids in enumerate(prompt_ids):
            base[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            fixed[r, : len(ids)] = True
        blocks = sampler == "masked" and block_size is not None and block_size < length
        run.info.set(block_size=block_size if blocks else None)  # semi-autoregressive blocks, before run_start
        seq = RunSequence(self.accelerator, run)
        ctx.seq, ctx.step_model = seq, _TextStep(self, ctx, seq.accel)
        pinned = seq.start()
        if pinned is not None:  # tokens a strategy planned (e.g. key terms): held like the prompt
            pin = pinned.to(self.device)
            base = torch.where(pin >= 0, pin, base)
            fixed = fixed | (pin >= 0)
        try:
            bar = tqdm(total=steps, desc=f"{self.name} ({sampler})", unit="step", disable=not progress, leave=False)
            if sampler == "masked":
                draft = self._masked(ctx, seq, base, fixed, steps, temperature, block_size, gens, bar, prefix_cache)
            else:
                draft = self._continuous(ctx, seq, base, fixed, steps, sampler, temperature, gens, bar)
            bar.close()
            final = seq.finalize(TextFinal(logits=ctx.logits, draft=draft, fixed=fixed, mask_id=den.mask_id, base=base))
            tokens = torch.where(fixed, base, final.tokens)
        finally:
            seq.end()
        return TextOutput(
            texts=[tok.decode(row.tolist()) for row in tokens.cpu()],
            tokens=tokens.cpu(),
            prompt_lengths=[len(p) for p in prompt_ids],
            report=run.report(),
        )

    def _prompt_ids(self, prompt: str | list[str] | None, batch: int, length: int) -> list[list[int]]:
        """Each row's prompt token ids (one ``prompt`` for ``batch`` rows, or one per row); a prompt
        filling every position is refused."""
        prompts = [prompt] * batch if prompt is None or isinstance(prompt, str) else list(prompt)
        prompt_ids = [self.tokenizer.encode(p) if p else [] for p in prompts]
        check_prompt_room(prompt_ids, length)
        return prompt_ids

    def _text_run(self, sampler: str, steps: int, seeds: list[int], temperature: float, length: int,
                  prompt_ids: list[list[int]]) -> RunState:
        """The run of one call: its facts for strategies (``run.info``)."""
        den = self.denoiser
        run = RunState(adapter=self.adapter or "text", num_steps=steps, batch_size=len(seeds), capabilities=run_capabilities(sampler),
                       model=self.model_kind)
        run.info.set(checkpoint=self.name, seeds=seeds, temperature=temperature, length=length, vocab_size=den.vocab_size, kind=den.kind, sampler=sampler,
                        time_conditioned=den.time_conditioned, n_layers=den.n_layers,
                        tokenizer=self.tokenizer, prompt_lengths=[len(p) for p in prompt_ids], cond_dim=den.cond_dim,
                        truncated_logits=TopKLogits, draw_tokens=_draw_tokens(list(den.special_ids)))
        return run

    def _post(self, ctx, seq: RunSequence, tokens, logits, masked, fixed, latents=None):
        """``post_step`` with a ``TextStepOutput``, built only if a strategy reads steps."""
        seq.post_step(lambda: self._step_output(ctx, tokens, logits, masked, fixed, latents))

    @staticmethod
    def _step_output(ctx, tokens, logits, masked, fixed, latents) -> "TextStepOutput":
        topk = None
        # the top-1 over every position, computed only if a strategy reads it (TextStepOutput);
        # the cached one serves the next partial step only if this step refreshed it
        prev, ctx.top1 = ctx.top1, None
        if isinstance(logits, TopKLogits):
            topk, logits = logits, ctx.logits
            top1_of = topk.top1
        else:
            def top1_of():
                top1_prob, top1 = _refresh_computed(ctx, logits, prev, most_probable)
                if logits is ctx.logits:
                    ctx.top1 = (top1_prob.clone(), top1.clone())
                return top1_prob, top1
        out = TextStepOutput(tokens=tokens, top1_of=top1_of, logits=logits, topk=topk, masked=masked, fixed=fixed,
                             computed=None if ctx.step_sel is None else ctx.step_sel.mask(), latents=latents)
        return out  # continuous samplers: tokens None, read as the top-1 when a strategy asks

    # -- the samplers' loops (masked.py, continuous.py) -----------------------------------------
    def _masked(self, ctx, seq: RunSequence, x, fixed, steps, temperature, block_size, gens, bar, prefix_cache=False):
        return masked_loop(self, ctx, seq, x, fixed, steps, temperature, block_size, gens, bar, prefix_cache)

    def _continuous(self, ctx, seq: RunSequence, base, fixed, steps, sampler, temperature, gens, bar):
        return continuous_loop(self, ctx, seq, base, fixed, steps, sampler, temperature, gens, bar)


def _draw_tokens(banned: list[int]):
    """``run.info.tokens.draw_tokens``: the sampler's ``draw`` with this model's special tokens banned."""
    def draw_tokens(logits, temperature: float, generator: torch.Generator):
        return draw(logits, banned, temperature, generator)
    return draw_tokens
