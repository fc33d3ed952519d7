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

from typing import Any

import torch

from diffaccel.adapterkit import RunSequence
from diffaccel.kit.hygiene import deliberate

from ...sampling.outputs import TextOutput, TextStepOutput
from ...sampling.positions import Positions
from .layers import GemmaLayer, _Block, _GemmaContext, decoder_layer, softcap  # noqa: F401 - _Block: importable here
from .loop import BLOCK, BLOCK_CAPABILITIES, hooked_generate

__all__ = ["BLOCK", "BLOCK_CAPABILITIES", "DiffusionGemmaPipeline", "GemmaLayer", "decoder_layer", "softcap"]


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
        """``model.generate`` step for step with the hooks (``loop.hooked_generate``)."""
        return hooked_generate(self, input_ids, kw, seed, accel, logit_noise, progress, temperature)

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
