"""``diffaccel overhead``'s entries (issue 27): the pass-through strategy that ``--guard N`` puts
under the quality guard changes nothing, so what the guarded runs add is the guard's own work."""

from __future__ import annotations

import tomllib

import pytest
import torch

from diffaccel.runtime.accelerator import Accelerator
from diffaccel.runtime.adapters_registry import get_adapter
from diffaccel.runtime.config import parse_config
from diffaccel.runtime.guard import GuardConfig
from diffaccel.adapters.text.testing import tiny_text_pipeline
from diffaccel.adapters.diffusers.unet.testing import tiny_digits_pipeline
from diffaccel.cli.tools import PassThrough

MODELS = {"text": '[model]\nadapter = "text"\nsteps = 6\nlength = 16\n',
          "unet": '[model]\nadapter = "unet"\nsteps = 4\nbatch = 2\nprompts = ["digit 3", "digit 5"]\n'}


def _out(out):
    return out.tokens if hasattr(out, "tokens") else out.images


@pytest.mark.parametrize("name", ["text", "unet"])
def test_pass_through_under_the_guard_computes_each_step_twice_and_changes_nothing(name):
    pipe = tiny_text_pipeline() if name == "text" else tiny_digits_pipeline()
    cfg = parse_config(tomllib.loads(MODELS[name]), source=f"{name}.toml")
    adapter = get_adapter(name)
    untouched = adapter.run(pipe, cfg, 0, progress=False)
    runs = {}
    for every in (0, 1):
        accel = Accelerator([PassThrough()], adapter.name, guard=GuardConfig(every=every))
        assert accel.active  # a strategy the guard guards
        adapter.attach(pipe, accel)
        try:
            runs[every] = adapter.run(pipe, cfg, 0, progress=False)
        finally:
            adapter.detach(pipe)
    assert torch.equal(_out(runs[0]), _out(untouched)) and torch.equal(_out(runs[1]), _out(untouched))
    assert "reliability" not in runs[0].report  # guard off: nothing checked
    rel = runs[1].report["reliability"]
    steps = runs[1].report["steps_run"]
    assert rel["guard_checks"] == steps and rel["guard_trips"] == 0 and rel["guard_max_error"] == 0.0
    # every step computed twice: the strategy's step and the guard's full step
    assert runs[1].report["counters"]["layers_computed"] == 2 * runs[0].report["counters"]["layers_computed"]
