"""The diffusers hook session: diffaccel's hooks inside any diffusers pipeline, as a building block.

Public API (``__all__``), for adapters of diffusers pipelines (the shipped ``unet``, ``dit`` and
``unet2d`` adapters use it, and so may a third party's)::

    from diffaccel.adapters.diffusers.hooks import DenoiserBlock, DenoiserSession, attach, call_pipeline, detach

    class MyBlock(DenoiserBlock):            # one block of the denoiser, as a diffaccel.Layer
        family = "MyNet"                      # named in its error lines

    class MySession(DenoiserSession):         # the accelerator attached to one pipeline
        adapter = "mynet"                     # the adapter's name (run.adapter, reports)
        capabilities = frozenset({...})       # what the blocks offer (diffaccel.contract.capabilities)
        denoiser_attr = "unet"                # the pipeline attribute holding the denoiser

        def build_layers(self, accelerator):  # the blocks, in forward order
            self.layers = [MyBlock(name, i, kind, module, self, depth) for ...]

    attach(pipe, accelerator, MySession)      # the adapter's attach(pipe, accelerator)
    detach(pipe)                              # the adapter's detach(pipe): bitwise the bare pipeline again
    images, run = call_pipeline(pipe, info={"seeds": seeds}, **call_kwargs)  # the adapter's run

What a session does. ``attach`` replaces, as instance attributes (the originals are kept and put
back by ``detach``; nothing of the pipeline's code changes):

* the denoiser's ``forward``: one call is one denoiser evaluation. The first call after
  ``scheduler.step`` (or with a new timestep) starts a step (``run.step``, ``run.timestep``,
  ``run.positions_per_layer`` = the call's rows) and goes through the core's
  ``RunSequence.denoise`` (``pre_step``; ``StepPlan.reuse_step`` serves the branch's last output
  without running the denoiser; the non-finite check and the quality guard; ``denoiser_output``).
  The first call of a pipeline call begins the run (``run_start``; ``run.info`` filled, below).
* each block's ``forward``: a block call becomes ``accelerator.layer_output(run, block, hidden)``
  (``hidden``: the block's arguments by name), and ``block.compute(hidden)`` runs the original
  ``forward``. A block the step's plan skips (``StepPlan.skip``) is served from what it kept
  (``DenoiserBlock.served``) and its code does not run; so is a block a strategy answers.
* ``scheduler.set_timesteps``: a pipeline call begins (the previous run, if left open, ends);
* ``scheduler.step``: the step ends; ``post_step`` gets a ``UNetStepOutput`` (built only when a
  strategy reads steps); at the last timestep ``finalize`` gets a ``UNetFinal`` whose ``latents``
  become the scheduler's result, then ``run_end``.

The hook order is the core's (``diffaccel.adapterkit.RunSequence``); these wrappers call it from
inside the pipeline's own loop, so any pipeline whose loop is "denoiser call(s), then
``scheduler.step``" works unchanged (DDPM, DDIM, Stable Diffusion, PixArt ...).

``run.stop`` set by a strategy (in ``post_step``) ends the run at that step: the run finalises
at once from the scheduler's clean estimate of that step (``pred_original`` where the scheduler
gives one, else its latents), ``run_end`` runs, and the pipeline's remaining steps compute
nothing (the denoiser serves its last output, the scheduler step returns the final latents), so
the pipeline decodes what the run finalised.

Classifier-free guidance: one denoiser call per step is branch ``main`` (both halves batched, or
no guidance); a pipeline calling the denoiser twice per step gets ``uncond`` then ``cond`` (found
at the second call of the first step and remembered for the pipeline's next runs), so strategies
keep a state and a block cache per branch.

``run.info`` of a session's run: ``checkpoint``, ``layers``, ``n_layers``, ``depths``, ``kinds``,
``modules``, ``sample_size``, ``in_channels``, ``guidance``, ``cfg_mode``, ``timesteps``,
``time_conditioned``, and whatever the adapter passes as ``info`` to ``call_pipeline`` (seeds,
prompts). Counters are the core's: each computed block adds 1 to ``layers_computed`` and the
call's rows (``run.positions_per_layer``, which the session sets) to ``positions_computed``;
skipped blocks and reused steps are counted too. The session counts nothing itself.

A pipeline has at most one session, whichever adapter attached it (``session_of``). Outside a
pipeline call (no run), the wrapped blocks and the denoiser run untouched.

Modules: ``outputs`` (what strategies get), ``blocks`` (a block as a layer, a denoiser call as the
core's step model), ``session`` (``DenoiserSession``), ``attach`` (one session per pipeline).
"""

from .attach import _HINTS, _SESSIONS, attach, call_pipeline, detach, session_of
from .blocks import DenoiserBlock, _DenoiserCall, _Patch  # noqa: F401 - _DenoiserCall, _Patch: the adapters' own
from .outputs import UNetFinal, UNetStepOutput, _scalar, _solver_clean_estimate  # noqa: F401
from .session import DenoiserSession

__all__ = ["DenoiserBlock", "DenoiserSession", "UNetFinal", "UNetStepOutput", "attach", "call_pipeline", "detach",
           "session_of"]
