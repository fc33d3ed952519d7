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
* ``modernbert.KIND``: config.json ``model_type = "modernbert"`` (the guide's worked example of a
  text model kind, written against the public protocol only);
* ``bert.LOADER``: any other config.json, read as a transformers BERT-family masked LM (it refuses
  a causal LM it cannot run in one line first); the catch-all, so it stays last.

Checks every kind shares are written once, in ``diffaccel.adapters.checkpoints``: safetensors only
(a pickle only with ``allow_pickle``, through ``torch.load(weights_only=True)``), whole files,
tensor names and shapes against the config, the tokenizer against the embedding table (each
loader, before it reads the weights where it can), and finite weights (here, once, on every
loaded model). Offline, a hub id that is not cached is one ``ModelLoadError``.

**Adding a model kind** from outside the project is one loader in a distribution of its own,
registered as an entry point of the ``diffaccel.text_models`` group
(``mykind = "my_package:LOADER"``): no edit of diffaccel, no subclass of ``TextAdapter``. The
installed kinds are asked after the shipped loaders above and before ``bert``'s catch-all (so a
kind may take a family the catch-all refuses, such as DeBERTa), in the order of their names;
``DIFFACCEL_BLOCK_PLUGINS`` / ``DIFFACCEL_PLUGINS`` block them as they block plugins. A config
then names it with ``adapter = "text"`` and its folder as ``checkpoint``, and the run report's
``model`` names the kind that ran (the entry-point name; for the masked LMs the catch-all runs,
the config's ``model_type``). Inside the project, a kind is one loader added to ``LOADERS``
(before the catch-all). A loader has

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

import importlib.metadata as md
from typing import Any

from diffaccel.contract.errors import ModelLoadError, PluginError

from ...checkpoints import check_module_finite
from . import bert, llama, modernbert, smollm2_dlm, synthetic
from .diffusion_gemma import loading as diffusion_gemma_loading
from ..loading import reference
from .facts import check_options
from ..loading.loader import KINDS_GROUP, Loaded, Loader, ModelFacts, Source
from ..sampling.pipeline import TextDiffusionPipeline, run_capabilities

#: asked in this order; the first that recognises a checkpoint loads it (bert's catch-all last)
LOADERS: list[Loader] = [reference.SHIPPED_LOADER, synthetic.LOADER, diffusion_gemma_loading.LOADER, reference.LOADER,
                         smollm2_dlm.LOADER, llama.LOADER, modernbert.KIND, bert.LOADER]


_kinds: dict[str, Loader] = {}  # loaded third-party kinds, by entry-point name


def installed_kinds() -> dict[str, Loader]:
    """The third-party model kinds (entry points of ``KINDS_GROUP``) the environment does not
    block, loaded, by name in sorted order. A kind that fails to load is one ``PluginError``
    naming it and its distribution."""
    from diffaccel.adapterkit import env_allows

    found: dict[str, Loader] = {}
    for ep in sorted(md.entry_points(group=KINDS_GROUP), key=lambda e: e.name):
        if ep.name in found or not env_allows(ep.name):
            continue
        if ep.name not in _kinds:
            dist = ep.dist.metadata["name"] if ep.dist else "?"
            try:
                loader = ep.load()
            except Exception as exc:  # a broken third-party kind must not look like our bug
                raise PluginError(f"text model kind '{ep.name}' (distribution {dist}) failed to load: "
                                  f"{type(exc).__name__}: {exc}; block it with DIFFACCEL_BLOCK_PLUGINS={ep.name}") from None
            missing = [m for m in ("names", "recognises", "load", "facts") if not hasattr(loader, m)]
            if missing:
                raise PluginError(f"text model kind '{ep.name}' (distribution {dist}) is not a text model loader: "
                                  f"missing {', '.join(missing)}")
            _kinds[ep.name] = loader
        found[ep.name] = _kinds[ep.name]
    return found


def loaders() -> list[tuple[str | None, Loader]]:
    """(kind name, loader) in the order they are asked: the shipped loaders, the installed kinds,
    the catch-all (``LOADERS[-1]``). Shipped loaders have no kind name (None)."""
    return [*((None, ld) for ld in LOADERS[:-1]), *installed_kinds().items(), (None, LOADERS[-1])]


def source(checkpoint: str, allow_pickle: bool = False) -> Source:
    kinds = loaders()
    return Source(str(checkpoint), allow_pickle, known=tuple(n for _, loader in kinds for n in loader.names),
                  families=tuple(t for _, loader in kinds for t in getattr(loader, "model_types", ())))


def loader_of(src: Source) -> Loader:
    return _kind_of(src)[1]


def _kind_of(src: Source) -> tuple[str | None, Loader]:
    for name, loader in loaders():
        if loader.recognises(src):
            return name, loader
    raise ModelLoadError(f"checkpoint '{src.checkpoint}': no text loader recognises it")  # unreachable with bert last


def load_pipeline(checkpoint: str, allow_pickle: bool = False):
    """The pipeline of ``checkpoint`` (see the module docstring). ``allow_pickle``: read a pickled
    weights file (``[model] allow_pickle``), through ``torch.load(weights_only=True)`` only."""
    src = source(checkpoint, allow_pickle)
    kind, loader = _kind_of(src)
    loaded: Loaded = loader.load(src)
    check_module_finite(loaded.weights, loaded.where)
    pipe = (loaded.pipeline or TextDiffusionPipeline)(loaded.denoiser, loaded.tokenizer, name=loaded.name)
    pipe.model_kind = loaded.model_kind or kind  # named in run reports
    return pipe


def model_facts(checkpoint: str, allow_pickle: bool = False) -> ModelFacts | None:
    """The facts of ``checkpoint``'s model from its config files, without its weights; None where
    they need the model (DiffusionGemma). Refuses what ``load_pipeline`` would refuse before
    reading weights, with the same line."""
    src = source(checkpoint, allow_pickle)
    return loader_of(src).facts(src)


__all__ = ["KINDS_GROUP", "LOADERS", "Loaded", "Loader", "ModelFacts", "Source", "installed_kinds", "load_pipeline", "loaders",
           "model_facts"]


def text_facts(config: Any) -> dict[str, Any] | None:
    """``info`` of the text model ``config`` names, without loading its weights (``TextAdapter.facts``,
    for ``diffaccel check``): the same keys as ``TextAdapter.info(pipe)`` but the tokenizer, from the
    facts the checkpoint's loader reads from its config files. The ``[model]`` options are checked
    against them as ``load`` checks them; where ``load`` would refuse the checkpoint (missing folder,
    hub id offline), this refuses it with the same line. None where the facts need the model
    (DiffusionGemma)."""
    f = model_facts(config.model.checkpoint, config.model.allow_pickle)
    if f is None:
        return None
    check_options(config, f.kind, f.max_len, f.time_conditioned)
    return {"adapter": "text", "vocab_size": f.vocab_size, "n_layers": f.n_layers, "kind": f.kind, "max_len": f.max_len,
            "time_conditioned": f.time_conditioned, "layers": [f"block.{i}" for i in range(f.n_layers)], "cond_dim": f.cond_dim,
            "capabilities": sorted(run_capabilities("masked" if f.kind == "masked" else "hybrid")),
            # the masked sampler's options, which a strategy may need before any weights load
            "block_size": config.options.block_size, "length": config.options.length, "prefix_cache": config.options.prefix_cache}
