"""The public run API: typed run info (the old dict form warns and still works), strategy states
through ``RunState.states``, the contract's merge rules as data, adapter abilities as protocols."""

from __future__ import annotations

import warnings

import pytest
import torch

from diffaccel import Accelerator, RunInfo, RunState, hookimpl
from diffaccel.contract.info import GROUPED, ImageFacts, StackFacts, TokenFacts
from diffaccel.contract import hookspecs
from diffaccel.contract.adapter import JudgesSamples, MeasuresFluency, TimesPartialSteps, WritesFiles
from diffaccel.runtime.adapters_registry import get_adapter
from diffaccel.runtime.sequence import RunSequence
from diffaccel.adapters.text.testing import tiny_text_pipeline


def test_run_info_is_typed_by_capability_and_the_dict_form_warns_naming_the_attribute():
    info = RunInfo(tokens=TokenFacts(length=12, sampler="masked"))
    assert info.tokens.length == 12 and info.tokens.vocab_size is None
    assert info.stack == StackFacts() and info.images == ImageFacts() and info.checkpoint is None
    with pytest.warns(DeprecationWarning, match=r"run\.info\['length'\].*use run\.info\.tokens\.length"):
        assert info["length"] == 12
    with pytest.warns(DeprecationWarning, match="use run.info.tokens.vocab_size"):
        assert info.get("vocab_size", 7) == 7
    with pytest.warns(DeprecationWarning, match="use run.info.seeds"):
        assert info.get("seeds") is None
    with pytest.warns(DeprecationWarning, match="run.info.set"):
        info.update(kind="masked", custom=3)
    assert info.tokens.kind == "masked" and info.extra == {"custom": 3}
    with pytest.warns(DeprecationWarning), pytest.raises(KeyError):
        info["tokenizer"]
    assert info.as_dict() == {"length": 12, "sampler": "masked", "kind": "masked", "custom": 3}


def test_run_info_groups_facts_by_capability_not_by_model_family():
    import attrs

    groups = {f.name: f.type for f in attrs.fields(RunInfo) if f.name in ("tokens", "stack", "images")}
    assert set(groups) == {"tokens", "stack", "images"}
    assert not {"gemma", "text", "unet", "dit", "diffusion"} & {w for f in attrs.fields(RunInfo) for w in f.name.split("_")}
    every = [f.name for cls in (TokenFacts, StackFacts, ImageFacts) for f in attrs.fields(cls)]
    assert len(every) == len(set(every)) == len(GROUPED)  # a fact's name says its group: set(...) by name
    info = RunInfo().set(checkpoint="c", length=8, blocks=2, cfg_mode="batched", custom=1)
    assert (info.checkpoint, info.tokens.length, info.stack.blocks, info.images.cfg_mode, info.extra) == (
        "c", 8, 2, "batched", {"custom": 1})


def test_a_text_run_fills_its_info_and_no_shipped_code_warns():
    seen = {}

    class Reader:
        name = "reader"

        @hookimpl
        def diffaccel_run_start(self, run):
            seen.update(length=run.info.tokens.length, sampler=run.info.tokens.sampler, checkpoint=run.info.checkpoint,
                        seeds=run.info.seeds)

    pipe = tiny_text_pipeline("masked")
    pipe.accelerator = Accelerator([Reader()], "text")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        pipe(length=8, steps=2, seed=5, batch=2, progress=False)
    assert seen == {"length": 8, "sampler": "masked", "checkpoint": pipe.name, "seeds": [5, 6]}


def test_states_are_reached_through_a_public_method():
    class S:
        name = "s"

        @hookimpl
        def diffaccel_new_state(self, run):
            return [run.branch]

    run, s = RunState(adapter="t", num_steps=1, batch_size=1), S()
    run.state(s)
    run.branch = "cond"
    run.state(s)
    assert run.states(s) == {"main": ["main"], "cond": ["cond"]}
    run.rename_branch("cond", "uncond")
    assert set(run.states("s")) == {"main", "uncond"}
    run.clear_states()
    assert run.states() == {}


def test_every_hook_has_its_rule_and_the_dispatcher_follows_it():
    specs = [n for n in vars(hookspecs) if n.startswith("diffaccel_")]
    assert sorted(specs) == sorted(hookspecs.RULES)

    class A:
        name = "a"

        @hookimpl
        def diffaccel_denoiser_output(self, run, output):
            return output + 1

        @hookimpl
        def diffaccel_commit(self, proposal):  # a subset of the arguments, by name
            return torch.tensor([True, False])

    class B:
        name = "b"

        @hookimpl
        def diffaccel_denoiser_output(self, output):
            return output * 10

        @hookimpl
        def diffaccel_commit(self, run, proposal):
            return torch.tensor([False, True])

        @hookimpl(wrapper=True)
        def diffaccel_finalize(self, run, final):
            result = yield  # after A, B's own and the built-in default
            final.order.append("b-after")
            return result

        @hookimpl
        def diffaccel_pre_step(self, run):
            return None

    class Final:
        def __init__(self):
            self.order = []

        def apply_default(self):
            self.order.append("default")

    run = RunState(adapter="t", num_steps=1, batch_size=1)
    acc = Accelerator([A(), B()], "t")
    assert acc.denoiser_output(run, torch.tensor(1.0)) == 20  # piped in config order: (1 + 1) * 10
    assert acc.commit(run, None).tolist() == [True, True]  # the union
    assert acc.pre_step(run) is None  # collected: nothing planned
    final = Final()
    with RunSequence(acc, run) as seq:
        seq.finalize(final)
    assert final.order == ["default", "b-after"]


def test_optional_adapter_abilities_are_protocols():
    text, unet = get_adapter("text"), get_adapter("unet")
    assert isinstance(text, TimesPartialSteps) and isinstance(text, MeasuresFluency) and isinstance(text, JudgesSamples)
    assert not isinstance(unet, TimesPartialSteps)
    assert isinstance(unet, WritesFiles) and not isinstance(text, WritesFiles)


def test_the_old_accelerator_method_names_warn_naming_the_new():
    run = RunState(adapter="t", num_steps=1, batch_size=1)
    acc = Accelerator([], "t")
    with pytest.warns(DeprecationWarning, match="use Accelerator.run_start"):
        acc.start_run(run)
    with pytest.warns(DeprecationWarning, match="use Accelerator.run_end"):
        acc.end_run(run)


@pytest.mark.parametrize("family", ["text", "unet", "dit"])
def test_the_handle_apply_returns_keeps_the_last_runs_report(family):
    """A pipeline called directly (a diffusers pipeline's output has no report) still gives its
    run's report: ``apply(...).last_report``, the same dict an adapter's output carries."""
    import diffaccel

    if family == "text":
        pipe = tiny_text_pipeline()
        call = [lambda: pipe(length=12, steps=4, seed=0, progress=False), lambda: pipe(length=12, steps=3, seed=1, progress=False)]
        strategies = [{"use": "swd"}]
    else:
        cfg = diffaccel.parse_config({"model": {"adapter": family, "checkpoint": "digits" if family == "unet" else "dit-digits"}})
        pipe = get_adapter(family).load(cfg)
        call = [lambda n=n: pipe(["digit 1"], num_inference_steps=n, output_type="pt") for n in (4, 3)]
        strategies = [{"use": "time-anchor", "warmup": 1}]
    handle = diffaccel.apply(pipe, strategies=strategies)
    assert handle.last_report is None
    with handle as same:
        assert same is pipe
        first = call[0]()
        report = handle.last_report
        call[1]()
    assert report["adapter"] == family and report["steps"] == report["steps_run"] == 4
    assert report["counters"]["layers_computed"] > 0
    if family == "text":
        assert first.report == report and "swd" in report["strategies"]
    else:
        assert not hasattr(first, "report") and "time-anchor" in report["strategies"]
    assert handle.last_report["steps"] == 3  # the last run's
