"""The hook machinery both diffusers adapters (``unet``, ``dit``) install in a pipeline.

A ``DenoiserSession`` holds one accelerator attached to one pipeline and the state of its current
run. It wraps, as instance attributes (the originals are kept and put back by ``detach``), the
denoiser's ``forward`` (one call = one denoiser evaluation, the step and guidance-branch
bookkeeping), each block's ``forward`` (``accelerator.layer_output``, or the block served from its
cache when the step's plan skips it: its code does not run), ``scheduler.set_timesteps`` (a run
begins) and ``scheduler.step`` (``post_step``, and ``finalize`` at the last timestep). What differs
between adapters is small and lives in their subclasses: which module is the denoiser, which
blocks there are (``_build_layers``), and what a block keeps and serves (``DenoiserBlock``
subclasses: the UNet block's output, the transformer block's residual). The full description of
the hooks is in ``diffaccel.adapters.unet.hooks``. The order of the hooks is the core's
(``diffaccel.sequence.RunSequence``); these wrappers call it from inside the pipeline's own loop.

``run.stop`` set by a strategy (in ``post_step``) ends the run at that step: the run finalises
at once from the scheduler's clean estimate of that step (``pred_original`` where the scheduler
gives one, else its latents), ``run_end`` runs, and the pipeline's remaining steps compute
nothing (the denoiser serves its last output, the scheduler step returns the final latents), so
the pipeline decodes what the run finalised.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any

import attrs
import torch

from diffaccel.sequence import RunSequence, StepModel
from diffaccel.state import Layer, RunState

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@attrs.define
class UNetStepOutput:
    """What ``diffaccel_post_step`` receives from the UNet and DiT adapters after each scheduler step."""

    step: int
    """Index of the step (``run.step``)."""
    timestep: Any
    """The scheduler's timestep of the step."""
    latents: torch.Tensor
    """Latents after the step (B, C, H, W): the scheduler's ``prev_sample``."""
    noise_pred: torch.Tensor
    """The model output the scheduler used (after guidance), (B, C, H, W)."""
    pred_original: torch.Tensor | None = None
    """The scheduler's estimate of the clean latents, when it gives one (DDIM, DDPM)."""


@attrs.define
class UNetFinal:
    """What ``diffaccel_finalize`` receives after the last step: set ``latents`` to choose them."""

    draft: torch.Tensor
    """The scheduler's final latents."""
    latents: torch.Tensor | None = None
    """The latents the pipeline decodes; None until a strategy or the default sets them."""

    def apply_default(self) -> None:
        if self.latents is None:
            self.latents = self.draft


def _scalar(t: Any) -> float | None:
    if t is None:
        return None
    if isinstance(t, torch.Tensor):
        return float(t.reshape(-1)[0]) if t.numel() else None
    return float(t)


class _Patch:
    """An instance attribute ``obj.<attr>`` replaced by ``new``; ``restore`` puts back what was there."""

    def __init__(self, obj: Any, attr: str, make):
        self.obj, self.attr = obj, attr
        self.prev = obj.__dict__.get(attr, None)  # an instance-level value (another wrapper), or None
        self.original = getattr(obj, attr)  # what a call would have run
        self.new = make(self.original)
        setattr(obj, attr, self.new)

    def restore(self) -> None:
        d = self.obj.__dict__
        if self.prev is None:
            if d.get(self.attr) is self.new:
                del d[self.attr]
        else:
            d[self.attr] = self.prev


class DenoiserBlock(Layer):
    """One block of a diffusers denoiser, as a ``Layer`` (the adapters' subclasses say which
    blocks and what they keep). ``compute(hidden)`` runs the block's original ``forward`` on
    ``hidden`` (the dict of its arguments by name; positional arguments beyond the named ones, if
    any, under ``"*args"``); ``cached_output`` serves it from the current branch's cache."""

    supports_positions = False
    family = "denoiser"
    """Named in the error line of ``compute(positions=...)``."""

    def __init__(self, name: str, index: int, kind: str, module: torch.nn.Module, session: "DenoiserSession",
                 depth: int = 0):
        super().__init__(name, index, kind)
        self.depth = depth
        self.module = module
        self.block_type = type(module).__name__
        self.session = session
        self.forward = None  # the original forward, set by attach
        self.arg_names: tuple[str, ...] = ()

    @property
    def kept(self) -> Any:
        """What the block kept (``to_cache``) at its last computation in the current guidance
        branch, or None."""
        run = self.session.run
        return None if run is None else self.session.block_cache.get((run.branch, self.name))

    @property
    def cached_output(self) -> Any:
        return self.kept

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        if not args:
            return kwargs
        names = self.arg_names
        hidden = dict(zip(names, args))
        if len(args) > len(names):
            hidden["*args"] = args[len(names):]
        hidden.update(kwargs)
        return hidden

    def call(self, hidden: dict[str, Any]) -> Any:
        if "*args" not in hidden:
            return self.forward(**hidden)
        rest = dict(hidden)
        extra = rest.pop("*args")
        return self.forward(*[rest.pop(n) for n in self.arg_names], *extra, **rest)

    def to_cache(self, hidden: dict[str, Any], out: Any) -> Any:
        """What the block keeps of a computed call (here its output)."""
        return out

    def served(self, cached: Any, args: tuple, kwargs: dict) -> Any:
        """What a skipped block returns, from what it kept (here the kept output itself)."""
        return cached

    def hooked(self, accel: Any, run: RunState, args: tuple, kwargs: dict) -> Any:
        """A block call while a run is on and the plan does not skip the block."""
        return accel.layer_output(run, self, self.bind(args, kwargs))

    def compute(self, hidden: dict[str, Any], positions: Any = None) -> Any:
        if positions is not None:
            raise ValueError(f"{self.name}: {self.family} blocks compute every row; positions apply to text layers")
        s = self.session
        out = self.call(hidden)
        run = s.run
        if run is not None and s.keep:  # counted by the core (diffaccel.sequence)
            s.block_cache[(run.branch, self.name)] = self.to_cache(hidden, out)
        return out


class _DenoiserCall(StepModel):
    """One call of the diffusers denoiser, for ``RunSequence.denoise``: its raw output is what the
    denoiser returns (a tuple or an output object), the noise prediction its tensor."""

    def __init__(self, session: "DenoiserSession", original):
        self.session, self.original = session, original
        self.args: tuple = ()
        self.kwargs: dict = {}
        self.branch = "main"

    def compute(self) -> Any:
        raw = self.session.last_raw = self.original(*self.args, **self.kwargs)
        if self.session.keep:
            self.session.denoiser_cache[self.branch] = raw
        return raw

    def reuse(self) -> Any | None:
        return self.session.denoiser_cache.get(self.branch)

    def tensor(self, raw: Any) -> torch.Tensor:
        return raw[0] if isinstance(raw, tuple) else raw.sample

    def result(self, raw: Any, output: Any) -> Any:
        if output is self.tensor(raw):
            return raw
        if isinstance(raw, tuple):
            return (output, *raw[1:])
        return type(raw)(sample=output)


class DenoiserSession:
    """The accelerator attached to one pipeline, and the state of its current run. Subclasses
    set ``adapter`` and ``capabilities`` and build the layers (``_build_layers``)."""

    adapter = "?"
    capabilities: frozenset = frozenset()
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
        self._build_layers(accelerator)
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

    def _build_layers(self, accelerator: Any) -> None:
        """Fill ``self.layers`` (the blocks, in forward order) and ``self.modules``."""
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
                self.run.info.cfg_mode = "unbatched"
                self.run.batch_size = rows
                self._rename_branch("main", "uncond")
            return "cond"
        return f"call{k}"

    # -- the wrappers ----------------------------------------------------------------------------
    def denoiser_forward(self, original):
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
                    run.info.cfg_mode = "none"
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
        def set_timesteps(*args, **kwargs):
            if self.run is not None:  # the previous call never reached its last step
                self.end_run()
            self.stopped = self.last_raw = None
            self._reset_run_state()
            return original(*args, **kwargs)

        return set_timesteps

    def scheduler_step(self, original):
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
        if self.run is not None:
            self.end_run()
        self.stopped = self.last_raw = None
        for p in reversed(self._patches):
            p.restore()
        self._patches = []


_SESSIONS: "weakref.WeakKeyDictionary[Any, DenoiserSession]" = weakref.WeakKeyDictionary()
"""One table for every diffusers adapter: a pipeline has one diffaccel session, whichever adapter."""
_HINTS: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()
"""Per pipeline: whether its guidance was unbatched (two denoiser calls per step) last time."""


def attach(pipe: Any, accelerator: Any, session_class: type[DenoiserSession]) -> DenoiserSession:
    detach(pipe)
    session = session_class(pipe, accelerator)
    session.unbatched_hint = _HINTS.get(pipe, False)
    session.install()
    _SESSIONS[pipe] = session
    return session


def detach(pipe: Any) -> None:
    session = _SESSIONS.pop(pipe, None)
    if session is not None:
        session.uninstall()
        _HINTS[pipe] = session.unbatched_hint


def session_of(pipe: Any) -> DenoiserSession | None:
    return _SESSIONS.get(pipe)
