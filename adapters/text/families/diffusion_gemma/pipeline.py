"""DiffusionGemma (transformers' ``DiffusionGemmaForBlockDiffusion``) driven with diffaccel's hooks.

The model generates block by block (``canvas_length`` tokens per block, "canvas"): a causal
encoder writes the finished tokens into its key/value cache, and a bidirectional decoder
denoises the active canvas from uniform noise (no mask token), with self-conditioning on the
last step's logits, entropy-bounded acceptance, re-noising of what was not accepted, and an
early exit once the argmax canvas is stable and confident.

``DiffusionGemmaPipeline`` runs that loop with transformers' own pieces (the encoder, the
generation config, ``EntropyBoundSampler``, the stopping criteria, ``_denoising_step``), so with
no strategy active its tokens are those of ``model.generate`` for the same seed; without an
accelerator it *is* ``model.generate``. What diffaccel adds is the decoder, run layer by layer:

* ``pre_step`` / ``post_step`` at each denoising step of the active canvas (``run.step`` counts
  steps over all blocks; ``run.timestep`` is the share of the block's steps left);
* ``layer_output`` per decoder layer (``model.model.decoder.layers[i]``), whose ``compute`` may run
  on a subset of the canvas positions: their queries attend over the finished blocks' keys and
  values read from the encoder's cache (never recomputed) and the canvas keys and values of the
  other positions as of their last computation;
* the head and the self-conditioning embedding (a softmax and a (V, D) product per position)
  run only on the positions computed.

Positions (``StepPlan.positions``, ``TextStepOutput``) are those of the active canvas, (B, C).
The first step of every block computes every position and layer whatever a strategy asks: the
caches of the last block hold another canvas. ``run.stop`` set by a strategy ends the active
block's denoising (the model's own early exit), not the generation.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from tqdm.auto import tqdm

from diffaccel.contract.adapter import Committed
from diffaccel.contract.capabilities import TOKEN_LOGITS, TOKEN_POSITIONS
from diffaccel.runtime.sequence import RunSequence, StepModel
from diffaccel.kit.hygiene import deliberate
from diffaccel.contract.state import RunState

from ...sampling.logits import TopKLogits, most_probable
from .layers import GemmaLayer, _Block, _GemmaContext, decoder_layer, softcap
from ...sampling.outputs import CommitProposal, TextFinal, TextOutput, TextStepOutput
from ...sampling.positions import Positions

#: how ``[model] sampler`` names this model family's sampler
__all__ = ["BLOCK", "BLOCK_CAPABILITIES", "DiffusionGemmaPipeline", "GemmaLayer", "decoder_layer", "softcap"]

BLOCK = "block"
#: what its runs offer strategies: no mask token (uniform noise), no pinned tokens
BLOCK_CAPABILITIES = frozenset({TOKEN_POSITIONS, TOKEN_LOGITS})


class _StepResult:
    """What ``_denoising_step`` reads from its ``decoder_forward``."""

    __slots__ = ("logits",)

    def __init__(self, logits):
        self.logits = logits


class DiffusionGemmaPipeline:
    """Generate with a ``DiffusionGemmaForBlockDiffusion``: ``pipe(prompt, length=64, seed=0)``.

    ``length`` counts the generated tokens (``max_new_tokens``), a multiple of the model's
    ``canvas_length``; ``steps`` is the most denoising steps per block (default: the checkpoint's
    generation config); ``temperature`` scales its linear temperature schedule (1: unchanged).
    The whole batch draws from one random stream seeded with ``seed``, as ``generate`` does after
    ``torch.manual_seed(seed)``: a row depends on the batch it is generated in.
    """

    kind = BLOCK

    def __init__(self, model, tokenizer, name: str = "diffusion-gemma"):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.accelerator = None
        cfg = model.config
        tc = cfg.text_config
        self.denoiser = self  # the adapter reads the model facts below through ``pipe.denoiser``
        self.vocab_size = tc.vocab_size
        self.n_layers = tc.num_hidden_layers
        self.max_len = tc.max_position_embeddings
        self.canvas_length = cfg.canvas_length
        self.time_conditioned = False
        self.cond_dim = 0
        self.mask_id = None  # uniform noise: no mask token
        self.special_ids = {i for i in (tc.pad_token_id, tc.bos_token_id) if i is not None}
        gc = model.generation_config
        self.bos_id = gc.bos_token_id if gc.bos_token_id is not None else tc.bos_token_id
        self.pad_id = gc.pad_token_id if gc.pad_token_id is not None else tc.pad_token_id

    @property
    def device(self) -> torch.device:
        return self.model.device

    def to(self, device=None, dtype=None) -> "DiffusionGemmaPipeline":
        self.model.to(device=None if device is None else torch.device(device), dtype=dtype)
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    # -- inputs ----------------------------------------------------------------------------------
    def prompt_ids(self, prompts: list[str | None]) -> list[list[int]]:
        """Each prompt's ids after the BOS token (an empty prompt is BOS alone)."""
        bos = [] if self.bos_id is None else [self.bos_id]
        return [bos + (self.tokenizer.encode(p) if p else []) for p in prompts]

    def check(self, length: int, block_size: int | None, temperature: float, prompt_lengths: list[int]) -> str | None:
        """What is wrong with these options for this model, as ``key: message``, or None."""
        wrong = _block_options(length, block_size, temperature, self.canvas_length)
        if wrong:
            return wrong
        if len(set(prompt_lengths)) > 1:
            return f"prompts: they tokenize to different lengths {sorted(set(prompt_lengths))}; the block sampler needs prompts of one length per batch (no padding)"
        if prompt_lengths and max(prompt_lengths) + length > self.max_len:
            return f"length: prompt + length = {max(prompt_lengths) + length} exceeds the model's {self.max_len} positions"
        return None

    def _gen_kwargs(self, length: int, steps: int | None, temperature: float) -> dict[str, Any]:
        from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

        gc = self.model.generation_config
        d = DiffusionGemmaGenerationConfig._get_default_generation_params()
        t_min = gc.t_min if gc.t_min is not None else d["t_min"]
        t_max = gc.t_max if gc.t_max is not None else d["t_max"]
        kw: dict[str, Any] = {"max_new_tokens": length, "cache_implementation": None, "disable_compile": True}
        if steps is not None:
            kw["max_denoising_steps"] = steps
        if temperature != 1.0:
            kw["t_min"], kw["t_max"] = t_min * temperature, t_max * temperature
        return kw

    # -- public call -----------------------------------------------------------------------------
    @torch.no_grad()
    def __call__(self, prompt: str | list[str] | None = None, *, length: int = 64, steps: int | None = None,
                 seed: int = 0, batch: int = 1, sampler: str | None = None, temperature: float = 1.0,
                 block_size: int | None = None, progress: bool = True, logit_noise: float = 0.0):
        if sampler not in (None, BLOCK):
            raise ValueError(f"sampler {sampler!r} does not fit DiffusionGemma; allowed: {BLOCK}")
        prompts = [prompt] * batch if prompt is None or isinstance(prompt, str) else list(prompt)
        ids = self.prompt_ids(prompts)
        problem = self.check(length, block_size, temperature, [len(p) for p in ids])
        if problem:
            raise ValueError(problem)
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        kw = self._gen_kwargs(length, steps, temperature)
        accel = self.accelerator
        devices = [self.device] if self.device.type == "cuda" else []
        # one stream for the batch, seeded like ``torch.manual_seed(seed); model.generate(...)``,
        # without disturbing the caller's global generator
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            if accel is None and not logit_noise:  # untouched: transformers' own loop
                out = self.model.generate(input_ids, **kw)
                seqs, report = out.sequences, {"adapter": getattr(self, "adapter", None) or "text", "steps_run": None, "counters": {}, "strategies": {}}
            else:
                seqs, report = self._hooked(input_ids, kw, seed, accel, logit_noise, progress, temperature)
        P = input_ids.shape[1]
        if seqs.shape[1] < P + length:  # every row ended (EOS) before the last block: pad as generate pads
            seqs = torch.nn.functional.pad(seqs, (0, P + length - seqs.shape[1]), value=self.pad_id if self.pad_id is not None else 0)
        seqs = seqs.cpu()
        return TextOutput(texts=[self.tokenizer.decode(row[P:].tolist()) for row in seqs], tokens=seqs,
                          prompt_lengths=[P] * seqs.shape[0], report=report)

    # -- the hooked loop -------------------------------------------------------------------------
    def _hooked(self, input_ids: torch.Tensor, kw: dict[str, Any], seed: int, accel, logit_noise: float, progress: bool,
                temperature: float = 1.0):
        """``DiffusionGemmaGenerationMixin.generate`` (transformers 5.x), step for step, with the
        decoder replaced by the hooked one and the hooks called around each denoising step."""
        model = self.model
        gc, model_kwargs = model._prepare_generation_config(None, **kw)
        B, cur_len = input_ids.shape
        prompt_len = cur_len
        _, max_new = model._prepare_generated_length(gc, cur_len)
        C = model.config.canvas_length
        n_blocks = math.ceil(max_new / C)
        steps = gc.max_denoising_steps
        device = input_ids.device
        cache = model._prepare_cache_for_generation(generation_config=gc, batch_size=B, max_length=cur_len + max_new)
        eos = torch.tensor(gc.eos_token_id, device=device) if gc.eos_token_id is not None else None
        finished = torch.zeros(B, dtype=torch.bool, device=device)
        enc_pos = torch.arange(0, cur_len, dtype=torch.int32, device=device).unsqueeze(0)
        dec_pos = torch.arange(cur_len, cur_len + C, dtype=torch.int32, device=device).unsqueeze(0)
        attention_mask = torch.ones((B, cur_len), dtype=torch.bool, device=device)
        dec_mask = torch.nn.functional.pad(attention_mask, (0, C), value=True)
        sampler = model._prepare_sampler(gc)
        processors = model._prepare_logits_processor(gc, None)
        stopping = model._prepare_ar_stopping_criteria(gc, None)
        adaptive = model._prepare_diffusion_stopping_criteria(gc)

        run = RunState(adapter=getattr(self, "adapter", None) or "text", num_steps=n_blocks * steps, batch_size=B, capabilities=BLOCK_CAPABILITIES)
        run.info.set(checkpoint=self.name, seeds=[seed] * B, temperature=temperature, length=C, vocab_size=self.vocab_size, kind=BLOCK,
                        sampler=BLOCK, time_conditioned=False, n_layers=self.n_layers, tokenizer=self.tokenizer,
                        prompt_lengths=[0] * B, cond_dim=0, canvas_length=C, blocks=n_blocks, pins=False,
                        layers=[f"decoder.{i}" for i in range(self.n_layers)], truncated_logits=TopKLogits)
        run.positions_per_layer = B * C
        noise_gen = torch.Generator().manual_seed(10_000_019 + seed)
        seq = RunSequence(accel, run)
        seq.start()
        ctx = step_model = None
        try:
            bar = tqdm(total=n_blocks * steps, desc=f"{self.name} (block)", unit="step", disable=not progress, leave=False)
            is_prefill, step, blocks_run = True, 0, 0
            for _ in range(n_blocks):
                ids_in, enc_masks = model._prepare_encoder_inputs(
                    input_ids=input_ids, attention_mask=attention_mask, encoder_position_ids=enc_pos, cache=cache,
                    is_prefill=is_prefill, canvas_length=C, batch_size=B, **model_kwargs)
                cache = model.model.encoder(input_ids=ids_in, attention_mask=enc_masks, cache=cache,
                                            position_ids=enc_pos, **model_kwargs).cache
                is_prefill = False
                canvas, sc_logits, mask_mapping, done = model._prepare_denoiser_inputs(
                    decoder_attention_mask=dec_mask, cache=cache, sampler=sampler, diffusion_stopping_criteria=adaptive,
                    batch_size=B, device=device, model_kwargs=model_kwargs)
                argmax = canvas
                if ctx is None:
                    ctx = _GemmaContext(model, run, mask_mapping)
                    step_model = _GemmaStep(self, ctx, seq.accel, logit_noise, noise_gen)
                ctx.mask_mapping = mask_mapping
                ctx.new_block(_Block(model, cache, B, C, dec_pos))
                held = held_tokens = None  # positions strategies committed in this block, and their tokens

                def decoder_forward(decoder_input_ids, self_conditioning_logits, **_):
                    step_model.canvas, step_model.sc_logits = decoder_input_ids, self_conditioning_logits
                    out = seq.denoise(step_model)
                    return _StepResult(out.dense() if isinstance(out, TopKLogits) else out)

                for cur_step in reversed(range(1, steps + 1)):
                    run.step, run.timestep = step, cur_step / steps
                    canvas, argmax, sc_logits, done = model._denoising_step(
                        decoder_forward=decoder_forward, current_canvas=canvas, argmax_canvas=argmax,
                        input_ids=input_ids, decoder_position_ids=dec_pos, self_conditioning_logits=sc_logits,
                        mask_mapping=mask_mapping, cache=cache, finished_denoising=done, cur_step=cur_step,
                        sampler=sampler, logits_processor=processors, diffusion_stopping_criteria=adaptive, **model_kwargs)
                    ctx.fresh = False
                    proposed: list[CommitProposal] = []  # built only if a strategy commits
                    extra = seq.commit(lambda: proposed.append(_proposal(ctx, argmax, sc_logits, done, held, temperature,
                                                                         cur_step)) or proposed[0])
                    if extra is not None:  # committed positions keep their token for the rest of the block
                        extra = extra.to(device) & proposed[0].candidates
                        held = extra if held is None else held | extra
                        held_tokens = argmax.clone() if held_tokens is None else torch.where(extra, argmax, held_tokens)
                    if held is not None:
                        canvas, argmax = torch.where(held, held_tokens, canvas), torch.where(held, held_tokens, argmax)
                    self._post(ctx, seq, argmax, sc_logits, held)
                    step += 1
                    bar.update(1)
                    if bool(done.all()) or seq.stopped:  # the model's early exit, or a strategy's
                        run.stop = False
                        break
                blocks_run += 1
                input_ids = torch.cat([input_ids, argmax], dim=-1)
                input_ids, finished = model._finalize_canvas(input_ids=input_ids, finished_sequences=finished,
                                                             generation_config=gc, stopping_criteria=stopping,
                                                             canvas_length=C, eos_tensor=eos)
                run.info.set(committed=_committed(self.tokenizer, input_ids, prompt_len))  # serve streams it
                if bool(finished.all()):
                    break
                cur_len, dec_mask, attention_mask, enc_pos, dec_pos = model._prepare_kwargs_for_next_canvas(
                    attention_mask=attention_mask, decoder_attention_mask=dec_mask, decoder_position_ids=dec_pos,
                    canvas_length=C, cur_len=cur_len)
            bar.close()
            run.step = step - 1
            final = TextFinal(logits=ctx.logits, draft=argmax, fixed=torch.zeros_like(argmax, dtype=torch.bool),
                              mask_id=-1, tokens=argmax, base=None)
            seq.finalize(final)  # the tokens are the model's: strategies add metrics only
        finally:
            seq.end()
        report = run.report()
        report["blocks_run"] = blocks_run
        return input_ids, report

    def _step_logits(self, ctx: _GemmaContext, accel, canvas: torch.Tensor, sc_logits: torch.Tensor | None) -> torch.Tensor:
        """One hooked decoder evaluation of the canvas (B, C) -> logits (B, C, V), computing the
        positions ``run.plan`` names (every one at a block's first step)."""
        run = ctx.run
        plan = run.plan
        model = self.model
        dec = model.model.decoder
        if ctx.fresh or plan is None or plan.positions is None or bool(plan.positions.all()):
            sel = ctx.step_sel = None
            emb = dec.embed_tokens(canvas)
            if sc_logits is not None:
                soft = torch.matmul(sc_logits.softmax(dim=-1, dtype=torch.float32).to(dec.embed_tokens.weight.dtype),
                                    dec.embed_tokens.weight) * dec.embed_tokens.embed_scale.to(emb.dtype)
            else:
                soft = torch.zeros_like(emb)
            h = ctx.h0 = dec.self_conditioning(emb, soft)
        else:
            sel = ctx.step_sel = Positions(plan.positions.to(canvas.device))
            emb = dec.embed_tokens(canvas.reshape(-1).index_select(0, sel.flat))
            rows = sel.gather(sc_logits)
            soft = torch.matmul(rows.softmax(dim=-1, dtype=torch.float32).to(dec.embed_tokens.weight.dtype),
                                dec.embed_tokens.weight) * dec.embed_tokens.embed_scale.to(emb.dtype)
            h = sel.scatter_(ctx.h0, dec.self_conditioning(emb, soft))
        ctx.last_sel = None
        for layer in ctx.layers:
            h = accel.layer_output(run, layer, h)
        cap = model.final_logit_softcapping
        head = sel
        if not ctx.fresh and h is ctx.out[-1]:
            head = ctx.last_sel  # the head runs where the last layer ran
        if head is None or ctx.logits is None:
            ctx.logits = softcap(model.lm_head(dec.norm(h)), cap)
        elif head.count:
            head.scatter_(ctx.logits, softcap(model.lm_head(dec.norm(head.gather(h))), cap))
        return ctx.logits

    @staticmethod
    def _post(ctx: _GemmaContext, seq: RunSequence, argmax: torch.Tensor, logits: torch.Tensor,
              held: torch.Tensor | None) -> None:
        """``post_step``; the top-1's probability (a softmax over the vocabulary) only if read."""
        def output() -> TextStepOutput:
            computed = None if ctx.step_sel is None else ctx.step_sel.mask()
            def top1_of():  # float32 as the model's own sampler computes its probabilities (line 53)
                with deliberate("DiffusionGemma's top-1 probability: a float32 softmax, as its own sampler takes it"):
                    return tuple(logits.float().softmax(-1).max(-1))
            return TextStepOutput(tokens=argmax, top1=argmax, top1_of=top1_of,
                                  logits=logits, computed=computed, masked=None, fixed=held)

        seq.post_step(output)


class _GemmaStep(StepModel):
    """One decoder evaluation of the active canvas, for ``RunSequence.denoise``."""

    def __init__(self, pipe: DiffusionGemmaPipeline, ctx: _GemmaContext, accel, logit_noise: float, noise_gen):
        self.pipe, self.ctx, self.accel = pipe, ctx, accel
        self.logit_noise, self.noise_gen = logit_noise, noise_gen
        self.canvas: torch.Tensor | None = None
        self.sc_logits: torch.Tensor | None = None

    def compute(self) -> torch.Tensor:
        return self.pipe._step_logits(self.ctx, self.accel, self.canvas, self.sc_logits)

    def reuse(self) -> torch.Tensor | None:
        ctx = self.ctx
        if ctx.logits is None or ctx.fresh:  # a block's first step computes everything
            return None
        ctx.step_sel = Positions(torch.zeros(self.canvas.shape, dtype=torch.bool, device=self.canvas.device))
        return ctx.logits

    def output(self, raw: torch.Tensor) -> torch.Tensor:
        if self.logit_noise:
            return raw + self.logit_noise * torch.randn(raw.shape, generator=self.noise_gen).to(raw)
        return raw


def _proposal(ctx: _GemmaContext, argmax: torch.Tensor, logits: torch.Tensor, done: torch.Tensor,
              held: torch.Tensor | None, temperature: float, steps_left: int) -> CommitProposal:
    """The block sampler's step as a ``CommitProposal``: every canvas position of a row still
    denoising and not yet committed is a candidate with its argmax token; the model's sampler
    commits nothing for good on its own (it re-noises what it did not accept): ``scheduled`` is empty."""
    prob, _ = most_probable(logits.float())
    candidates = (~done)[:, None].expand_as(argmax).clone()
    if held is not None:
        candidates &= ~held
    computed = None if ctx.step_sel is None else ctx.step_sel.mask()
    return CommitProposal(candidates=candidates, tokens=argmax, confidence=prob, scheduled=torch.zeros_like(candidates),
                          logits=logits, computed=computed, temperature=temperature, steps_left=[steps_left] * argmax.shape[0])


def _committed(tokenizer, input_ids: torch.Tensor, prompt_len: int) -> Committed:
    """Every block so far is final (``StreamsBlocks``): the generated text, decoded as the output's."""
    return Committed([input_ids.shape[1] - prompt_len] * input_ids.shape[0],
                     lambda r: tokenizer.decode(input_ids[r, prompt_len:].cpu().tolist()))


def _multiples(length: int, C: int) -> str:
    """The multiples of C around ``length``, as a user would pick one."""
    lo = length - length % C
    return f"{lo} or {lo + C}" if lo else str(C)


def _block_options(length: int, block_size: int | None, temperature: float, C: int, where: str = "") -> str | None:
    """The checks of length, block_size and temperature against the model's canvas_length ``C``,
    shared by the pre-load check (config.json) and the loaded pipeline's, as ``key: message``."""
    if length % C:
        return f"length: {length} is not a multiple of the model's block (canvas_length {C}{where}); use {_multiples(length, C)}"
    if block_size is not None and block_size != C:
        return f"block_size: {block_size}, but this model denoises blocks of canvas_length {C} (fixed by its training); leave it out or set {C}"
    if not temperature > 0:
        return f"temperature: must be > 0 for the block sampler (it scales the model's temperature schedule), got {temperature}"
    return None
