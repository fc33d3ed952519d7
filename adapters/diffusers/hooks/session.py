"""``DenoiserSession``: the accelerator attached to one diffusers pipeline, and the state of its
current run; its wrappers of the denoiser, the blocks and the scheduler (the package docstring says
what each does)."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from diffaccel.adapterkit import RunSequence
from diffaccel.contract.state import RunState

from .blocks import DenoiserBlock, _DenoiserCall, _Patch
from .outputs import UNetFinal, UNetStepOutput, _scalar, _solver_clean_estimate

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class DenoiserSession:
    """The accelerator attached to one pipeline, and the state of its current run. Subclasses
    set ``adapter``, ``capabilities`` and ``denoiser_attr`` and build the layers
    (``build_layers``); ``attach(pipe, accelerator, SessionClass)`` makes and installs one.

    Public attributes: ``pipe``, ``accel`` (the ``diffaccel.Accelerator``, or the null one),
    ``denoiser``, ``layers`` and ``modules`` (the hooked blocks and inner modules), ``run`` (the
    ``RunState`` of the pipeline call in progress, else None), ``last_run`` (that of the last
    finished call: its ``report()`` is the output's report), ``next_info`` (facts for the next
    run's ``run.info``; ``call_pipeline`` sets it)."""

    adapter = "?"
    """The adapter's name (``run.adapter``, for reports)."""
    capabilities: frozenset = frozenset()
    """What the blocks and steps offer strategies (``diffaccel.contract.capabilities``): ``run.capabilities``."""
    denoiser_attr = "unet"
    """The pipeline's attribute that holds the denoiser (``unet``, ``transformer``)."""

    def __init__(self, pipe: Any, accelerator: Any):
        self.pipe = pipe
        self.accel = accelerator
        self.keep = bool(getattr(accelerator, "active", False))
        """Keep block and denoiser outputs for StepPlan.skip / reuse_step (only with strategies)."""
        self.denoiser = getattr(pipe, self.denoiser_attr)
        self.layers: list[DenoiserBlock] = []
        self.modules: list[DenoiserBlock] = []
        """Inner modules hooked because a strategy asked for them (``hooked_modules``)."""
        self.build_layers(accelerator)
        self.run: RunState | None = None
        self.seq: RunSequence | None = None
        self.last_run: RunState | None = None
        self.stopped: Any = None
        self.last_raw: Any = None
        """After ``run.stop``: the scheduler output the pipeline's remaining steps get (the final latents)."""
        self.unbatched_hint = False
        self.next_info: dict[str, Any] = {}
        """Facts for the next run's ``run.info`` (the adapter's ``run`` sets seeds and prompts)."""
        self._patches: list[_Patch] = []
        self._reset_run_state()

    def build_layers(self, accelerator: Any) -> None:
        """Fill ``self.layers`` (the ``DenoiserBlock`` s, in forward order, ``index`` 0..n-1) and,
        optionally, ``self.modules`` (inner modules a strategy asked for through
        ``accelerator.hooked_modules(available)``, indexed after the blocks). ``self.denoiser``
        is the denoiser module."""
        raise NotImplementedError

    # -- per-run bookkeeping -----------------------------------------------------------------
    def _reset_run_state(self) -> None:
        self.step_open = False
        self.step_t: float | None = None
        self.calls = 0
        self.step_branches: list[str] = []
        self.unbatched = False
        self.block_cache: dict[tuple[str, str], Any] = {}
        self.denoiser_cache: dict[str, Any] = {}

    def _begin_run(self, rows: int) -> RunState:
        pipe = self.pipe
        cfg = getattr(pipe, "do_classifier_free_guidance", None)
        self._reset_run_state()
        self.unbatched = self.unbatched_hint and cfg is not False
        batch = rows // 2 if cfg and not self.unbatched and rows % 2 == 0 else rows
        timesteps = getattr(pipe.scheduler, "timesteps", None)
        run = RunState(adapter=self.adapter, num_steps=len(timesteps) if timesteps is not None else 0, batch_size=batch,
                       capabilities=self.capabilities)
        dcfg = self.denoiser.config
        run.info.set(
            checkpoint=getattr(self.denoiser.config, "_name_or_path", None) or None, layers=[layer.name for layer in self.layers], n_layers=len(self.layers), time_conditioned=True,
            depths=[layer.depth for layer in self.layers], kinds=[layer.kind for layer in self.layers],
            modules=[m.name for m in self.modules],
            sample_size=dcfg.sample_size, in_channels=dcfg.in_channels, guidance=bool(cfg),
            cfg_mode="unbatched" if self.unbatched else ("batched" if cfg else "none"),
            timesteps=[float(t) for t in timesteps] if timesteps is not None else [],
        )
        run.info.set(**self.next_info)
        self.next_info = {}
        self.run = run
        self.seq = RunSequence(self.accel, run)
        self.seq.start()
        return run

    def end_run(self) -> None:
        """End the run in progress (``run_end``; a pipeline call that raised leaves one open)."""
        run = self.run
        if run is None:
            return
        self.run = None
        self.last_run = run
        self.block_cache = {}
        self.denoiser_cache = {}
        run.branch = "main"
        seq, self.seq = self.seq, None
        seq.end()

    def _rename_branch(self, old: str, new: str) -> None:
        run = self.run
        run.rename_branch(old, new)
        for (branch, block) in list(self.block_cache):
            if branch == old:
                self.block_cache[(new, block)] = self.block_cache.pop((branch, block))
        if old in self.denoiser_cache:
            self.denoiser_cache[new] = self.denoiser_cache.pop(old)
        self.step_branches = [new if b == old else b for b in self.step_branches]

    def _branch_for_call(self, k: int, rows: int) -> str:
        if k == 0:
            return "uncond" if self.unbatched else "main"
        if k == 1:
            if not self.unbatched:  # a second denoiser call in one step: guidance is not batched
                self.unbatched = self.unbatched_hint = True
                self.run.info.images.cfg_mode = "unbatched"
                self.run.batch_size = rows
                self._rename_branch("main", "uncond")
            return "cond"
        return f"call{k}"

    # -- the wrappers (installed by ``install``; an adapter does not call them) ---------------------
    def denoiser_forward(self, original):
        """The wrapper of the denoiser's ``forward`` (``original``): one call, one evaluation."""
        step = _DenoiserCall(self, original)

        def forward(*args, **kwargs):
            if self.stopped is not None and self.last_raw is not None:
                return self.last_raw  # a strategy ended the run: the remaining steps compute nothing
            sample = args[0] if args else kwargs.get("sample", kwargs.get("hidden_states"))  # UNets, transformers
            t = _scalar(args[1] if len(args) > 1 else kwargs.get("timestep"))
            rows = sample.shape[0]
            run = self.run
            if run is None:
                run = self._begin_run(rows)
            if not self.step_open or t != self.step_t:
                if run.step >= 0 and self.unbatched and self.calls == 1:
                    # the hint said unbatched but the last step had one call: no guidance this run
                    self.unbatched = False
                    run.info.images.cfg_mode = "none"
                    run.batch_size = rows
                    self._rename_branch("uncond", "main")
                run.step += 1
                run.timestep = t
                self.step_t = t
                self.step_open = True
                self.calls = 0
                self.step_branches = []
            k = self.calls
            self.calls += 1
            run.branch = branch = self._branch_for_call(k, rows)
            self.step_branches.append(branch)
            run.positions_per_layer = rows
            step.args, step.kwargs, step.branch = args, kwargs, branch
            return self.seq.denoise(step)

        return forward

    def block_forward(self, layer: DenoiserBlock):
        """The wrapper maker of ``layer``'s block ``forward``: through ``layer_output``, or served when skipped."""
        accel = self.accel
        name = layer.name
        served, hooked = layer.served, layer.hooked  # resolved once: the hot path

        def make(original):
            layer.forward = original
            try:
                params = inspect.signature(original).parameters.values()
                layer.arg_names = tuple(p.name for p in params if p.kind in _POSITIONAL)
            except (TypeError, ValueError):  # pragma: no cover - builtins
                layer.arg_names = ()

            def forward(*args, **kwargs):
                run = self.run
                if run is None:  # called outside a pipeline run: untouched
                    return original(*args, **kwargs)
                plan = run.plan
                if plan is not None and name in plan.skip:
                    cached = self.block_cache.get((run.branch, name))
                    if cached is not None:
                        self.seq.skipped(layer)
                        return served(cached, args, kwargs)
                return hooked(accel, run, args, kwargs)

            return forward

        return make

    def scheduler_set_timesteps(self, original):
        """The wrapper of ``scheduler.set_timesteps``: a pipeline call begins."""
        def set_timesteps(*args, **kwargs):
            if self.run is not None:  # the previous call never reached its last step
                self.end_run()
            self.stopped = self.last_raw = None
            self._reset_run_state()
            return original(*args, **kwargs)

        return set_timesteps

    def scheduler_step(self, original):
        """The wrapper of ``scheduler.step``: ``post_step``; at the last timestep (or ``run.stop``) ``finalize``, ``run_end``."""
        def step(model_output, timestep, sample, *args, **kwargs):
            if self.stopped is not None:  # after run.stop: the final latents, whatever the step
                return self.stopped
            out = original(model_output, timestep, sample, *args, **kwargs)
            run = self.run
            if run is None:
                return out
            seq = self.seq
            self.step_open = False
            is_tuple = isinstance(out, tuple)
            prev = out[0] if is_tuple else out.prev_sample
            x0 = (out[1] if len(out) > 1 else None) if is_tuple else getattr(out, "pred_original_sample", None)
            if x0 is None:
                x0 = _solver_clean_estimate(self.pipe.scheduler)
            if seq.watched:
                so = UNetStepOutput(step=run.step, timestep=run.timestep, latents=prev, noise_pred=model_output, pred_original=x0)
                for branch in self.step_branches or ["main"]:
                    run.branch = branch
                    seq.post_step(lambda: so)
            stop = seq.stopped and not self._is_last(timestep)
            if stop or self._is_last(timestep):
                run.branch = "main"
                # stopped early: the clean estimate of this step is the best the run has
                final = seq.finalize(UNetFinal(draft=x0 if stop and x0 is not None else prev))
                if final.latents is not None and final.latents is not prev:
                    if is_tuple:
                        out = (final.latents, *out[1:])
                    else:
                        out.prev_sample = final.latents
                self.end_run()
                if stop:
                    self.stopped = out
            return out

        return step

    def _is_last(self, timestep) -> bool:
        sched = self.pipe.scheduler
        timesteps = getattr(sched, "timesteps", None)
        if timesteps is None or len(timesteps) == 0:
            return False
        idx = getattr(sched, "step_index", None)
        if isinstance(idx, int):  # schedulers that count their own steps (some repeat timesteps)
            return idx >= len(timesteps)
        return _scalar(timestep) == float(timesteps[-1])

    # -- attach / detach ---------------------------------------------------------------------------
    def install(self) -> None:
        """Wrap the blocks, the denoiser and the scheduler (``attach`` calls it)."""
        sched = self.pipe.scheduler
        try:
            for layer in [*self.layers, *self.modules]:
                self._patches.append(_Patch(layer.module, "forward", self.block_forward(layer)))
            self._patches.append(_Patch(self.denoiser, "forward", self.denoiser_forward))
            self._patches.append(_Patch(sched, "set_timesteps", self.scheduler_set_timesteps))
            self._patches.append(_Patch(sched, "step", self.scheduler_step))
        except Exception:
            self.uninstall()
            raise

    def uninstall(self) -> None:
        """End an open run and put every original back (``detach`` calls it)."""
        if self.run is not None:
            self.end_run()
        self.stopped = self.last_raw = None
        for p in reversed(self._patches):
            p.restore()
        self._patches = []
