"""The conformance suite's model-level checks and its readings of a run (``diffaccel.testing.check_adapter``
runs them): ``partial``, a layer computed on part of its positions against the same layer computed
in full; ``facts``, ``facts(config)`` against ``info(pipe)`` and refusing what ``load`` refuses;
the hook order a recording strategy saw (``order``) and the counters of a run that skips nothing
(``report``)."""

from __future__ import annotations

from typing import Any

import attrs

from .contract.state import Layer
from .runtime.registry import hookimpl


def _fail(check: str, what: str) -> None:
    raise AssertionError(f"adapter conformance, {check}: {what}")


def check_order(log: list[tuple[str, int]], steps: int, handed: list[Any], layers: list[str]) -> None:
    """``order``: the hooks ``log`` recorded ((hook, run.step) pairs) in the contract's order over
    ``steps`` steps, and each layer ``handed`` to ``layer_output`` a ``Layer`` named in ``layers``."""
    if not log or log[0][0] != "run_start" or log[-1][0] != "run_end" or log[-2][0] != "finalize":
        _fail("order", f"a run must open with run_start and close with finalize, run_end; got {log[:1]} ... {log[-2:]}")
    pre = sorted({s for h, s in log if h == "pre_step"})
    if pre != list(range(steps)):
        _fail("order", f"pre_step ran at steps {pre}, expected 0..{steps - 1} (report's steps_run {steps})")
    posts = sorted({s for h, s in log if h == "post_step"})
    if posts != list(range(steps)):
        _fail("order", f"post_step ran at steps {posts}, expected 0..{steps - 1}")
    by_step: dict[int, list[str]] = {}
    last_step = -1
    for h, s in log[1:-2]:
        if s < last_step:
            _fail("order", f"run.step went back from {last_step} to {s} at {h}")
        last_step = s
        by_step.setdefault(s, []).append(h)
    for s, hooks in by_step.items():
        if hooks[0] != "pre_step":
            _fail("order", f"step {s} opened with {hooks[0]}, not pre_step")
        if hooks[-1] != "post_step":
            _fail("order", f"step {s} closed with {hooks[-1]}, not post_step")
        late = [h for h in hooks[hooks.index("post_step"):] if h != "post_step"]
        if late:
            _fail("order", f"{late[0]} ran at step {s} after that step's post_step")
        if "denoiser_output" not in hooks:
            _fail("order", f"no denoiser_output at step {s}")
    if not handed:
        _fail("order", "no layer was routed through layer_output")
    for layer in handed:
        if not isinstance(layer, Layer):
            _fail("order", f"layer_output was handed {type(layer).__name__}, not a diffaccel.Layer")
        if layers and layer.name not in layers:
            _fail("order", f"layer '{layer.name}' is not among info(pipe)['layers'] {layers}")


def check_counters(c: dict[str, Any], steps: int, layers: list[str]) -> None:
    """``report``: the counters ``c`` of a run whose strategy skips nothing, over ``steps`` steps."""
    if c["layers_skipped"] or not 0 < c["positions_computed"] == c["positions_total"]:
        _fail("report", f"a run that skips nothing counted {c['layers_skipped']} skipped layers and positions computed "
                        f"{c['positions_computed']} of {c['positions_total']}: route every layer through layer_output and "
                        "set run.positions_per_layer")
    if layers and (c["layers_computed"] % len(layers) or c["layers_computed"] < steps * len(layers)):
        _fail("report", f"{c['layers_computed']} layers computed in {steps} steps of {len(layers)} layers each")


PARTIAL_TOLERANCE = {"float64": 1e-10, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
"""Per dtype, the largest difference between a partial and a full layer call allowed, relative to
the largest magnitude of the full output (at least 1): reductions in another order, nothing more."""


def _probe_mask(shape: tuple[int, ...], device: Any) -> Any:
    """A ragged (B, N) mask: in row r, the positions p with (p + r) % 3 == 0 (so rows hold
    different positions and, at odd N, different numbers of them)."""
    import torch

    B, N = shape
    pos = torch.arange(N, device=device)[None, :] + torch.arange(B, device=device)[:, None]
    return pos % 3 == 0


class _PartialProbe:
    """At step 1, runs each layer that takes positions in full, then on a ragged part of its
    positions (its caches now hold this step's keys and values, so the part must reproduce the
    full output there), records the largest difference, and hands on a full computation."""

    name = "conformance-partial"

    def __init__(self):
        self.seen: list[tuple[str, float, float, Any]] = []  # (layer, max diff, scale, dtype)
        self.kept: list[str] = []  # layers whose part changed the positions it did not compute

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        import torch

        if run.step != 1 or not getattr(layer, "supports_positions", False) or not isinstance(hidden, torch.Tensor) \
                or hidden.dim() < 2:
            return None
        full = layer.compute(hidden).clone()
        mask = _probe_mask(tuple(hidden.shape[:2]), hidden.device)
        part = layer.compute(hidden, mask).clone()
        diff = float((part[mask].float() - full[mask].float()).abs().max())
        self.seen.append((layer.name, diff, max(1.0, float(full.float().abs().max())), full.dtype))
        if not torch.equal(part[~mask], full[~mask]):
            self.kept.append(layer.name)
        return layer.compute(hidden)  # a full computation: the rest of the step sees the layer's true output


def check_partial(run, info_layers) -> None:
    """The ``partial`` check: ``run(strategies=[...])`` runs the adapter once with a strategy."""
    probe = _PartialProbe()
    run(strategies=[probe])
    if not probe.seen:
        _fail("partial", "no layer with supports_positions was handed over at step 1")
    for name, diff, scale, dtype in probe.seen:
        tol = PARTIAL_TOLERANCE.get(str(dtype).removeprefix("torch."), 1e-5)
        if not diff <= tol * scale:
            _fail("partial", f"layer '{name}' computed on part of its positions differs from its full computation there "
                             f"by {diff:.3g} (tolerance {tol * scale:.3g} in {dtype}): the partial path must compute "
                             "what the full one does (same attention mask, same positions)")
    if probe.kept:
        _fail("partial", f"layer '{probe.kept[0]}' computed on part of its positions changed the others: they must keep "
                         "their cached output")


def _refusal(fn, config) -> str | None:
    """The line ``fn(config)`` refuses ``config`` with (a ``DiffaccelError``), or None."""
    from .contract.errors import DiffaccelError

    try:
        fn(config)
    except DiffaccelError as exc:
        return str(exc)
    return None


def check_facts(adapter, cfg, info, refused, where) -> None:
    """The ``facts`` check (``check_adapter``'s docstring says what it compares)."""
    facts = adapter.facts(cfg)
    for key in ("n_layers", "layers"):
        if key in info and facts.get(key) != info[key]:
            _fail("facts", f"facts(config)[{key!r}] is {facts.get(key)!r}, info(pipe) says {info[key]!r}")
    model = getattr(cfg, "model", None)
    probes = list(refused)
    if model is not None and attrs.has(type(model)) and "checkpoint" in attrs.fields_dict(type(model)):
        probes.insert(0, attrs.evolve(cfg, model=attrs.evolve(model, checkpoint=str(where / "no-such-model"))))
    for bad in probes:
        said = _refusal(adapter.load, bad)
        checked = _refusal(adapter.facts, bad)
        if said is not None and checked is None:
            _fail("facts", f"load refuses checkpoint {bad.model.checkpoint!r} ({said}) but facts accepts it: "
                           "`diffaccel check` would say ok to what `generate` refuses")
        if said is None and checked is not None:
            _fail("facts", f"facts refuses checkpoint {bad.model.checkpoint!r} ({checked}) but load accepts it")
        if said != checked:
            _fail("facts", f"load and facts refuse checkpoint {bad.model.checkpoint!r} with different lines: "
                           f"{said!r} against {checked!r}")
