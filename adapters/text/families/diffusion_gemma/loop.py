"""DiffusionGemma's generation loop with diffaccel's hooks (``hooked_generate``):
``DiffusionGemmaGenerationMixin.generate`` (transformers 5.x) step for step, with the decoder replaced
by the pipeline's hooked one (``DiffusionGemmaPipeline._step_logits``) and the core's hooks called
around each denoising step (the pipeline's docstring says what strategies see)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import torch
from tqdm.auto import tqdm

from diffaccel.adapterkit import RunSequence, StepModel
from diffaccel.contract.adapter import Committed
from diffaccel.contract.capabilities import TOKEN_LOGITS, TOKEN_POSITIONS
from diffaccel.contract.state import RunState

from ...sampling.logits import TopKLogits, most_probable
from ...sampling.outputs import CommitProposal, TextFinal
from ...sampling.positions import Positions
from .layers import _Block, _GemmaContext

#: how ``[model] sampler`` names this model family's sampler
BLOCK = "block"
#: what its runs offer strategies: no mask token (uniform noise), no pinned tokens
BLOCK_CAPABILITIES = frozenset({TOKEN_POSITIONS, TOKEN_LOGITS})


class _StepResult:
    """What ``_denoising_step`` reads from its ``decoder_forward``."""

    __slots__ = ("logits",)

    def __init__(self, logits):
        self.logits = logits


def hooked_generate(pipe: Any, input_ids: torch.Tensor, kw: dict[str, Any], seed: int, accel, logit_noise: float,
                    progress: bool, temperature: float = 1.0):
    """``DiffusionGemmaGenerationMixin.generate`` (transformers 5.x), step for step, with the
    decoder replaced by the hooked one and the hooks called around each denoising step; returns
    the sequences and the run's report."""
    model = pipe.model
    g = _prepare(model, input_ids, kw)
    B, C, steps, prompt_len = g.B, g.C, g.steps, input_ids.shape[1]
    run = _block_run(pipe, g, seed, temperature)
    noise_gen = torch.Generator().manual_seed(10_000_019 + seed)
    seq = RunSequence(accel, run)
    seq.start()
    ctx = step_model = None
    try:
        bar = tqdm(total=g.n_blocks * steps, desc=f"{pipe.name} (block)", unit="step", disable=not progress, leave=False)
        is_prefill, step, blocks_run = True, 0, 0
        for _ in range(g.n_blocks):
            canvas, sc_logits, mask_mapping, done = _open_block(model, g, input_ids, is_prefill)
            is_prefill = False
            argmax = canvas
            if ctx is None:
                ctx = _GemmaContext(model, run, mask_mapping)
                step_model = _GemmaStep(pipe, ctx, seq.accel, logit_noise, noise_gen)
            ctx.mask_mapping = mask_mapping
            ctx.new_block(_Block(model, g.cache, B, C, g.dec_pos))
            held = held_tokens = None  # positions strategies committed in this block, and their tokens

            def decoder_forward(decoder_input_ids, self_conditioning_logits, **_):
                step_model.canvas, step_model.sc_logits = decoder_input_ids, self_conditioning_logits
                out = seq.denoise(step_model)
                return _StepResult(out.dense() if isinstance(out, TopKLogits) else out)

            for cur_step in reversed(range(1, steps + 1)):
                run.step, run.timestep = step, cur_step / steps
                canvas, argmax, sc_logits, done = model._denoising_step(
                    decoder_forward=decoder_forward, current_canvas=canvas, argmax_canvas=argmax,
                    input_ids=input_ids, decoder_position_ids=g.dec_pos, self_conditioning_logits=sc_logits,
                    mask_mapping=mask_mapping, cache=g.cache, finished_denoising=done, cur_step=cur_step,
                    sampler=g.sampler, logits_processor=g.processors, diffusion_stopping_criteria=g.adaptive,
                    **g.model_kwargs)
                ctx.fresh = False
                canvas, argmax, held, held_tokens = _commit(ctx, seq, canvas, argmax, sc_logits, done, held,
                                                            held_tokens, temperature, cur_step)
                pipe._post(ctx, seq, argmax, sc_logits, held)
                step += 1
                bar.update(1)
                if bool(done.all()) or seq.stopped:  # the model's early exit, or a strategy's
                    run.stop = False
                    break
            blocks_run += 1
            input_ids = torch.cat([input_ids, argmax], dim=-1)
            input_ids, g.finished = model._finalize_canvas(input_ids=input_ids, finished_sequences=g.finished,
                                                           generation_config=g.gc, stopping_criteria=g.stopping,
                                                           canvas_length=C, eos_tensor=g.eos)
            run.info.set(committed=_committed(pipe.tokenizer, input_ids, prompt_len))  # serve streams it
            if bool(g.finished.all()):
                break
            g.cur_len, g.dec_mask, g.attention_mask, g.enc_pos, g.dec_pos = model._prepare_kwargs_for_next_canvas(
                attention_mask=g.attention_mask, decoder_attention_mask=g.dec_mask, decoder_position_ids=g.dec_pos,
                canvas_length=C, cur_len=g.cur_len)
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


def _prepare(model, input_ids: torch.Tensor, kw: dict[str, Any]) -> SimpleNamespace:
    """What ``generate`` prepares before its first block, transformers' own pieces: the generation
    config, the cache, positions and masks of the first canvas, the sampler and the criteria."""
    gc, model_kwargs = model._prepare_generation_config(None, **kw)
    B, cur_len = input_ids.shape
    _, max_new = model._prepare_generated_length(gc, cur_len)
    C = model.config.canvas_length
    device = input_ids.device
    attention_mask = torch.ones((B, cur_len), dtype=torch.bool, device=device)
    return SimpleNamespace(
        gc=gc, model_kwargs=model_kwargs, B=B, cur_len=cur_len, C=C, n_blocks=math.ceil(max_new / C),
        steps=gc.max_denoising_steps,
        cache=model._prepare_cache_for_generation(generation_config=gc, batch_size=B, max_length=cur_len + max_new),
        eos=torch.tensor(gc.eos_token_id, device=device) if gc.eos_token_id is not None else None,
        finished=torch.zeros(B, dtype=torch.bool, device=device),
        enc_pos=torch.arange(0, cur_len, dtype=torch.int32, device=device).unsqueeze(0),
        dec_pos=torch.arange(cur_len, cur_len + C, dtype=torch.int32, device=device).unsqueeze(0),
        attention_mask=attention_mask, dec_mask=torch.nn.functional.pad(attention_mask, (0, C), value=True),
        sampler=model._prepare_sampler(gc), processors=model._prepare_logits_processor(gc, None),
        stopping=model._prepare_ar_stopping_criteria(gc, None), adaptive=model._prepare_diffusion_stopping_criteria(gc))


def _block_run(pipe: Any, g: SimpleNamespace, seed: int, temperature: float) -> RunState:
    """The run of one generation: its facts for strategies (``run.info``)."""
    B, C = g.B, g.C
    run = RunState(adapter=getattr(pipe, "adapter", None) or "text", num_steps=g.n_blocks * g.steps, batch_size=B,
                   capabilities=BLOCK_CAPABILITIES)
    run.info.set(checkpoint=pipe.name, seeds=[seed] * B, temperature=temperature, length=C, vocab_size=pipe.vocab_size,
                 kind=BLOCK, sampler=BLOCK, time_conditioned=False, n_layers=pipe.n_layers, tokenizer=pipe.tokenizer,
                 prompt_lengths=[0] * B, cond_dim=0, canvas_length=C, blocks=g.n_blocks, pins=False,
                 layers=[f"decoder.{i}" for i in range(pipe.n_layers)], truncated_logits=TopKLogits)
    run.positions_per_layer = B * C
    return run


def _open_block(model, g: SimpleNamespace, input_ids: torch.Tensor, is_prefill: bool):
    """A block begins: the encoder writes the finished tokens into the cache (``g.cache``), and the
    denoiser's inputs are drawn: canvas, self-conditioning logits, mask mapping, rows done."""
    ids_in, enc_masks = model._prepare_encoder_inputs(
        input_ids=input_ids, attention_mask=g.attention_mask, encoder_position_ids=g.enc_pos, cache=g.cache,
        is_prefill=is_prefill, canvas_length=g.C, batch_size=g.B, **g.model_kwargs)
    g.cache = model.model.encoder(input_ids=ids_in, attention_mask=enc_masks, cache=g.cache,
                                  position_ids=g.enc_pos, **g.model_kwargs).cache
    return model._prepare_denoiser_inputs(
        decoder_attention_mask=g.dec_mask, cache=g.cache, sampler=g.sampler, diffusion_stopping_criteria=g.adaptive,
        batch_size=g.B, device=input_ids.device, model_kwargs=g.model_kwargs)


def _commit(ctx: _GemmaContext, seq: RunSequence, canvas: torch.Tensor, argmax: torch.Tensor, sc_logits: torch.Tensor,
            done: torch.Tensor, held: torch.Tensor | None, held_tokens: torch.Tensor | None, temperature: float,
            cur_step: int):
    """The commit hook after a denoising step: positions strategies commit keep their token for the
    rest of the block. Returns canvas, argmax, held and held_tokens."""
    proposed: list[CommitProposal] = []  # built only if a strategy commits
    extra = seq.commit(lambda: proposed.append(_proposal(ctx, argmax, sc_logits, done, held, temperature,
                                                         cur_step)) or proposed[0])
    if extra is not None:  # committed positions keep their token for the rest of the block
        extra = extra.to(canvas.device) & proposed[0].candidates
        held = extra if held is None else held | extra
        held_tokens = argmax.clone() if held_tokens is None else torch.where(extra, argmax, held_tokens)
    if held is not None:
        canvas, argmax = torch.where(held, held_tokens, canvas), torch.where(held, held_tokens, argmax)
    return canvas, argmax, held, held_tokens


class _GemmaStep(StepModel):
    """One decoder evaluation of the active canvas, for ``RunSequence.denoise``."""

    def __init__(self, pipe: Any, ctx: _GemmaContext, accel, logit_noise: float, noise_gen):
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
