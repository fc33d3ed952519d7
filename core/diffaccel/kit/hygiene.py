"""Hot-path hygiene: what strategies do to the device and the dtype inside a step, recorded.

On an accelerator every tensor a strategy makes on the CPU costs a host-to-device copy, every
``.item()`` a synchronisation, every float32 copy of a bfloat16 activation twice its memory and
bandwidth. None of this shows on a CPU in float32, so ``watch`` makes it visible anywhere:

* a factory call (``torch.zeros``, ``torch.tensor``, ``torch.randn``...) without ``device=`` in a
  strategy's step hook is a **violation** (it lands on the CPU when the model is elsewhere), and
  so is any tensor a strategy creates on another device than the model's;
* an upcast, a floating result wider than the model's dtype with more elements than a
  per-position statistic (``small``: batch rows x positions), is a **violation** (an activation,
  a cache or logits held in float32 beside a bfloat16 model);
* host synchronisations (``.item()``, ``bool(t)``, ``float(t)``, ``nonzero``) are **counted**, per
  hook: some decisions need them; the count is what a GPU run pays.

Code a strategy runs on the host or in float32 on purpose says so with ``deliberate("why")``;
what it does there is recorded under that reason instead. The model's own computation
(``Layer.compute``) is not the strategy's and is not recorded.

    with watch(strategies, device=pipe.device, dtype=torch.bfloat16, small=B * N) as seen:
        with diffaccel.apply(pipe, strategies=strategies):
            pipe(...)
    assert not seen.violations, seen.violations
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from ..contract.hookspecs import RUN_HOOKS

STEP_HOOKS = tuple(h for h in RUN_HOOKS if h not in ("diffaccel_run_start", "diffaccel_finalize", "diffaccel_run_end"))
"""The hooks called inside a step: those ``watch`` records."""

_local = threading.local()


@contextlib.contextmanager
def deliberate(why: str) -> Iterator[None]:
    """Mark a block of a strategy's step hook as on the host or in float32 on purpose (``why``
    says what needs it); ``watch`` records what happens inside under that reason, never as a
    violation. Costs a thread-local assignment when nothing watches."""
    prev = getattr(_local, "why", None)
    _local.why = why
    try:
        yield
    finally:
        _local.why = prev


@attrs.define
class Seen:
    """What ``watch`` recorded."""

    violations: list[str] = attrs.Factory(list)
    """One line each: the strategy, the hook, the op and what was wrong (repeats kept once)."""
    deliberate: Counter = attrs.Factory(Counter)
    """Reason -> ops recorded inside ``deliberate(reason)``."""
    host_syncs: Counter = attrs.Factory(Counter)
    """``strategy.hook`` -> host synchronisations (``.item()``, ``bool()``, ``nonzero``...)."""

    _keys: set = attrs.Factory(set)

    def add(self, line: str, key: Any = None) -> None:
        """Record ``line`` once per ``key`` (the strategy, hook, op and kind: not every shape)."""
        key = line if key is None else key
        if key not in self._keys:
            self._keys.add(key)
            self.violations.append(line)


_SYNC_OPS = ("_local_scalar_dense", "nonzero", "equal", "is_nonzero", "masked_select")


def _factories() -> set[Any]:
    from torch.utils._device import _device_constructors

    return {f for f in _device_constructors() if not getattr(f, "__name__", "").endswith("_like")}


def _modes(seen: Seen, active: Any, device: Any, dtype: Any, small: int) -> tuple[Any, Any]:
    """The two torch modes that record: factory calls without ``device=`` (a function mode), and
    each op's results, their device, width and host synchronisations (a dispatch mode); ``active()``
    names the strategy hook running, or None."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    factories = _factories()
    width = torch.finfo(dtype).bits if dtype.is_floating_point else 64

    class Factories(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            at = active()
            if at and func in factories and kwargs.get("device") is None:
                why = getattr(_local, "why", None)
                name = getattr(func, "__name__", str(func))
                if why:
                    seen.deliberate[why] += 1
                else:
                    seen.add(f"{at}: torch.{name}(...) without device= (lands on the CPU when the model is on another device)")
            return func(*args, **kwargs)

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            at = active()
            if not at:
                return out
            name = func.overloadpacket.__name__
            why = getattr(_local, "why", None)
            if name in _SYNC_OPS:
                seen.host_syncs[at] += 1
            if why:
                seen.deliberate[why] += 1
                return out
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if not isinstance(t, torch.Tensor):
                    continue
                if t.device != device and t.device.type != "meta":
                    seen.add(f"{at}: aten.{name} made a tensor on {t.device} while the model is on {device}", (at, name, "device"))
                elif t.is_floating_point() and torch.finfo(t.dtype).bits > width and t.numel() > small:
                    seen.add(f"{at}: aten.{name} made a {str(t.dtype).removeprefix('torch.')} tensor of {tuple(t.shape)} "
                             f"beside a {str(dtype).removeprefix('torch.')} model (an upcast)", (at, name, "upcast"))
            return out

    return Factories(), Ops()


def _record_hooks(strategies: Sequence[Any], where: list[str]) -> list[tuple[Any, str, Any, bool]]:
    """Wrap each strategy's step hooks so that ``where`` names the one running; returns what to restore."""
    def wrap(strategy: Any, hook: str, fn: Any) -> Any:
        label = f"{getattr(strategy, 'name', type(strategy).__name__)}.{hook.removeprefix('diffaccel_')}"

        @functools.wraps(fn)
        def recorded(*a: Any, **kw: Any) -> Any:
            where.append(label)
            try:
                return fn(*a, **kw)
            finally:
                where.pop()

        return recorded

    patched: list[tuple[Any, str, Any, bool]] = []
    for s in strategies:
        for hook in STEP_HOOKS:
            fn = getattr(s, hook, None)
            if fn is not None and getattr(fn, "diffaccel_impl", None) is not None:
                had = hook in vars(s)
                patched.append((s, hook, vars(s).get(hook), had))
                setattr(s, hook, wrap(s, hook, fn))
    return patched


def _unrecord_model(model_depth: list[int]) -> list[tuple[type, Any]]:
    """Wrap every ``Layer`` subclass's ``compute`` so that the model's own computation is not
    recorded (``model_depth``); returns what to restore."""
    from ..contract.state import Layer

    def model_side(compute: Any) -> Any:
        @functools.wraps(compute)
        def unrecorded(self: Any, *a: Any, **kw: Any) -> Any:
            model_depth[0] += 1
            try:
                return compute(self, *a, **kw)
            finally:
                model_depth[0] -= 1

        return unrecorded

    layers, todo = [], [Layer]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if "compute" in cls.__dict__ and cls is not Layer:
            layers.append((cls, cls.__dict__["compute"]))
            cls.compute = model_side(cls.__dict__["compute"])
    return layers


@contextlib.contextmanager
def watch(strategies: Sequence[Any], *, device: Any, dtype: Any, small: int = 0) -> Iterator[Seen]:
    """Record the step hooks of ``strategies`` (instances, wrapped for the block and restored
    after) against a model on ``device`` in ``dtype``; yields a ``Seen``. ``small``: the most
    elements a float32 result may have without counting as an upcast (per-position statistics)."""
    import torch

    seen = Seen()
    where: list[str] = []  # the strategy.hook being run (a stack: hooks may nest through compute)
    model_depth = [0]

    def active() -> str | None:
        return where[-1] if where and not model_depth[0] else None

    factories, ops = _modes(seen, active, torch.device(device), dtype, small)
    patched = _record_hooks(strategies, where)
    layers = _unrecord_model(model_depth)
    try:
        with factories, ops:
            yield seen
    finally:
        for cls, compute in layers:
            cls.compute = compute
        for s, hook, old, had in patched:
            if had:
                setattr(s, hook, old)
            else:
                delattr(s, hook)
