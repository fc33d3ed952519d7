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

The hook order is the core's (``diffaccel.runtime.sequence.RunSequence``); these wrappers call it from
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
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any

import attrs
import torch

from diffaccel.runtime.sequence import RunSequence, StepModel
from diffaccel.contract.state import Layer, RunState

__all__ = ["DenoiserBlock", "DenoiserSession", "UNetFinal", "UNetStepOutput", "attach", "call_pipeline", "detach",
           "session_of"]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@attrs.define
class UNetStepOutput:
    """What ``diffaccel_post_step`` receives from a session after each scheduler step (the ``unet``,
    ``dit`` and ``unet2d`` adapters)."""

    step: int
    """Index of the step (``run.step``)."""
    timestep: Any
    """The scheduler's timestep of the step."""
    latents: torch.Tensor
    """Latents after the step (B, C, H, W): the scheduler's ``prev_sample``."""
    noise_pred: torch.Tensor
    """The model output the scheduler used (after guidance), (B, C, H, W)."""
    pred_original: torch.Tensor | None = None
    """The scheduler's estimate of the clean latents, when it gives one (DDIM, DDPM, Euler; for
    DPM-Solver++ and UniPC the data prediction of the step, which their ``step`` keeps)."""


@attrs.define
class UNetFinal:
    """What ``diffaccel_finalize`` receives after the last step: set ``latents`` to choose them."""

    draft: torch.Tensor
    """The scheduler's final latents."""
    latents: torch.Tensor | None = None
    """The latents the pipeline decodes; None until a strategy or the default sets them."""

    def apply_default(self) -> None:
        """The adapter's default, after the strategies' ``finalize``: the scheduler's latents
        unless a strategy chose others."""
        if self.latents is None:
            self.latents = self.draft


def _scalar(t: Any) -> float | None:
    if t is None:
        return None
    if isinstance(t, torch.Tensor):
        return float(t.reshape(-1)[0]) if t.numel() else None
    return float(t)


def _solver_clean_estimate(sched: Any) -> torch.Tensor | None:
    """The clean estimate a multistep solver made in its last ``step`` (its ``model_outputs[-1]``,
    the model output converted to a data prediction: DPM-Solver++'s, UniPC's with ``predict_x0``),
    which its ``step`` does not return; None for a solver that keeps noise predictions there."""
    outs, cfg = getattr(sched, "model_outputs", None), getattr(sched, "config", {})
    data = cfg.get("algorithm_type") in ("dpmsolver++", "sde-dpmsolver++") or cfg.get("predict_x0") is True
    return outs[-1] if data and outs and isinstance(outs[-1], torch.Tensor) else None


class _Patch:
    """An instance attribute ``obj.<attr>`` replaced by ``new``; ``restore`` puts back what was there."""

    def __init__(self, obj: Any, attr: str, make):
        self.obj, self.attr = obj, attr
        self.prev = obj.__dict__.get(attr, None)  # an instance-level value (another wrapper), or None
        self.original = getattr(obj, attr)  # what a call would have run
        self.new = make(self.original)
        if getattr(obj, "_compiled_call_impl", None) is not None:
            # a module compiled in place (module.compile()): its compiled call would trace the
            # hooks and the strategies (Python state, per-step guards); they run eagerly, the
            # module's own forward with them (docs/compile.md). Uncompiled modules pay nothing.
            import torch

            self.new = torch.compiler.disable(self.new)
        setattr(obj, attr, self.new)

    def restore(self) -> None:
        d = self.obj.__dict__
        if self.prev is None:
            if d.get(self.attr) is self.new:
                del d[self.attr]
        else:
            d[self.attr] = self.prev


class DenoiserBlock(Layer):
    """One block of a diffusers denoiser, as a ``diffaccel.Layer``: what ``layer_output`` hands
    strategies. ``compute(hidden)`` runs the block's original ``forward`` on ``hidden`` (the dict
    of its arguments by name; positional arguments beyond the named ones, if any, under
    ``"*args"``); ``cached_output`` serves it from the current branch's cache.

    Made by the session's ``build_layers`` as ``DenoiserBlock(name, index, kind, module,
    session, depth)``: ``name`` as ``run.info.layers`` lists it (``down_blocks.0``), ``index``
    its place in forward order, ``kind`` (``down``, ``mid``, ``up`` for a ``block-stack``),
    ``module`` the diffusers module whose ``forward`` is wrapped, ``depth`` its depth in the
    stack (0 outermost). A subclass changes what a block keeps and serves: ``to_cache`` (default:
    its output) and ``served`` (default: the kept value itself); the DiT adapter keeps residuals.
    """

    supports_positions = False
    """Blocks compute every row: ``compute(hidden, positions=...)`` is refused."""
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
        """What the block would output now from what it kept (``served(kept, (), {})``; here the
        kept output itself), or None when it kept nothing in this branch."""
        return self.kept

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """The arguments of a call, ``args`` and ``kwargs``, as one dict by name (``hidden``)."""
        if not args:
            return kwargs
        names = self.arg_names
        hidden = dict(zip(names, args))
        if len(args) > len(names):
            hidden["*args"] = args[len(names):]
        hidden.update(kwargs)
        return hidden

    def call(self, hidden: dict[str, Any]) -> Any:
        """The block's original ``forward`` on ``hidden`` (what ``compute`` runs)."""
        if "*args" not in hidden:
            return self.forward(**hidden)
        rest = dict(hidden)
        extra = rest.pop("*args")
        return self.forward(*[rest.pop(n) for n in self.arg_names], *extra, **rest)

    def to_cache(self, hidden: dict[str, Any], out: Any) -> Any:
        """What the block keeps of a computed call (here its output)."""
        return out

    def served(self, cached: Any, args: tuple, kwargs: dict) -> Any:
        """What a skipped block returns, from ``cached`` (what it kept, or a strategy's estimate
        of it) and the call's positional ``args`` and keyword ``kwargs`` (a strategy holding
        ``hidden`` passes ``()`` and ``hidden``): here ``cached`` itself; a block that keeps a
        residual adds it to its current input."""
        return cached

    def hooked(self, accel: Any, run: RunState, args: tuple, kwargs: dict) -> Any:
        """A block call while a run is on and the plan does not skip the block."""
        return accel.layer_output(run, self, self.bind(args, kwargs))

    def compute(self, hidden: dict[str, Any], positions: Any = None) -> Any:
        """Run the block on ``hidden`` (the core counts it); kept for the branch while strategies are
        active (what ``cached_output`` and ``StepPlan.skip`` serve later)."""
        if positions is not None:
            raise ValueError(f"{self.name}: {self.family} blocks compute every row; positions apply to text layers")
        s = self.session
        out = self.call(hidden)
        run = s.run
        if run is not None and s.keep:  # counted by the core (diffaccel.runtime.sequence)
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


_SESSIONS: "weakref.WeakKeyDictionary[Any, DenoiserSession]" = weakref.WeakKeyDictionary()
"""One table for every diffusers adapter: a pipeline has one diffaccel session, whichever adapter."""
_HINTS: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()
"""Per pipeline: whether its guidance was unbatched (two denoiser calls per step) last time."""


def attach(pipe: Any, accelerator: Any, session_class: type[DenoiserSession]) -> DenoiserSession:
    """Hook ``pipe`` for ``accelerator`` with a new ``session_class`` session (any session the
    pipeline had is detached first); returns it. An adapter's ``attach(pipe, accelerator)``."""
    detach(pipe)
    session = session_class(pipe, accelerator)
    session.unbatched_hint = _HINTS.get(pipe, False)
    session.install()
    _SESSIONS[pipe] = session
    return session


def detach(pipe: Any) -> None:
    """Remove ``pipe``'s session, if any: the pipeline then runs bitwise as if it never had one
    (un-hooked: no wrapper is left in the call path). An adapter's ``detach(pipe)``."""
    session = _SESSIONS.pop(pipe, None)
    if session is not None:
        session.uninstall()
        _HINTS[pipe] = session.unbatched_hint


def session_of(pipe: Any) -> DenoiserSession | None:
    """The session attached to ``pipe``, or None (a peer accelerator must see None: it runs on
    the bare pipeline)."""
    return _SESSIONS.get(pipe)


def call_pipeline(pipe: Any, /, info: dict[str, Any] | None = None, **kwargs: Any) -> tuple[Any, RunState | None]:
    """``pipe(**kwargs)``, with ``info`` (seeds, prompts ...) added to its run's ``run.info``;
    returns the pipeline's result and the ``RunState`` of the run it made (its ``report()`` is
    the output's report), or None when no session is attached (nothing was counted). A run the
    call left open (it raised) is ended. An adapter's ``run`` builds on this."""
    session = _SESSIONS.get(pipe)
    if session is None:
        return pipe(**kwargs), None
    session.last_run = None
    session.next_info = dict(info or {})
    try:
        result = pipe(**kwargs)
    finally:
        if session.run is not None:
            session.end_run()
    return result, session.last_run
