"""The rule that checks the ``[model]`` options against a model's facts (at load and in check);
the facts themselves, without the weights, are ``loading.text_facts``.

It imports no model kind: the kinds (``modernbert`` through ``protocol``) import this rule.
"""

from __future__ import annotations

from diffaccel.contract.errors import ConfigError

from .diffusion_gemma.pipeline import BLOCK


__all__ = ["check_options"]


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
