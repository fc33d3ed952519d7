"""Adapters: ``diffusers`` (the unet, dit and unet2d adapters and what they share), ``text``, and the
checkpoint checks every adapter shares (``checkpoints``).

In 0.2 the diffusers adapters and what they share moved into ``diffaccel.adapters.diffusers`` and the
text adapter's flat modules into ``sampling``, ``loading``, ``families``, ``training`` and ``evaluation``.
``MOVED`` (in this file: the contract "the core imports no adapter" counts this package module among
the core's modules, so it imports no submodule of its own) is registered with the core's finder
(``diffaccel.adapterkit.register_moved``): an old path gives the very module object of its new path, with a
DeprecationWarning naming it, until 0.3. ``diffaccel.adapters.text.loading`` became a package: its old
names resolve through ``diffaccel.adapterkit.old_names``; ``diffaccel.adapters.text.protocol`` stays the
public path of the text-model protocol. scripts/dtype_matrix.py was ``diffaccel.adapters.dtype_matrix``.
The recipes and training commands (``text.training``, ``text.tasks.train``, the digits trainers) left the
runtime for diffaccel-models (``diffaccel_models``, models/) in 0.2: their paths resolve there, until 0.3.
"""

from diffaccel.adapterkit import register_moved

_A = "diffaccel.adapters."
_T = _A + "text."
_M = "diffaccel_models."  # issue 58: the recipes moved to the models distribution (models/)

MOVED = {
    _A + "diffusers_hooks": _A + "diffusers.hooks",
    _A + "diffusers_peers": _A + "diffusers.peers",
    _A + "diffusers_pipelines": _A + "diffusers.pipelines",
    _A + "diffusers_schedulers": _A + "diffusers.schedulers",
    _A + "digits": _A + "diffusers.digits",
    _A + "dit": _A + "diffusers.dit",
    _A + "dit.adapter": _A + "diffusers.dit.adapter",
    _A + "dit.digits": _M + "dit.digits",
    _A + "dit.hooks": _A + "diffusers.dit.hooks",
    _A + "dit.loading": _A + "diffusers.dit.loading",
    _A + "dit.nets": _A + "diffusers.dit.nets",
    _A + "dit.nets.pooled_pixart": _A + "diffusers.dit.nets.pooled_pixart",
    _A + "dit.options": _A + "diffusers.dit.options",
    _A + "dit.peers": _A + "diffusers.dit.peers",
    _A + "dit.pipeline": _A + "diffusers.dit.pipeline",
    _A + "dit.synthetic": _A + "diffusers.dit.synthetic",
    _A + "guided_pipeline": _A + "diffusers.guided_pipeline",
    _T + "adapt": _M + "text.training.adapt",
    _T + "bert": _T + "families.bert",
    _T + "cond_check": _M + "text.training.cond_check",
    _T + "corpus": _T + "loading.corpus",
    _T + "deberta": _T + "families.deberta",
    _T + "denoisers": _T + "sampling.denoisers",
    _T + "diffusion_gemma": _T + "families.diffusion_gemma.pipeline",
    _T + "diffusion_gemma_build": _T + "families.diffusion_gemma.build",
    _T + "diffusion_gemma_layers": _T + "families.diffusion_gemma.layers",
    _T + "diffusion_gemma_loading": _T + "families.diffusion_gemma.loading",
    _T + "dlm_eval": _M + "text.training.dlm_eval",
    _T + "encoders": _T + "families.encoders",
    _T + "facts": _T + "families.facts",
    _T + "gguf": _T + "loading.gguf",
    _T + "judge": _T + "evaluation.judge",
    _T + "llama": _T + "families.llama",
    _T + "loader": _T + "loading.loader",
    _T + "logits": _T + "sampling.logits",
    _T + "measure": _T + "evaluation.measure",
    _T + "metrics": _T + "evaluation.metrics",
    _T + "model": _T + "sampling.model",
    _T + "modernbert": _T + "families.modernbert",
    _T + "outputs": _T + "sampling.outputs",
    _T + "pipeline": _T + "sampling.pipeline",
    _T + "positions": _T + "sampling.positions",
    _T + "reference": _T + "loading.reference",
    _T + "run_context": _T + "sampling.run_context",
    _T + "smollm2_dlm": _T + "families.smollm2_dlm",
    _T + "synthetic": _T + "families.synthetic",
    _T + "tiny_families": _T + "families.tiny_families",
    _T + "tokenizer": _T + "sampling.tokenizer",
    _T + "train": _M + "text.training.train",
    _A + "unet": _A + "diffusers.unet",
    _A + "unet.adapter": _A + "diffusers.unet.adapter",
    _A + "unet.commands": _M + "unet.commands",
    _A + "unet.digits": _M + "unet.digits",
    _A + "unet.hooks": _A + "diffusers.unet.hooks",
    _A + "unet.loading": _A + "diffusers.unet.loading",
    _A + "unet.metrics": _A + "diffusers.unet.metrics",
    _A + "unet.options": _A + "diffusers.unet.options",
    _A + "unet.pipeline": _A + "diffusers.unet.pipeline",
    _A + "unet.synthetic": _A + "diffusers.unet.synthetic",
    _A + "unet.tail": _A + "diffusers.unet.tail",
    _A + "unet.testing": _A + "diffusers.unet.testing",
    _A + "unet2d": _A + "diffusers.unet2d.adapter",
    _A + "unet2d_solver": _A + "diffusers.unet2d.solver",
    # 0.2's paths of the recipes and training commands, which moved to diffaccel-models (issue 58);
    # they resolve when diffaccel-models is installed (the runtime finds its checkpoints through entry points)
    _T + "commands": _M + "text.commands",
    _T + "task_commands": _M + "text.task_commands",
    _T + "tasks.train": _M + "text.tasks.train",
    _T + "tasks.grow": _M + "text.tasks.grow",
    _T + "training": _M + "text.training",
    _T + "training.adapt": _M + "text.training.adapt",
    _T + "training.commands": _M + "text.training.commands",
    _T + "training.cond_check": _M + "text.training.cond_check",
    _T + "training.curves": _M + "text.training.curves",
    _T + "training.dlm_eval": _M + "text.training.dlm_eval",
    _T + "training.train": _M + "text.training.train",
    _A + "diffusers.unet.commands": _M + "unet.commands",
    _A + "diffusers.unet.digits": _M + "unet.digits",
    _A + "diffusers.dit.commands": _M + "dit.commands",
    _A + "diffusers.dit.digits": _M + "dit.digits",
}
"""Old module path -> new module path, until 0.3."""

register_moved(MOVED)
