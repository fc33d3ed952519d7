"""The text adapter's model facts without the weights (``TextAdapter.facts``, for ``diffaccel check``).

The same keys as ``TextAdapter.info(pipe)`` (but the tokenizer object), read from what
``loading.load_pipeline`` reads first: the reference models' config.json, a LLaMA/Qwen2-class
or BERT-family config.json (through transformers' config classes, no weights), the synthetic
models' specs. A DiffusionGemma checkpoint, whose facts come from its generation config and
canvas, is loaded as ``generate`` loads it. Where ``load`` would refuse the checkpoint (missing
folder, hub id offline), this refuses it with the same line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from diffaccel.errors import ConfigError, ModelLoadError

from .diffusion_gemma import BLOCK, is_diffusion_gemma
from .loading import SHIPPED, SYNTHETIC, _refuse_unsupported_decoder, shipped_path


def _facts(kind: str, vocab_size: int, n_layers: int, max_len: int, time_conditioned: bool, cond_dim: int) -> dict[str, Any]:
    from .pipeline import run_capabilities

    return {"adapter": "text", "vocab_size": vocab_size, "n_layers": n_layers, "kind": kind, "max_len": max_len,
            "time_conditioned": time_conditioned, "layers": [f"block.{i}" for i in range(n_layers)], "cond_dim": cond_dim,
            "capabilities": sorted(run_capabilities("masked" if kind == "masked" else "hybrid"))}


def _reference(path: Path) -> dict[str, Any]:
    from .model import TextDiffusionConfig

    where = path / "config.json"
    try:
        cfg = TextDiffusionConfig.from_json(where.read_text())
    except (OSError, ValueError, TypeError) as exc:
        raise ModelLoadError(f"{where}: not a reference model's config ({exc})") from None
    return _facts(cfg.kind, cfg.vocab_size, cfg.n_layers, cfg.max_len, bool(cfg.time_conditioned or cfg.kind == "continuous"),
                  cfg.cond_dim)


def _transformers(cfg: dict[str, Any], where: Any, name_or_path: str) -> dict[str, Any]:
    from .llama import hf_config, is_decoder_config

    if is_decoder_config(cfg):
        conf, _ = hf_config(cfg, where)
        return _facts("masked", conf.vocab_size, conf.num_hidden_layers, conf.max_position_embeddings, False, 0)
    _refuse_unsupported_decoder(cfg, where)
    try:
        from transformers import AutoConfig

        conf = AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"checkpoint '{name_or_path}': transformers could not read its config ({first})") from None
    return _facts("masked", conf.vocab_size, conf.num_hidden_layers, conf.max_position_embeddings, False, 0)


def text_facts(config: Any) -> dict[str, Any] | None:
    """``info`` of the text model ``config`` names, without loading its weights; the
    ``[model]`` options are checked against them as ``load`` checks them. None for a
    DiffusionGemma checkpoint (its facts need the model)."""
    checkpoint = config.model.checkpoint
    path = Path(checkpoint)
    info: dict[str, Any] | None = None
    if checkpoint in SHIPPED:
        path = shipped_path(checkpoint)
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"shipped model '{checkpoint}' is missing at {path}; reinstall diffaccel or retrain it (see README)")
        info = _reference(path)
    elif checkpoint in SYNTHETIC:
        from .synthetic import SPECS

        spec = SPECS[checkpoint]
        info = _facts("masked", spec["vocab_size"], spec["num_hidden_layers"], spec.get("max_position_embeddings", 2048), False, 0)
    elif path.is_dir() and (path / "config.json").is_file():
        try:
            cfg = json.loads((path / "config.json").read_text())
        except ValueError as exc:
            raise ModelLoadError(f"{path / 'config.json'}: not valid JSON ({exc})") from None
        if not is_diffusion_gemma(cfg):
            info = _reference(path) if "kind" in cfg else _transformers(cfg, path / "config.json", checkpoint)
    elif path.exists() or checkpoint.startswith((".", "/", "~")):
        raise ModelLoadError(f"{checkpoint}: not a model folder (no config.json)")
    else:  # a hub id: its config.json only (cached, or fetched when online)
        from .loading import load_hub_config

        cfg = load_hub_config(checkpoint)
        if not is_diffusion_gemma(cfg):
            info = _transformers(cfg, f"{checkpoint}: config.json", checkpoint)
    if info is None:  # DiffusionGemma
        return None
    check_options(config, info["kind"], info["max_len"], info["time_conditioned"])
    return info


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
