"""Resolve a ``checkpoint`` into a ``TextDiffusionPipeline``.

* a shipped model name: ``wordnet-masked`` (alias ``default``) or ``wordnet-continuous``;
* a local folder saved by ``TextDiffusionLM.save`` (config.json with ``kind``, model.safetensors,
  tokenizer.json);
* a local folder or hub id of a transformers BERT-family masked LM, loaded with
  ``AutoModelForMaskedLM.from_pretrained``. Offline, a hub id that is not cached is one clear
  ``ModelLoadError``;
* a local folder or hub id whose config.json says ``model_type = "diffusion_gemma"``:
  transformers' ``DiffusionGemmaForBlockDiffusion``, driven by ``diffusion_gemma.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

from diffaccel.errors import ModelLoadError

from .denoisers import BertDenoiser, ReferenceDenoiser
from .model import TextDiffusionLM
from .tokenizer import TextTokenizer

ASSETS = Path(__file__).parent / "assets"
SHIPPED = {"wordnet-masked": "wordnet-masked", "default": "wordnet-masked", "wordnet-continuous": "wordnet-continuous"}


def shipped_path(name: str) -> Path:
    return ASSETS / SHIPPED[name]


def load_pipeline(checkpoint: str):
    from .pipeline import TextDiffusionPipeline

    if checkpoint in SHIPPED:
        path = shipped_path(checkpoint)
        if not (path / "model.safetensors").is_file():
            raise ModelLoadError(f"shipped model '{checkpoint}' is missing at {path}; reinstall diffaccel or retrain it (see README)")
        return TextDiffusionPipeline(ReferenceDenoiser(TextDiffusionLM.load(path)), TextTokenizer.from_file(path / "tokenizer.json"), name=checkpoint)
    from .diffusion_gemma import is_diffusion_gemma, load_diffusion_gemma

    path = Path(checkpoint)
    if path.is_dir() and (path / "config.json").is_file():
        try:
            cfg = json.loads((path / "config.json").read_text())
        except ValueError as exc:
            raise ModelLoadError(f"{path / 'config.json'}: not valid JSON ({exc})") from None
        if is_diffusion_gemma(cfg):
            return load_diffusion_gemma(checkpoint, local=True)
        if "kind" in cfg and (path / "model.safetensors").is_file():
            if not (path / "tokenizer.json").is_file():
                raise ModelLoadError(f"{path}: no tokenizer.json beside the model")
            return TextDiffusionPipeline(ReferenceDenoiser(TextDiffusionLM.load(path)), TextTokenizer.from_file(path / "tokenizer.json"), name=path.name)
    elif path.exists() or checkpoint.startswith((".", "/", "~")):
        raise ModelLoadError(f"{checkpoint}: not a model folder (no config.json)")
    elif _hub_model_type(checkpoint) == "diffusion_gemma":
        return load_diffusion_gemma(checkpoint, local=False)
    return load_hf_masked_lm(checkpoint)


def _hub_model_type(name: str) -> str | None:
    """The ``model_type`` of a hub id's config.json when it is at hand (cached, or online), else
    None (``load_hf_masked_lm`` then says why it cannot be loaded)."""
    try:
        from huggingface_hub import hf_hub_download

        return json.loads(Path(hf_hub_download(name, "config.json")).read_text()).get("model_type")
    except Exception:  # offline, unknown id, no config: the masked-LM path reports it in one line
        return None


class HFTokenizer:
    """A transformers tokenizer behind the small interface the pipeline uses."""

    def __init__(self, tok):
        self.tok = tok
        self.mask_id = tok.mask_token_id
        self.vocab_size = len(tok)
        self.special_ids = set(tok.all_special_ids)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)


def load_hf_masked_lm(name_or_path: str):
    from .pipeline import TextDiffusionPipeline

    try:
        from transformers import AutoModelForMaskedLM, AutoTokenizer

        model = AutoModelForMaskedLM.from_pretrained(name_or_path)
        tok = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(
            f"checkpoint '{name_or_path}': not a shipped model ({', '.join(SHIPPED)}), not a local model folder, "
            f"and transformers could not load it ({first})"
        ) from None
    if tok.mask_token_id is None:
        raise ModelLoadError(f"checkpoint '{name_or_path}': its tokenizer has no mask token; a masked LM is needed")
    try:
        den = BertDenoiser(model, tok.mask_token_id, set(tok.all_special_ids))
    except TypeError as exc:
        raise ModelLoadError(f"checkpoint '{name_or_path}': {exc}") from None
    return TextDiffusionPipeline(den, HFTokenizer(tok), name=Path(name_or_path).name)
