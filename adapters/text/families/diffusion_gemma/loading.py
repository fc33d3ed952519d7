"""DiffusionGemma checkpoints (config.json ``model_type = "diffusion_gemma"``, a local folder or a
hub id): transformers' ``DiffusionGemmaForBlockDiffusion`` and its tokenizer, run by
``DiffusionGemmaPipeline``. Its facts come from its generation config and canvas, so ``diffaccel
check`` loads it; ``precheck`` checks the block sampler's options against a local folder's
config.json before the weights load."""

from __future__ import annotations

import json
from pathlib import Path

from diffaccel.contract.errors import ModelLoadError

from diffaccel.adapters.checkpoints import check_loading_info, check_vocab, precheck_folder, quiet_loading
from .pipeline import BLOCK, DiffusionGemmaPipeline, _block_options
from ...loading.loader import Loaded, Source, first_line
from ...sampling.tokenizer import HFTokenizer

WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def is_diffusion_gemma(config: dict) -> bool:
    return config.get("model_type") == "diffusion_gemma"


def load_diffusion_gemma(source: Source) -> Loaded:
    """The model and tokenizer of a DiffusionGemma folder or hub id. Missing files and loading
    failures are one ``ModelLoadError`` naming the checkpoint and what is wrong."""
    from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion  # seconds to import: deferred to a load
    from transformers.utils import logging as hf_logging

    name_or_path, allow_pickle = source.checkpoint, source.allow_pickle
    safe = True
    if source.path is not None:
        path = source.path
        safe = precheck_folder(path, allow_pickle)  # whole safetensors headers; pickles only if allowed
        if safe and not any((path / f).is_file() for f in WEIGHTS):
            raise ModelLoadError(f"{path}: a DiffusionGemma folder (config.json model_type 'diffusion_gemma') without its weights; expected one of {', '.join(WEIGHTS)}")
        if not any((path / f).is_file() for f in TOKENIZER_FILES):
            raise ModelLoadError(f"{path}: no tokenizer beside the DiffusionGemma weights; expected one of {', '.join(TOKENIZER_FILES)}")
    try:
        hf_logging.disable_progress_bar()  # errors stay one line; a load is seconds here
        # a pickle (allowed) goes through transformers' torch.load(weights_only=True)
        with quiet_loading():
            model, info = DiffusionGemmaForBlockDiffusion.from_pretrained(
                name_or_path, use_safetensors=True if safe and not allow_pickle else None,
                output_loading_info=True, ignore_mismatched_sizes=True)
            tok = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError, TypeError) as exc:
        raise ModelLoadError(f"checkpoint '{name_or_path}': transformers could not load it as DiffusionGemma ({first_line(exc, 200)})") from None
    check_loading_info(info, name_or_path)
    check_vocab(tok.vocab_size, model.get_input_embeddings().num_embeddings, name_or_path, exact=False, with_added=len(tok))
    return Loaded(denoiser=model, tokenizer=HFTokenizer(tok), name=source.name, weights=model, where=name_or_path,
                  pipeline=DiffusionGemmaPipeline)


class DiffusionGemmaLoader:
    names = ()

    def recognises(self, source: Source) -> bool:
        return is_diffusion_gemma(source.config())

    def load(self, source: Source) -> Loaded:
        return load_diffusion_gemma(source)

    def facts(self, source: Source) -> None:
        return None  # from the generation config and canvas of the loaded model


LOADER = DiffusionGemmaLoader()


def precheck(checkpoint: str, length: int, sampler: str | None, block_size: int | None, temperature: float = 1.0) -> str | None:
    """For a local DiffusionGemma folder, what is wrong with these options as ``key: message``,
    read from its config.json before the weights load (None: nothing, or not such a folder)."""
    path = Path(checkpoint) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # not a local folder, or not readable: the loader says so
    if not is_diffusion_gemma(cfg):
        return None
    if sampler not in (None, BLOCK):
        return f"sampler: '{sampler}' does not fit the DiffusionGemma model '{checkpoint}' (uniform noise, no mask token); allowed: {BLOCK}"
    return _block_options(length, block_size, temperature, cfg.get("canvas_length") or 256, where=f" in {path}")
