"""Load a text checkpoint: one dispatch over the model kinds' loaders.

``load_pipeline(checkpoint)`` wraps the checkpoint string in a ``Source`` (its local folder, its
config.json read once: from the folder, or for a hub id from the hub's cache or the hub), asks
each loader of ``LOADERS`` in turn whether it recognises it, lets the first that does load it,
checks what it loaded, and builds the pipeline from it. ``model_facts(checkpoint)`` asks the same
loader for the model's facts without its weights (``diffaccel check``). A checkpoint goes through
each module once: the loaders build no pipeline and call no other loader.

The loaders, in the order they are asked:

* ``reference.SHIPPED_LOADER``: a shipped model name (``wordnet-masked``, alias ``default``,
  ``wordnet-continuous``, ``wordnet-masked-cond``);
* ``synthetic.LOADER``: ``synthetic-llada-small``, a LLaDA-shaped speed model built from a seed;
* ``diffusion_gemma_loading.LOADER``: config.json ``model_type = "diffusion_gemma"`` (transformers'
  ``DiffusionGemmaForBlockDiffusion``, run by ``DiffusionGemmaPipeline``);
* ``reference.LOADER``: a local folder saved by ``TextDiffusionLM.save`` (config.json with ``kind``);
* ``smollm2_dlm.LOADER``: a folder holding a low-rank delta on a LLaMA base (config.json
  ``"diffaccel_delta": "smollm2-dlm"``: SmolLM2-135M adapted into a masked DLM);
* ``llama.LOADER``: a LLaMA/Qwen2-class masked DLM (LLaDA, Dream), a local folder or a hub id;
* ``bert.LOADER``: any other config.json, read as a transformers BERT-family masked LM (it refuses
  a causal LM it cannot run in one line first); the catch-all, so it stays last.

Checks every kind shares are written once, in ``diffaccel.adapters.checkpoints``: safetensors only
(a pickle only with ``allow_pickle``, through ``torch.load(weights_only=True)``), whole files,
tensor names and shapes against the config, the tokenizer against the embedding table (each
loader, before it reads the weights where it can), and finite weights (here, once, on every
loaded model). Offline, a hub id that is not cached is one ``ModelLoadError``.

**Adding a model kind** is one loader, in its own module, added to ``LOADERS`` (before ``bert``'s
catch-all) and nothing else: the adapter, ``diffaccel check`` and the bench reach it through this
dispatch. A loader has

* ``names``: the checkpoint names it answers to without a folder (may be empty);
* ``recognises(source) -> bool``: from ``source.checkpoint``, ``source.path`` and
  ``source.config()`` (which raises the one-line error of a bad path or an unreachable hub id);
* ``load(source) -> Loaded``: the denoiser (or model), tokenizer and name, the module whose
  weights the dispatch checks, and the pipeline class when it is not ``TextDiffusionPipeline``;
* ``facts(source) -> ModelFacts | None``: the model's facts from its config, no weights (None:
  the facts need the model, which ``diffaccel check`` then loads).

For example a LoRA delta on a LLaMA-class base is a loader whose ``recognises`` matches its name
or config and whose ``load`` builds the base with ``llama.py``'s functions (``hf_config``,
``build_model``, ``load_weights``), applies the delta and returns ``Loaded(LlamaDenoiser(...), ...)``.
"""

from __future__ import annotations

from diffaccel.contract.errors import ModelLoadError

from ..checkpoints import check_module_finite
from . import bert, diffusion_gemma_loading, llama, reference, smollm2_dlm, synthetic
from .loader import Loaded, Loader, ModelFacts, Source
from .pipeline import TextDiffusionPipeline

#: asked in this order; the first that recognises a checkpoint loads it (bert's catch-all last)
LOADERS: list[Loader] = [reference.SHIPPED_LOADER, synthetic.LOADER, diffusion_gemma_loading.LOADER, reference.LOADER,
                         smollm2_dlm.LOADER, llama.LOADER, bert.LOADER]


def source(checkpoint: str, allow_pickle: bool = False) -> Source:
    return Source(str(checkpoint), allow_pickle, known=tuple(n for loader in LOADERS for n in loader.names))


def loader_of(src: Source) -> Loader:
    for loader in LOADERS:
        if loader.recognises(src):
            return loader
    raise ModelLoadError(f"checkpoint '{src.checkpoint}': no text loader recognises it")  # unreachable with bert last


def load_pipeline(checkpoint: str, allow_pickle: bool = False):
    """The pipeline of ``checkpoint`` (see the module docstring). ``allow_pickle``: read a pickled
    weights file (``[model] allow_pickle``), through ``torch.load(weights_only=True)`` only."""
    src = source(checkpoint, allow_pickle)
    loaded: Loaded = loader_of(src).load(src)
    check_module_finite(loaded.weights, loaded.where)
    return (loaded.pipeline or TextDiffusionPipeline)(loaded.denoiser, loaded.tokenizer, name=loaded.name)


def model_facts(checkpoint: str, allow_pickle: bool = False) -> ModelFacts | None:
    """The facts of ``checkpoint``'s model from its config files, without its weights; None where
    they need the model (DiffusionGemma). Refuses what ``load_pipeline`` would refuse before
    reading weights, with the same line."""
    src = source(checkpoint, allow_pickle)
    return loader_of(src).facts(src)


__all__ = ["LOADERS", "Loaded", "Loader", "ModelFacts", "Source", "load_pipeline", "model_facts"]
