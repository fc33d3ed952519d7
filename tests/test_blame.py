"""Blame at the call site: a fault of the model's own compute is the model's (one line naming
the checkpoint and the step), even when a strategy's hook called ``layer.compute``; a fault in a
strategy's own code is that strategy's (``StrategyError``, or dropped with ``on_error = "disable"``)."""

from __future__ import annotations

import pytest
import torch

import diffaccel
from diffaccel import ModelError, StrategyError, hookimpl
from diffaccel.runtime.accelerator import Accelerator
from diffaccel.adapters.text.testing import tiny_text_pipeline
from diffaccel.adapters.diffusers.unet.testing import tiny_digits_pipeline


class Partial:
    """Computes every layer itself, on every position (``layer.compute`` called from its hook)."""

    name = "partial"

    def __init__(self, fail_at: int | None = None):
        self.fail_at = fail_at

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        if run.step == self.fail_at:
            raise KeyError("the strategy's own bug")
        return layer.compute(hidden)


def _oom_at(step: int, block):
    """A block function that raises like an out-of-memory at ``step`` (counted by calls)."""
    calls = {"n": 0}

    def broken(*a, **k):
        calls["n"] += 1
        if calls["n"] > step:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return block(*a, **k)

    return broken


def _text(accel, **kw):
    pipe = tiny_text_pipeline("masked", n_layers=1)
    pipe.name = "tiny-masked"
    pipe.accelerator = accel
    return pipe


@pytest.mark.parametrize("on_error", ["raise", "disable"])
def test_the_models_fault_under_a_strategys_hook_is_the_models(on_error):
    pipe = _text(None)
    pipe.denoiser.block = _oom_at(2, pipe.denoiser.block)  # one layer: call n is step n - 1
    pipe.accelerator = Accelerator([Partial()], "text", on_error={"partial": on_error})
    with pytest.raises(ModelError) as info:
        pipe(length=8, steps=6, progress=False)
    err = info.value
    assert not isinstance(err, StrategyError)
    assert (err.checkpoint, err.step, err.layer) == ("tiny-masked", 2, "block.0")
    assert "tiny-masked" in str(err) and "step 2" in str(err) and "\n" not in str(err)
    assert isinstance(err.__cause__, RuntimeError)


def test_the_models_fault_without_strategies_is_the_same_line():
    pipe = _text(None)
    pipe.denoiser.block = _oom_at(1, pipe.denoiser.block)
    with pytest.raises(ModelError) as info:
        pipe(length=8, steps=4, progress=False)
    assert (info.value.checkpoint, info.value.step) == ("tiny-masked", 1)


def test_a_fault_in_the_strategys_own_code_is_the_strategys():
    pipe = _text(Accelerator([Partial(fail_at=1)], "text"))
    with pytest.raises(StrategyError) as info:
        pipe(length=8, steps=4, progress=False)
    err = info.value
    assert (err.strategy, err.hook, err.step) == ("partial", "layer_output", 1)
    assert isinstance(err.__cause__, KeyError)


def test_on_error_disable_still_drops_a_faulty_strategy():
    plain = tiny_text_pipeline("masked", n_layers=1)(length=8, steps=4, progress=False)
    pipe = _text(Accelerator([Partial(fail_at=1)], "text", on_error={"partial": "disable"}))
    out = pipe(length=8, steps=4, progress=False)
    assert [(d["strategy"], d["hook"], d["step"]) for d in out.report["reliability"]["disabled"]] == [
        ("partial", "layer_output", 1)]
    assert torch.equal(out.tokens, plain.tokens)  # the strategy computed layers in full: nothing changed


def test_a_diffusers_blocks_fault_under_a_strategy_is_the_models():
    from diffaccel.adapters.diffusers.hooks import session_of

    pipe = tiny_digits_pipeline()
    pipe.set_progress_bar_config(disable=True)

    class Blocks(Partial):
        name = "blocks"

    with diffaccel.apply(pipe, strategies=[Blocks()]):
        block = session_of(pipe).layers[0]
        block.forward = _oom_at(2, block.forward)  # batched guidance: one call per step
        with pytest.raises(ModelError) as info:
            pipe(["digit 3"], num_inference_steps=5, guidance_scale=2.0, output_type="pt",
                 generator=[torch.Generator().manual_seed(0)])
    assert (info.value.step, info.value.layer) == (2, block.name)
    assert isinstance(info.value.__cause__, RuntimeError)
