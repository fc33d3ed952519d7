"""Resolve a ``checkpoint`` into a ``TextDiffusionPipeline``.

* a shipped model name: ``wordnet-masked`` (alias ``default``), ``wordnet-continuous`` or
  ``wordnet-masked-cond`` (masked, with condition gating for bert-cond's vector);
* a local folder saved by ``TextDiffusionLM.save`` (config.json with ``kind``, model.safetensors,
  tokenizer.json);
* ``synthetic-llada-small``: a LLaDA-shaped speed model built from a seed (``synthetic.py``);
* a local folder or hub id of a LLaMA/Qwen2-class masked DLM (LLaDA, Dream; ``llama.py``);
* a local folder holding a low-rank delta on a LLaMA base (``smollm2_dlm.py``: SmolLM2-135M
  adapted into a masked DLM);
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

from ..checkpoints import (check_finite, check_loading_info, check_module_finite, check_vocab, folder_weights, match_state,
                           precheck_folder, quiet_loading, read_tensors)

from .denoisers import BertDenoiser, ReferenceDenoiser
from .llama import FAMILIES as FAMILY_NAMES
from .llama import is_decoder_config, load_decoder
from .model import TextDiffusionLM
from .smollm2_dlm import is_delta_config, load_dlm
from .tokenizer import TextTokenizer

ASSETS = Path(__file__).parent / "assets"
SHIPPED = {"wordnet-masked": "wordnet-masked", "default": "wordnet-masked", "wordnet-continuous": "wordnet-continuous",
           "wordnet-masked-cond": "wordnet-masked-cond"}
#: speed models built in memory from a seed (adapters/text/synthetic.py)
SYNTHETIC = ("synthetic-llada-small",)


def shipped_path(name: str) -> Path:
    return ASSETS / SHIPPED[name]


def load_pipeline(checkpoint: str, allow_pickle: bool = False):
    """``allow_pickle``: read a pickled weights file (``[model] allow_pickle``), through
    ``torch.load(weights_only=True)`` only (``diffaccel.adapters.checkpoints``)."""
    if checkpoint in SHIPPED:
        path = shipped_path(checkpoint)
        if not (path / "model.safetensors").is_file():
            raise ModelLoadError(f"shipped model '{checkpoint}' is missing at {path}; reinstall diffaccel or retrain it (see README)")
        return load_reference(path, name=checkpoint)
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
            return load_diffusion_gemma(checkpoint, local=True, allow_pickle=allow_pickle)
        if is_delta_config(cfg):  # a low-rank delta on a LLaMA base (smollm2-dlm)
            return load_dlm(path)
        if "kind" in cfg:  # diffaccel's own reference model (TextDiffusionLM.save)
            return load_reference(path, name=path.name, allow_pickle=allow_pickle)
        if is_decoder_config(cfg):
            return load_decoder(path, allow_pickle=allow_pickle)
        _refuse_unsupported_decoder(cfg, path / "config.json")
        return load_hf_masked_lm(checkpoint, allow_pickle=allow_pickle)
    elif path.exists() or checkpoint.startswith((".", "/", "~")):
        raise ModelLoadError(f"{checkpoint}: not a model folder (no config.json)")
    return load_hub(checkpoint, allow_pickle)


def _refuse_unsupported_decoder(cfg: dict, where) -> None:
    """A causal-LM architecture other than LLaMA/Qwen2: one line, not the BERT loader's error."""
    archs = cfg.get("architectures") or []
    if any(str(a).endswith("ForCausalLM") for a in archs):
        raise ModelLoadError(f"{where}: key 'model_type' is {cfg.get('model_type')!r}; supported decoders: "
                             f"{', '.join(sorted(set(FAMILY_NAMES)))} (and BERT-family masked LMs)")


def load_hub(name: str, allow_pickle: bool = False):
    """A hub id: its config.json decides between DiffusionGemma, the decoder loader and the
    BERT-family one. Offline (HF_HUB_OFFLINE=1) and not cached: one ``ModelLoadError`` naming
    the checkpoint."""
    cfg = load_hub_config(name)
    from .diffusion_gemma import is_diffusion_gemma, load_diffusion_gemma

    if is_diffusion_gemma(cfg):
        return load_diffusion_gemma(name, local=False, allow_pickle=allow_pickle)
    if not is_decoder_config(cfg):
        _refuse_unsupported_decoder(cfg, f"{name}: config.json")
        return load_hf_masked_lm(name, allow_pickle=allow_pickle)
    from huggingface_hub import snapshot_download

    pickles = ["*.bin", "*.pt"] if allow_pickle else []  # read with torch.load(weights_only=True) only
    folder = snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", *pickles])
    return load_decoder(Path(folder), name=name.split("/")[-1], allow_pickle=allow_pickle)


def load_hub_config(name: str) -> dict:
    """A hub id's config.json (cached, or fetched when online); one ``ModelLoadError`` otherwise."""
    try:
        from huggingface_hub import hf_hub_download

        return json.loads(Path(hf_hub_download(name, "config.json")).read_text())
    except Exception as exc:  # offline, unknown repo, invalid id: all end the same way
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(
            f"checkpoint '{name}': not a shipped model ({', '.join([*SHIPPED, *SYNTHETIC])}), not a local model folder, "
            f"and its config.json could not be fetched ({first})"
        ) from None


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


def load_reference(path: Path, name: str, allow_pickle: bool = False):
    """diffaccel's own reference model: weights checked against its config (names, shapes,
    finiteness) and its tokenizer against the embedding table, each one line."""
    from .model import TextDiffusionConfig
    from .pipeline import TextDiffusionPipeline

    weights = path / "model.safetensors"
    if not weights.is_file():
        _, pickles = folder_weights(path)
        if not pickles:
            raise ModelLoadError(f"{path}: no model.safetensors beside its config.json")
        weights = pickles[0]
    if not (path / "tokenizer.json").is_file():
        raise ModelLoadError(f"{path}: no tokenizer.json beside the model")
    try:
        conf = TextDiffusionConfig.from_json((path / "config.json").read_text())
    except (ValueError, TypeError, KeyError) as exc:
        raise ModelLoadError(f"{path / 'config.json'}: not a valid reference-model config ({str(exc).splitlines()[0][:200]})") from None
    try:
        tok = TextTokenizer.from_file(path / "tokenizer.json")
    except Exception as exc:  # tokenizers raises its own Exception type for a damaged file
        raise ModelLoadError(f"{path / 'tokenizer.json'}: not a readable tokenizer ({str(exc).splitlines()[0][:200]})") from None
    check_vocab(tok.vocab_size, conf.vocab_size, path / "tokenizer.json")
    state = read_tensors(weights, allow_pickle)
    model = TextDiffusionLM(conf)
    match_state({k: tuple(v.shape) for k, v in model.state_dict().items()}, {k: tuple(v.shape) for k, v in state.items()}, weights)
    check_finite(state.items(), weights)
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return TextDiffusionPipeline(ReferenceDenoiser(model.eval()), tok, name=name)


def load_hf_masked_lm(name_or_path: str, allow_pickle: bool = False):
    from .pipeline import TextDiffusionPipeline

    local = Path(name_or_path).is_dir()
    safe = precheck_folder(Path(name_or_path), allow_pickle) if local else True
    try:
        from transformers import AutoModelForMaskedLM, AutoTokenizer

        # hub ids: safetensors only unless allowed; transformers reads a pickle with weights_only=True
        with quiet_loading():
            model, info = AutoModelForMaskedLM.from_pretrained(
                name_or_path, use_safetensors=True if safe and not allow_pickle else None,
                output_loading_info=True, ignore_mismatched_sizes=True)
            tok = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(
            f"checkpoint '{name_or_path}': not a shipped model ({', '.join(SHIPPED)}), not a local model folder, "
            f"and transformers could not load it ({first})"
        ) from None
    if tok.mask_token_id is None:
        raise ModelLoadError(f"checkpoint '{name_or_path}': its tokenizer has no mask token; a masked LM is needed")
    where = name_or_path if not local else Path(name_or_path)
    check_loading_info(info, where)
    check_module_finite(model, where)
    check_vocab(tok.vocab_size, model.get_input_embeddings().num_embeddings, where, exact=False, with_added=len(tok))
    try:
        den = BertDenoiser(model, tok.mask_token_id, set(tok.all_special_ids))
    except TypeError as exc:
        raise ModelLoadError(f"checkpoint '{name_or_path}': {exc}") from None
    return TextDiffusionPipeline(den, HFTokenizer(tok), name=Path(name_or_path).name)
