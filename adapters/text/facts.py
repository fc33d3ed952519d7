"""The text adapter's model facts without the weights (``TextAdapter.facts``, for ``diffaccel check``),
and the rule that checks the ``[model]`` options against a model's facts (at load and in check).

The same keys as ``TextAdapter.info(pipe)`` (but the tokenizer object), from the facts the
checkpoint's loader reads from its config files (``loading.model_facts``): the reference models'
config.json, a LLaMA/Qwen2-class or BERT-family config.json (through transformers' config
classes, no weights), the synthetic models' specs. Where ``load`` would refuse the checkpoint
(missing folder, hub id offline), this refuses it with the same line.
"""

from __future__ import annotations

from typing import Any

from diffaccel.contract.errors import ConfigError

from .diffusion_gemma import BLOCK
from .pipeline import run_capabilities


__all__ = ["check_options", "text_facts"]


def text_facts(config: Any) -> dict[str, Any] | None:
    """``info`` of the text model ``config`` names, without loading its weights; the
    ``[model]`` options are checked against them as ``load`` checks them. None where the facts
    need the model (DiffusionGemma)."""
    from .loading import model_facts  # loading imports the kinds, which import this module's check_options

    f = model_facts(config.model.checkpoint, config.model.allow_pickle)
    if f is None:
        return None
    check_options(config, f.kind, f.max_len, f.time_conditioned)
    return {"adapter": "text", "vocab_size": f.vocab_size, "n_layers": f.n_layers, "kind": f.kind, "max_len": f.max_len,
            "time_conditioned": f.time_conditioned, "layers": [f"block.{i}" for i in range(f.n_layers)], "cond_dim": f.cond_dim,
            "capabilities": sorted(run_capabilities("masked" if f.kind == "masked" else "hybrid"))}


def check_options(config, kind: str, max_len: int, time_conditioned: bool) -> None:
    """The ``[model]`` options against the model's facts: at load, and in ``facts`` (check)."""
    opts, where, ckpt = config.options, f"{config.source}: [model]", config.model.checkpoint
    if opts.sampler == BLOCK:
        raise ConfigError(f"{where}: key 'sampler': 'block' is DiffusionGemma's sampler, and '{ckpt}' is a {kind} model; allowed: {'masked' if kind == 'masked' else 'ddim, ddpm, hybrid'}")
    if opts.length > max_len:
        raise ConfigError(f"{where}: key 'length': {opts.length} exceeds the model's {max_len} positions")
    if opts.sampler is not None and (opts.sampler == "masked") != (kind == "masked"):
        allowed = "masked" if kind == "masked" else "ddim, ddpm, hybrid"
        raise ConfigError(f"{where}: key 'sampler': '{opts.sampler}' does not fit the {kind} model '{ckpt}'; allowed: {allowed}")
    if opts.prefix_cache and (kind != "masked" or time_conditioned):
        raise ConfigError(f"{where}: key 'prefix_cache': the {kind} model '{ckpt}' is "
                          f"{'time-conditioned' if kind == 'masked' else 'not a masked model'}; "
                          "prefix_cache needs a masked model that is not time-conditioned")
