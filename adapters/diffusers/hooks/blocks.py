"""The pieces a diffusers hook session wraps: one block of the denoiser as a ``diffaccel.Layer``
(``DenoiserBlock``), one denoiser call as the core's step model (``_DenoiserCall``), and the instance
attribute patch that puts either in the call path and takes it out again (``_Patch``). The session
they name is ``session.DenoiserSession`` (not imported: it imports this module)."""

from __future__ import annotations

from typing import Any

import torch

from diffaccel.adapterkit import StepModel
from diffaccel.contract.state import Layer, RunState


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
