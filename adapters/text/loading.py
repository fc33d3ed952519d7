"""Resolve a ``checkpoint`` into a ``TextDiffusionPipeline``.

* a shipped model name: ``wordnet-masked`` (alias ``default``), ``wordnet-continuous`` or
  ``wordnet-masked-cond`` (masked, with condition gating for bert-cond's vector);
* a local folder saved by ``TextDiffusionLM.save`` (config.json with ``kind``, model.safetensors,
  tokenizer.json);
* ``synthetic-llada-small``: a LLaDA-shaped speed model built from a seed (``synthetic.py``);
* a local folder or hub id of a LLaMA/Qwen2-class masked DLM (LLaDA, Dream; ``llama.py``);
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
from .llama import FAMILIES as FAMILY_NAMES
from .llama import is_decoder_config, load_decoder
from .model import TextDiffusionLM
from .tokenizer import TextTokenizer

ASSETS = Path(__file__).parent / "assets"
SHIPPED = {"wordnet-masked": "wordnet-masked", "default": "wordnet-masked", "wordnet-continuous": "wordnet-continuous",
           "wordnet-masked-cond": "wordnet-masked-cond"}
#: speed models built in memory from a seed (adapters/text/synthetic.py)
SYNTHETIC = ("synthetic-llada-small",)


def shipped_path(name: str) -> Path:
    return ASSETS / SHIPPED[name]


def load_pipeline(checkpoint: str):
    from .pipeline import TextDiffusionPipeline

    if checkpoint in SHIPPED:
        path = shipped_path(checkpoint)
        if not (path / "model.safetensors").is_file():
            raise ModelLoadError(f"shipped model '{checkpoint}' is missing at {path}; reinstall diffaccel or retrain it (see README)")
        return TextDiffusionPipeline(ReferenceDenoiser(TextDiffusionLM.load(path)), TextTokenizer.from_file(path / "tokenizer.json"), name=checkpoint)
    if checkpoint in SYNTHETIC:
        from .synthetic import build_synthetic

        return build_synthetic(checkpoint)
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
        if is_decoder_config(cfg):
            return load_decoder(path)
        _refuse_unsupported_decoder(cfg, path / "config.json")
        return load_hf_masked_lm(checkpoint)
    elif path.exists() or checkpoint.startswith((".", "/", "~")):
        raise ModelLoadError(f"{checkpoint}: not a model folder (no config.json)")
    return load_hub(checkpoint)


def _refuse_unsupported_decoder(cfg: dict, where) -> None:
    """A causal-LM architecture other than LLaMA/Qwen2: one line, not the BERT loader's error."""
    archs = cfg.get("architectures") or []
    if any(str(a).endswith("ForCausalLM") for a in archs):
        raise ModelLoadError(f"{where}: key 'model_type' is {cfg.get('model_type')!r}; supported decoders: "
                             f"{', '.join(sorted(set(FAMILY_NAMES)))} (and BERT-family masked LMs)")


def load_hub(name: str):
    """A hub id: its config.json decides between DiffusionGemma, the decoder loader and the
    BERT-family one. Offline (HF_HUB_OFFLINE=1) and not cached: one ``ModelLoadError`` naming
    the checkpoint."""
    try:
        from huggingface_hub import hf_hub_download

        cfg = json.loads(Path(hf_hub_download(name, "config.json")).read_text())
    except Exception as exc:  # offline, unknown repo, invalid id: all end the same way
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(
            f"checkpoint '{name}': not a shipped model ({', '.join([*SHIPPED, *SYNTHETIC])}), not a local model folder, "
            f"and its config.json could not be fetched ({first})"
        ) from None
    from .diffusion_gemma import is_diffusion_gemma, load_diffusion_gemma

    if is_diffusion_gemma(cfg):
        return load_diffusion_gemma(name, local=False)
    if not is_decoder_config(cfg):
        _refuse_unsupported_decoder(cfg, f"{name}: config.json")
        return load_hf_masked_lm(name)
    from huggingface_hub import snapshot_download

    folder = snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"])
    return load_decoder(Path(folder), name=name.split("/")[-1])


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
