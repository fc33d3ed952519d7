"""diffaccel's hooks inside a diffusers pipeline whose ``.unet`` is a ``UNet2DConditionModel``.

Nothing of the pipeline's code changes. ``attach`` replaces, as instance attributes (the
originals are kept and put back by ``detach``):

* ``forward`` of each UNet block, in forward order ``down_blocks.0 .. down_blocks.n-1``,
  ``mid_block``, ``up_blocks.0 .. up_blocks.m-1`` (read from ``unet.down_blocks``,
  ``unet.mid_block``, ``unet.up_blocks``): a block call becomes
  ``accelerator.layer_output(run, block, hidden)``, where ``hidden`` is a dict of the block's
  arguments by name and ``UNetBlock.compute(hidden)`` calls the original ``forward``. A strategy
  that answers with a cached output skips the block: its code never runs.
* ``forward`` of the modules inside a block (``down_blocks.1.resnets.0``,
  ``mid_block.attentions.0``, ... listed by ``module_specs`` from the blocks' ``resnets``,
  ``attentions``, ``downsamplers`` and ``upsamplers``), only those a strategy asks for through
  the ``diffaccel_hooked_modules(available) -> names`` hook: the same ``layer_output`` call, at
  the finer granularity. Unrequested modules are left alone, so the default costs nothing.
* ``unet.forward``: one UNet call is one denoiser evaluation. The first call after
  ``scheduler.step`` (or with a new timestep) starts a step: ``run.step``, ``run.timestep`` are
  set and ``pre_step`` runs. ``StepPlan.reuse_step`` returns the branch's last UNet output
  without running the UNet; ``StepPlan.skip`` serves the named blocks from their last output
  for the branch. ``denoiser_output`` sees the raw noise prediction of each UNet call.
* ``scheduler.set_timesteps``: a pipeline call begins; one ``RunState`` per pipeline call,
  created at its first UNet call (then the batch is known).
* ``scheduler.step``: the step ends; ``post_step`` gets a ``UNetStepOutput`` (the new latents
  and the guided noise prediction). At the last timestep ``finalize`` gets a ``UNetFinal``
  whose ``latents`` become the scheduler's result, then ``run_end``.

Classifier-free guidance: diffusers' pipelines batch both branches into one UNet call of 2B
rows; that call is branch ``main``. A pipeline that calls the UNet twice per step (unbatched
guidance) gets ``run.branch = "uncond"`` for the first call and ``"cond"`` for the second, so
each branch keeps its own strategy state (``run.state``) and block caches. Unbatched guidance
is recognised at the second call of the first step (the state that call 0 made under ``main``
is renamed ``uncond``) and remembered for the pipeline's next runs. In unbatched mode
``post_step`` runs once per branch (same output); ``finalize`` runs once, on ``main``.
"""

from __future__ import annotations

import inspect
import re
import weakref
from contextlib import contextmanager
from typing import Any

import attrs
import torch

from diffaccel.capabilities import BLOCK_STACK, BLOCK_TAIL, GUIDANCE_BRANCHES, INNER_MODULES, SPATIAL_FEATURES
from diffaccel.state import Layer, RunState

from . import tail

CAPABILITIES = frozenset({BLOCK_STACK, BLOCK_TAIL, SPATIAL_FEATURES, INNER_MODULES, GUIDANCE_BRANCHES})
"""What the UNet adapter offers strategies (``diffaccel.capabilities``)."""

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@attrs.define
class UNetStepOutput:
    """What ``diffaccel_post_step`` receives from the UNet adapter after each scheduler step."""

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


def depth_of(name: str, n_down: int) -> int:
    """Block depth: down_blocks.d and up_blocks.(n_down-1-d) share depth d; mid_block is n_down;
    an inner module has its block's depth."""
    m = re.match(r"(down|up)_blocks\.(\d+)", name)
    if m is None:
        return n_down
    i = int(m.group(2))
    return i if m.group(1) == "down" else n_down - 1 - i


def block_specs(unet) -> list[tuple[str, str, torch.nn.Module]]:
    """(name, kind, module) of each block of a ``UNet2DConditionModel``, in forward order."""
    specs = [(f"down_blocks.{i}", "down", b) for i, b in enumerate(unet.down_blocks)]
    if getattr(unet, "mid_block", None) is not None:
        specs.append(("mid_block", "mid", unet.mid_block))
    specs += [(f"up_blocks.{i}", "up", b) for i, b in enumerate(unet.up_blocks)]
    return specs


_SUBMODULE_LISTS = (("resnets", "resnet"), ("attentions", "attention"), ("downsamplers", "downsampler"),
                    ("upsamplers", "upsampler"))
"""The module lists diffusers' UNet blocks are built from (``CrossAttnDownBlock2D.resnets`` ...),
read in this order, which is each block's forward order for down and up blocks."""


def module_specs(unet) -> list[tuple[str, str, torch.nn.Module]]:
    """(name, kind, module) of the modules inside each block: ``down_blocks.1.resnets.0``,
    ``mid_block.attentions.0``, ``up_blocks.0.upsamplers.0`` ... (the finer granularity a
    strategy may ask for), in block order."""
    specs = []
    for block_name, _, block in block_specs(unet):
        for attr, kind in _SUBMODULE_LISTS:
            mods = getattr(block, attr, None)
            if isinstance(mods, torch.nn.ModuleList):
                specs += [(f"{block_name}.{attr}.{i}", kind, m) for i, m in enumerate(mods)]
    return specs


def requested_modules(accelerator: Any, available: list[str]) -> list[str]:
    """Names of inner modules the strategies ask to be hooked (``diffaccel_hooked_modules``)."""
    ask = getattr(accelerator, "hooked_modules", None)  # the untouched path has no accelerator
    return ask(available) if ask is not None else []


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


class UNetBlock(Layer):
    """The UNet adapter's layer: one UNet block (``down_blocks.i``, ``mid_block``, ``up_blocks.i``;
    kind ``down``/``mid``/``up``), or one module inside a block (``down_blocks.1.attentions.0``,
    kind ``resnet``/``attention``/``downsampler``/``upsampler``) when a strategy asked for that
    granularity.

    ``compute(hidden)`` runs the block's original ``forward`` on ``hidden`` (the dict of its
    arguments by name; positional arguments beyond the named ones, if any, under ``"*args"``).
    ``cached_output`` is its last output in the current branch (while strategies are active);
    ``depth`` its place in the stack (``block-stack``); ``module`` the diffusers module. Up blocks
    run their last layers alone (``block-tail``): ``tail_start``, ``capture_tail``,
    ``can_run_tail``, ``run_tail``.
    """

    supports_positions = False

    def __init__(self, name: str, index: int, kind: str, module: torch.nn.Module, session: "Session", depth: int = 0):
        super().__init__(name, index, kind)
        self.depth = depth
        self.module = module
        self.block_type = type(module).__name__
        self.session = session
        self.forward = None  # the original forward, set by attach
        self.arg_names: tuple[str, ...] = ()

    @property
    def cached_output(self) -> Any:
        run = self.session.run
        return None if run is None else self.session.block_cache.get((run.branch, self.name))

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

    # -- block-tail: the last layers of an up block alone (``tail``) ------------------------------
    def tail_start(self, tail_layers: int) -> int:
        """Index of the first of the block's last ``tail_layers`` layers; ValueError naming the
        block when it has fewer."""
        return tail.tail_start(self.module, tail_layers, self.name)

    def can_run_tail(self, hidden: dict[str, Any]) -> bool:
        """Whether ``run_tail`` can stand in for the block's forward on these arguments."""
        return tail.can_run_tail(self.module, hidden)

    @contextmanager
    def capture_tail(self, hidden: dict[str, Any], start: int):
        """While the ``with`` body computes the whole block, the features entering layer ``start``
        are stored in the yielded dict under ``"h"``."""
        with tail.capture_tail_input(self.module, start, tail.skip_channels(self.module, hidden, start), {}) as got:
            yield got

    def run_tail(self, hidden: dict[str, Any], h: torch.Tensor, start: int) -> torch.Tensor:
        """Layers ``start..`` and the upsamplers, from features ``h`` entering layer ``start``."""
        return tail.run_tail(self.module, hidden, h, start)

    def compute(self, hidden: dict[str, Any], positions: Any = None) -> Any:
        if positions is not None:
            raise ValueError(f"{self.name}: UNet blocks compute every row; positions apply to text layers")
        s = self.session
        out = self.call(hidden)
        run = s.run
        if run is not None:
            c = run.counters
            c.layers_computed += 1
            c.positions_computed += run.positions_per_layer
            if s.keep:
                s.block_cache[(run.branch, self.name)] = out
        return out


class Session:
    """The accelerator attached to one pipeline, and the state of its current run."""

    def __init__(self, pipe: Any, accelerator: Any):
        self.pipe = pipe
        self.accel = accelerator
        self.keep = bool(getattr(accelerator, "active", False))
        """Keep block and UNet outputs for StepPlan.skip / reuse_step (only with strategies)."""
        self.unet = pipe.unet
        specs = block_specs(self.unet)
        n_down = sum(1 for _, kind, _ in specs if kind == "down")
        self.layers = [UNetBlock(name, i, kind, mod, self, depth_of(name, n_down)) for i, (name, kind, mod) in enumerate(specs)]
        inner = module_specs(self.unet)
        wanted = set(requested_modules(accelerator, [name for name, _, _ in inner]))
        self.modules = [UNetBlock(name, len(self.layers) + i, kind, mod, self, depth_of(name, n_down))
                        for i, (name, kind, mod) in enumerate(spec for spec in inner if spec[0] in wanted)]
        """Inner modules hooked because a strategy asked for them (``hooked_modules``)."""
        self.run: RunState | None = None
        self.last_run: RunState | None = None
        self.unbatched_hint = False
        self.next_info: dict[str, Any] = {}
        """Facts for the next run's ``run.info`` (the adapter's ``run`` sets seeds and prompts)."""
        self._patches: list[_Patch] = []
        self._reset_run_state()

    # -- per-run bookkeeping -----------------------------------------------------------------
    def _reset_run_state(self) -> None:
        self.step_open = False
        self.step_t: float | None = None
        self.calls = 0
        self.step_branches: list[str] = []
        self.unbatched = False
        self.block_cache: dict[tuple[str, str], Any] = {}
        self.unet_cache: dict[str, Any] = {}

    def _begin_run(self, rows: int) -> RunState:
        pipe = self.pipe
        cfg = getattr(pipe, "do_classifier_free_guidance", None)
        self._reset_run_state()
        self.unbatched = self.unbatched_hint and cfg is not False
        batch = rows // 2 if cfg and not self.unbatched and rows % 2 == 0 else rows
        timesteps = getattr(pipe.scheduler, "timesteps", None)
        run = RunState(adapter="unet", num_steps=len(timesteps) if timesteps is not None else 0, batch_size=batch,
                       capabilities=CAPABILITIES)
        unet_cfg = self.unet.config
        run.info.update(
            layers=[layer.name for layer in self.layers], n_layers=len(self.layers), time_conditioned=True,
            depths=[layer.depth for layer in self.layers], kinds=[layer.kind for layer in self.layers],
            modules=[m.name for m in self.modules],
            sample_size=unet_cfg.sample_size, in_channels=unet_cfg.in_channels, guidance=bool(cfg),
            cfg_mode="unbatched" if self.unbatched else ("batched" if cfg else "none"),
            timesteps=[float(t) for t in timesteps] if timesteps is not None else [],
        )
        run.info.update(self.next_info)
        self.next_info = {}
        self.run = run
        self.accel.start_run(run)
        return run

    def end_run(self) -> None:
        run = self.run
        if run is None:
            return
        self.run = None
        self.last_run = run
        self.block_cache = {}
        self.unet_cache = {}
        run.branch = "main"
        self.accel.end_run(run)

    def _rename_branch(self, old: str, new: str) -> None:
        run = self.run
        states = run._states  # noqa: SLF001 - the adapter owns branch naming
        for (name, branch) in list(states):
            if branch == old:
                states[(name, new)] = states.pop((name, branch))
        for (branch, block) in list(self.block_cache):
            if branch == old:
                self.block_cache[(new, block)] = self.block_cache.pop((branch, block))
        if old in self.unet_cache:
            self.unet_cache[new] = self.unet_cache.pop(old)
        self.step_branches = [new if b == old else b for b in self.step_branches]

    def _branch_for_call(self, k: int, rows: int) -> str:
        if k == 0:
            return "uncond" if self.unbatched else "main"
        if k == 1:
            if not self.unbatched:  # a second UNet call in one step: guidance is not batched
                self.unbatched = self.unbatched_hint = True
                self.run.info["cfg_mode"] = "unbatched"
                self.run.batch_size = rows
                self._rename_branch("main", "uncond")
            return "cond"
        return f"call{k}"

    # -- the wrappers ----------------------------------------------------------------------------
    def unet_forward(self, original):
        accel = self.accel

        def forward(*args, **kwargs):
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
                    run.info["cfg_mode"] = "none"
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
            plan = accel.pre_step(run)
            raw = None
            if plan is not None and plan.reuse_step:
                raw = self.unet_cache.get(branch)
                if raw is not None:
                    run.counters.steps_reused += 1
            if raw is None:
                raw = original(*args, **kwargs)
                if self.keep:
                    self.unet_cache[branch] = raw
            noise = raw[0] if isinstance(raw, tuple) else raw.sample
            guarded = accel.guard_due(run)
            if not accel.output_ok(run, noise) or guarded:  # the UNet call again, without strategies
                accelerated = noise if guarded else None
                with accel.bypassed(run):
                    raw = original(*args, **kwargs)
                    noise = raw[0] if isinstance(raw, tuple) else raw.sample
                    accel.output_ok(run, noise)  # raises if the full call is non-finite too
                if self.keep:
                    self.unet_cache[branch] = raw
                if accelerated is not None:
                    accel.guard_compare(run, accelerated, noise)
            new = accel.denoiser_output(run, noise)
            if new is noise:
                return raw
            if isinstance(raw, tuple):
                return (new, *raw[1:])
            return type(raw)(sample=new)

        return forward

    def block_forward(self, layer: UNetBlock):
        accel = self.accel
        name = layer.name

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
                        c = run.counters
                        c.positions_total += run.positions_per_layer
                        c.layers_skipped += 1
                        return cached
                return accel.layer_output(run, layer, layer.bind(args, kwargs))

            return forward

        return make

    def scheduler_set_timesteps(self, original):
        def set_timesteps(*args, **kwargs):
            if self.run is not None:  # the previous call never reached its last step
                self.end_run()
            self._reset_run_state()
            return original(*args, **kwargs)

        return set_timesteps

    def scheduler_step(self, original):
        accel = self.accel

        def step(model_output, timestep, sample, *args, **kwargs):
            out = original(model_output, timestep, sample, *args, **kwargs)
            run = self.run
            if run is None:
                return out
            self.step_open = False
            is_tuple = isinstance(out, tuple)
            prev = out[0] if is_tuple else out.prev_sample
            if accel.active:
                x0 = (out[1] if len(out) > 1 else None) if is_tuple else getattr(out, "pred_original_sample", None)
                so = UNetStepOutput(step=run.step, timestep=run.timestep, latents=prev, noise_pred=model_output, pred_original=x0)
                for branch in self.step_branches or ["main"]:
                    run.branch = branch
                    accel.post_step(run, so)
            if self._is_last(timestep):
                run.branch = "main"
                final = UNetFinal(draft=prev)
                accel.finalize(run, final)
                if final.latents is not None and final.latents is not prev:
                    if is_tuple:
                        out = (final.latents, *out[1:])
                    else:
                        out.prev_sample = final.latents
                self.end_run()
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
            self._patches.append(_Patch(self.unet, "forward", self.unet_forward))
            self._patches.append(_Patch(sched, "set_timesteps", self.scheduler_set_timesteps))
            self._patches.append(_Patch(sched, "step", self.scheduler_step))
        except Exception:
            self.uninstall()
            raise

    def uninstall(self) -> None:
        if self.run is not None:
            self.end_run()
        for p in reversed(self._patches):
            p.restore()
        self._patches = []


_SESSIONS: "weakref.WeakKeyDictionary[Any, Session]" = weakref.WeakKeyDictionary()
_HINTS: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def attach(pipe: Any, accelerator: Any) -> Session:
    detach(pipe)
    session = Session(pipe, accelerator)
    session.unbatched_hint = _HINTS.get(pipe, False)
    session.install()
    _SESSIONS[pipe] = session
    return session


def detach(pipe: Any) -> None:
    session = _SESSIONS.pop(pipe, None)
    if session is not None:
        session.uninstall()
        _HINTS[pipe] = session.unbatched_hint


def session_of(pipe: Any) -> Session | None:
    return _SESSIONS.get(pipe)
