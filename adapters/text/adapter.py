"""The text adapter: what the core's CLI, config loader and bench need to drive text models."""

from __future__ import annotations

import sys
from pathlib import Path
from contextlib import contextmanager
from typing import Any

import attrs

from diffaccel.adapterkit import torch_dtype
from diffaccel.contract.capabilities import MASK_CONFIDENCES, PINNED_TOKENS, TOKEN_LOGITS, TOKEN_POSITIONS
from diffaccel.contract.errors import ConfigError, ConfigValueError, DiffaccelError
from diffaccel.contract.validators import in_range, one_of, positive

from .evaluation import judge, measure, metrics
from .tasks import mode as task_mode
from .families.diffusion_gemma.pipeline import BLOCK, BLOCK_CAPABILITIES, DiffusionGemmaPipeline, GemmaLayer
from .families.diffusion_gemma.loading import precheck
from .families.facts import check_options
from .families.dispatch import load_pipeline, text_facts
from .sampling.pipeline import SAMPLERS, TextDiffusionPipeline, check_prompt_room, TextLayer, TextOutput, run_capabilities

#: Standard deviation of the logit perturbation whose effect is the agreement noise floor.
NOISE_FLOOR_STD = 1e-4


@attrs.frozen(kw_only=True)
class TextOptions:
    """Keys of ``[model]`` that only the text adapter reads."""

    length: int = attrs.field(default=128, validator=positive)
    """Tokens per sample, prompt included (block sampler: generated tokens after the prompt, a multiple of the model's block)."""
    sampler: str | None = attrs.field(default=None, validator=one_of(SAMPLERS + (BLOCK,)))
    """masked, ddim, ddpm, hybrid or block (default: masked for masked models, hybrid for continuous, block for DiffusionGemma)."""
    temperature: float = attrs.field(default=1.0, validator=in_range(0.0, None))
    """Sampling temperature; 0 takes the argmax (block sampler: scales the model's temperature schedule, > 0)."""
    block_size: int | None = attrs.field(default=None, validator=positive)
    """Masked sampler: semi-autoregressive blocks of this many positions (default: one block)."""
    prompts: list[str] = attrs.Factory(list)
    """Prompt per batch row (repeated if shorter than the batch); empty: unconditional."""
    prefix_cache: bool = False
    """Masked sampler with ``block_size``: finished blocks attend among themselves only (block
    diffusion), so their keys and values are computed once per block instead of every step;
    exact for that attention pattern. Needs ``length`` a multiple of ``block_size``."""
    task: str | None = None
    """A task model's task (``arith``, ``ledger`` or ``sudoku``): row r of seed s solves held-out problem s + r
    (or the ``prompts``, which must be problems of the task), and quality is the task's accuracy
    (``acc``) and second metric; ``length`` and the default steps are the task's; no judge."""
    grid: int = 9
    """``task = "sudoku"``: the grid's size (9, 6 or 4); the model must be trained on it."""

    def __attrs_post_init__(self):
        task_mode.check_options(self)  # before any model loads: a prompt must be a problem of the task
        if not self.prefix_cache:
            return
        if self.sampler not in (None, "masked"):
            raise ConfigValueError("prefix_cache", f"needs the masked sampler, not '{self.sampler}'")
        if self.block_size is None or self.block_size >= self.length:
            raise ConfigValueError("prefix_cache", "needs block_size smaller than length (semi-autoregressive blocks)")
        if self.length % self.block_size:
            raise ConfigValueError("block_size", f"{self.block_size} does not divide length {self.length}; "
                                   "prefix_cache needs equal blocks")


@attrs.frozen(kw_only=True)
class StepsPeer:
    """Keys of ``[[peer]] use = "steps"``: the same model and sampler with fewer steps (commits
    spread evenly over them, as the sampler does), the trivial way to be faster that every text
    strategy must beat."""

    steps: int = attrs.field(validator=positive)
    """Denoising steps of this entry; below the config's own ``steps``."""
    name: str | None = None
    """Entry name in bench (default: steps-<steps>)."""
    block_size: int | None = attrs.field(default=None, validator=positive)
    """The masked sampler's blocks of this entry (None: the config's own ``block_size``); a bench
    config whose ``[model]`` differs in it runs as such a peer (``VARIANT_OPTIONS``)."""
    prefix_cache: bool | None = None
    """The exact prefix cache of this entry (None: the config's own ``prefix_cache``)."""


class TextAdapter:
    """The ``text`` adapter (entry point ``diffaccel.adapters: text``): ``TextDiffusionPipeline``
    over the shipped reference models, BERT-family masked LMs and LLaMA/Qwen2-class masked DLMs
    (LLaDA, Dream), and DiffusionGemma's pipeline."""

    name = "text"
    Options = TextOptions
    capabilities = frozenset({TOKEN_POSITIONS, MASK_CONFIDENCES, TOKEN_LOGITS, PINNED_TOKENS})
    """``mask-confidences`` only on runs of the masked sampler (``run.capabilities`` says)."""
    PEERS: dict[str, type] = {"steps": StepsPeer}
    VARIANT_OPTIONS = ("block_size", "prefix_cache")
    """``[model]`` keys in which a bench's configs may differ from the first's (beside ``steps``):
    each such model runs as a ``steps`` peer carrying them (``variant_peer``)."""
    layer_types = (TextLayer, GemmaLayer)

    @staticmethod
    def accepts(pipe: Any) -> bool:
        return isinstance(pipe, (TextDiffusionPipeline, DiffusionGemmaPipeline))

    @classmethod
    def attach(cls, pipe: TextDiffusionPipeline, accelerator) -> None:  # or a DiffusionGemmaPipeline
        pipe.adapter = cls.name  # the run reports name the adapter that drives it (a subclass: its own)
        pipe.accelerator = accelerator

    @staticmethod
    def detach(pipe: TextDiffusionPipeline) -> None:
        pipe.accelerator = None

    @classmethod
    def info(cls, pipe: TextDiffusionPipeline) -> dict[str, Any]:
        den = pipe.denoiser
        block = isinstance(pipe, DiffusionGemmaPipeline)
        info = {"adapter": cls.name, "vocab_size": den.vocab_size, "n_layers": den.n_layers, "kind": den.kind,
                "max_len": den.max_len, "time_conditioned": den.time_conditioned,
                "layers": [f"{'decoder' if block else 'block'}.{i}" for i in range(den.n_layers)],
                "cond_dim": den.cond_dim, "tokenizer": pipe.tokenizer,
                "capabilities": sorted(BLOCK_CAPABILITIES if block else run_capabilities("masked" if den.kind == "masked" else "hybrid"))}
        if block:  # uniform noise, no mask token, no pinned positions
            info.update(sampler=BLOCK, mask_id=None, canvas_length=pipe.canvas_length)
        return info

    @classmethod
    def load(cls, config) -> TextDiffusionPipeline:
        opts, where = config.options, f"{config.source}: [model]"
        problem = precheck(config.model.checkpoint, opts.length, opts.sampler, opts.block_size, opts.temperature)
        if problem:  # a DiffusionGemma folder's options, checked before its weights load
            key, _, message = problem.partition(": ")
            raise ConfigError(f"{where}: key '{key}': {message}")
        pipe = load_pipeline(config.model.checkpoint, config.model.allow_pickle).to(config.model.device,
                                                                                    torch_dtype(config.model.dtype))
        if isinstance(pipe, DiffusionGemmaPipeline):
            if opts.prefix_cache:
                raise ConfigError(f"{where}: key 'prefix_cache': DiffusionGemma serves its finished blocks from its own exact "
                                  "cache; prefix_cache is the masked sampler's option")
            TextAdapter._check_block(pipe, config, where)
        else:
            check_options(config, pipe.kind, pipe.denoiser.max_len, pipe.denoiser.time_conditioned)
            TextAdapter._check_prompts(pipe, config, where)
            if opts.task:
                try:
                    task_mode.check_model(task_mode.spec_of(opts), pipe.denoiser.max_len, config.model.checkpoint)
                except ConfigValueError as exc:
                    raise ConfigError(f"{where}: {exc}") from None
        pipe.adapter = cls.name  # the run reports name the adapter that loaded it (a subclass: its own)
        return pipe

    @classmethod
    def facts(cls, config) -> dict[str, Any]:
        """``info`` of the model ``config`` names, from its config files, without its weights; a
        DiffusionGemma checkpoint (facts from its generation config and canvas) is loaded as
        ``generate`` loads it, its own checks included."""
        info = text_facts(config)
        return {**(info if info is not None else cls.info(cls.load(config))), "adapter": cls.name}

    @staticmethod
    def _check_block(pipe: DiffusionGemmaPipeline, config, where: str) -> None:
        """DiffusionGemma's options, checked before any step runs."""
        o = config.options
        if o.sampler not in (None, BLOCK):
            raise ConfigError(f"{where}: key 'sampler': '{o.sampler}' does not fit the DiffusionGemma model '{config.model.checkpoint}' (uniform noise, no mask token); allowed: {BLOCK}")
        prompts = [o.prompts[i % len(o.prompts)] for i in range(config.model.batch)] if o.prompts else [None]
        problem = pipe.check(o.length, o.block_size, o.temperature, [len(p) for p in pipe.prompt_ids(prompts)])
        if problem:
            key, _, message = problem.partition(": ")
            raise ConfigError(f"{where}: key '{key}': {message}")

    @staticmethod
    def _check_prompts(pipe: TextDiffusionPipeline, config, where: str) -> None:
        """The config's own prompts must leave positions to generate (``length`` counts the prompt's
        positions too), checked with the tokenizer before any step runs."""
        o = config.options
        if not o.prompts or o.task:
            return
        try:
            check_prompt_room([pipe.tokenizer.encode(p) for p in o.prompts], o.length)
        except ValueError as exc:
            raise ConfigError(f"{where}: key 'prompts': {exc}") from None

    @staticmethod
    def run(pipe: TextDiffusionPipeline, config, seed: int, progress: bool = True, **extra) -> TextOutput:
        m, o = config.model, config.options
        if o.task and not isinstance(pipe, DiffusionGemmaPipeline):
            return task_mode.run(pipe, config, seed, progress, **extra)
        prompts = None
        if o.prompts:
            prompts = [o.prompts[i % len(o.prompts)] for i in range(m.batch)]
        block = isinstance(pipe, DiffusionGemmaPipeline)  # steps: per block, default from the checkpoint
        if not block:  # the masked sampler's exact prefix cache (refused at load for DiffusionGemma)
            extra = {"prefix_cache": o.prefix_cache, **extra}
        return pipe(prompts, length=o.length, steps=m.steps if block else (m.steps or o.length), seed=seed, batch=m.batch,
                    sampler=o.sampler, temperature=o.temperature, block_size=o.block_size, progress=progress, **extra)

    @staticmethod
    def block_length(pipe, config) -> int | None:
        """``StreamsBlocks``: DiffusionGemma's canvas, or the masked sampler's ``block_size``, when
        a run has more than one block (the samplers keep ``run.info.extra["committed"]``); task
        runs and the continuous samplers (every position moves until the end) have none."""
        o = config.options
        if isinstance(pipe, DiffusionGemmaPipeline):
            return pipe.canvas_length if o.length > pipe.canvas_length else None
        sampler = o.sampler or ("masked" if pipe.kind == "masked" else "hybrid")
        if o.task or sampler != "masked" or not o.block_size or o.block_size >= o.length:
            return None
        return o.block_size

    @staticmethod
    def reference_run(pipe, config, seed: int) -> TextOutput:
        """The unaccelerated run with logits perturbed by ~1e-4: its agreement is the noise floor."""
        return TextAdapter.run(pipe, config, seed, progress=False, logit_noise=NOISE_FLOOR_STD)

    @staticmethod
    def write(outputs: list[TextOutput], out: str | None) -> str:
        text = "\n\n".join(f"--- sample {i} ---\n{t}" for i, o in enumerate(outputs) for t in [*o.texts])
        if out is None:
            sys.stdout.write(text + "\n")
            return "stdout"
        path = Path(out)
        tmp = path.with_name(path.name + ".partial")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text + "\n", encoding="utf-8")
        tmp.replace(path)  # never leave a half-written file under the final name
        return str(path)

    @staticmethod
    def write_item(output: TextOutput, out_dir: Path, stem: str) -> dict[str, Any]:
        """``generate --prompts``: one item's fields of results.jsonl (its text; nothing else to write)."""
        return {"text": output.texts[0]}

    @staticmethod
    def load_judge(spec: str | None):
        """The judge the bench scores samples with (``judge.load_judge``; None: the default one)."""
        return judge.load_judge(spec or judge.DEFAULT_JUDGE)

    @staticmethod
    def judge_lines(outputs: list[TextOutput]) -> list[str]:
        return judge.judge_lines([t for o in outputs for t in o.texts])

    @staticmethod
    def quality_keys(config) -> list[str]:
        """What ``quality`` reports (``ReportsQuality``): the trigram perplexity, distinct-n and
        token agreement with the baseline; a task model's: ``acc``, its second metric, agreement."""
        if config.options.task:
            return task_mode.keys(config.options)
        return ["perplexity", "distinct_1", "distinct_2", "agreement"]

    @staticmethod
    def judged(config) -> bool:
        """Whether a judge scores this config's samples: not a task model's (its scores are exact)."""
        return not config.options.task

    @staticmethod
    def quality_parts(baseline: list[TextOutput], outputs: list[TextOutput], references: list[TextOutput] | None = None) -> list:
        """``PoolsQuality``: a task run's per-seed scores (pooled without scoring again); other runs
        keep their outputs, and ``quality`` pools those as before."""
        refs = references or [None] * len(outputs)
        if outputs and outputs[0].task is not None:
            return [task_mode.part(o, metrics.agreement(b.tokens, o.tokens, b.prompt_lengths)) for b, o in zip(baseline, outputs)]
        return [(b, o, r) for b, o, r in zip(baseline, outputs, refs)]

    @staticmethod
    def quality_of_parts(parts: list) -> dict[str, float]:
        if parts and not isinstance(parts[0][0], TextOutput):
            return task_mode.pool(parts)
        refs = [r for _, _, r in parts]
        return TextAdapter.quality([b for b, _, _ in parts], [o for _, o, _ in parts], None if None in refs else refs)

    @staticmethod
    def quality(baseline: list[TextOutput], outputs: list[TextOutput], references: list[TextOutput] | None = None) -> dict[str, float]:
        """Quality of ``outputs`` against the unaccelerated ``baseline`` of the same seeds."""
        if outputs and outputs[0].task is not None:
            return TextAdapter.quality_of_parts(TextAdapter.quality_parts(baseline, outputs))
        texts = [t for o in outputs for t in o.texts]
        q = metrics.text_quality(texts)
        q["agreement"] = sum(metrics.agreement(b.tokens, o.tokens, b.prompt_lengths) for b, o in zip(baseline, outputs)) / len(outputs)
        if references:
            q["agreement_noise_floor"] = sum(
                metrics.agreement(b.tokens, r.tokens, b.prompt_lengths) for b, r in zip(baseline, references)) / len(references)
        return q

    # -- peers ------------------------------------------------------------------------------------
    @staticmethod
    def check_peers(model, options, peers, source: str) -> None:
        """A ``steps`` peer must take fewer steps than the config (checked when the config loads)."""
        steps = model.steps or options.length
        for p in peers:
            if isinstance(p.config, StepsPeer) and p.config.steps >= steps:
                raise ConfigError(f"{source}: [[peer]] #{p.index} (steps): key 'steps': {p.config.steps} is not below the "
                                  f"config's {steps} steps; allowed: 1 to {steps - 1}")

    @staticmethod
    def peer_name(entry) -> str:
        c = entry.config
        blocks = "" if c.block_size is None else f"-b{c.block_size}" + ("-prefix" if c.prefix_cache else "")
        return c.name or f"steps-{c.steps}{blocks}"

    @staticmethod
    def peer_run_config(config, peer):
        """The config a peer entry runs: ``config`` with the peer's steps (and its blocks, where it sets them)."""
        options = config.options
        if peer.block_size is not None:
            options = attrs.evolve(options, block_size=peer.block_size)
        if peer.prefix_cache is not None:
            options = attrs.evolve(options, prefix_cache=peer.prefix_cache)
        return attrs.evolve(config, model=attrs.evolve(config.model, steps=peer.steps), options=options)

    @staticmethod
    def variant_peer(base, config) -> StepsPeer:
        """The steps peer that runs ``config``'s model (its ``[model]`` differs from ``base``'s in
        ``steps``, ``block_size`` and ``prefix_cache`` only) on ``base``'s pipeline: ``bench`` runs
        configs at other step counts or blocks side by side and ``tune --model-space steps=...``
        searches the step count with the strategies."""
        o, b = config.options, base.options
        steps = config.model.steps or o.length
        if (o.block_size, o.prefix_cache) == (b.block_size, b.prefix_cache):
            return StepsPeer(steps=steps)
        # one block of the whole length is no blocks: a peer of other blocks always names its own
        return StepsPeer(steps=steps, block_size=o.block_size or o.length, prefix_cache=o.prefix_cache)

    @staticmethod
    @contextmanager
    def peer_context(pipe, peer):
        """A ``steps`` peer runs the bare pipeline; only its config differs (``peer_run_config``)."""
        if pipe.accelerator is not None:
            raise DiffaccelError("a peer runs on the bare pipeline: leave diffaccel.apply first")
        yield pipe

    # -- what `diffaccel partial` and `diffaccel fluency` need (optional protocols) ---------------------
    @staticmethod
    def time_partial_steps(pipe, config, fractions, repeats):
        if isinstance(pipe, DiffusionGemmaPipeline):
            raise ConfigError(f"{config.source}: [model] key 'checkpoint': partial steps are timed on the reference and BERT-family models, not on DiffusionGemma '{config.model.checkpoint}'")

        return measure.time_partial_steps(pipe, config, fractions, repeats)

    @staticmethod
    def fluency_rows(pipe, config, seeds, judge=None):
        return measure.fluency_rows(pipe, config, seeds, TextAdapter.run, judge=judge)
