"""The core's one step sequence (``diffaccel.runtime.sequence``) on every adapter: each text sampler gets
the lazy top-1 and calls ``diffaccel_commit``, ``run.stop`` ends a run everywhere, the null
accelerator is public and a run without ``apply`` goes through it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from diffaccel import hookimpl
from diffaccel.runtime.accelerator import Accelerator
from diffaccel.adapters.text.sampling.pipeline import TextStepOutput
from diffaccel.runtime.sequence import NULL, NullAccelerator, RunSequence, StepModel
from diffaccel.contract.state import RunState
from diffaccel.adapters.text.testing import tiny_text_pipeline
from diffaccel.adapters.diffusers.unet.testing import tiny_digits_pipeline

HERE = Path(__file__).resolve().parent


def _sibling(name: str):
    """A helper module of another test file (``--import-mode=importlib`` keeps tests/ off sys.path)."""
    spec = importlib.util.spec_from_file_location(f"_seq_{name}", HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Watcher:
    """Reads only ``tokens`` at each step, commits the first candidate of each row at step 1, and
    reads the top-1 at step 2 only."""

    name = "watcher"

    def __init__(self, stop_at: int | None = None):
        self.stop_at = stop_at
        self.unread: list[bool] = []  # per step: the top-1 was still lazy when post_step came
        self.top1_ok: list[bool] = []
        self.commits: list[int] = []
        self.committed: dict[tuple[int, int], int] = {}

    @hookimpl
    def diffaccel_commit(self, run, proposal):
        self.commits.append(run.step)
        if run.step != 1:
            return None
        mask = torch.zeros_like(proposal.candidates)
        for r in range(mask.shape[0]):
            free = proposal.candidates[r].nonzero().flatten()
            if len(free):
                p = int(free[-1])
                mask[r, p] = True
                self.committed[(r, p)] = int(proposal.tokens[r, p])
        return mask

    @hookimpl
    def diffaccel_post_step(self, run, output):
        if isinstance(output, TextStepOutput):
            self.unread.append(output._top1_prob is None)
            if run.step == 2:
                want_prob = output.logits.float().softmax(-1).amax(-1)
                self.top1_ok.append(torch.allclose(output.top1_prob, want_prob, atol=1e-5))
        if self.stop_at is not None and run.step == self.stop_at:
            run.stop = True


def _hooked(pipe, strategies, **kw):
    pipe.accelerator = Accelerator(strategies, "text")
    try:
        return pipe(progress=False, **kw)
    finally:
        pipe.accelerator = None


def _llama_pipe(tmp_path):
    from diffaccel.adapters.text.families.dispatch import load_pipeline

    path, _ = _sibling("test_llama_denoiser").tiny_decoder(tmp_path)
    return load_pipeline(str(path))


def _gemma_pipe(tmp_path):
    from diffaccel.adapters.text.families.diffusion_gemma.build import build
    from diffaccel.adapters.text.families.dispatch import load_pipeline

    return load_pipeline(str(build(tmp_path / "dg", "tiny", seed=0)))


SAMPLERS = {
    "masked": (lambda tmp: tiny_text_pipeline("masked"), dict(length=16, steps=6, batch=2)),
    "continuous": (lambda tmp: tiny_text_pipeline("continuous"), dict(length=16, steps=6, batch=2, sampler="ddim")),
    "llama": (_llama_pipe, dict(length=12, steps=6, batch=2)),
    "gemma-block": (_gemma_pipe, dict(length=16, steps=4, batch=1)),
}


@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_every_text_sampler_has_the_lazy_top1_and_commits(sampler, tmp_path):
    make, kw = SAMPLERS[sampler]
    pipe = make(tmp_path)
    w = Watcher()
    out = _hooked(pipe, [w], seed=1, **kw)
    steps = out.report["steps_run"]
    assert w.commits == list(range(steps))  # commit is asked at every step
    assert w.unread == [True] * steps  # the top-1 is computed only when read ...
    assert w.top1_ok == [True]  # ... and then it is the logits' own
    assert w.committed
    P = out.prompt_lengths[0] if sampler == "gemma-block" else 0
    for (r, p), token in w.committed.items():  # a committed position keeps its token to the end
        assert int(out.tokens[r, P + p]) == token


@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_run_stop_ends_a_text_run(sampler, tmp_path):
    make, kw = SAMPLERS[sampler]
    pipe = make(tmp_path)
    out = _hooked(pipe, [Watcher(stop_at=2)], seed=1, **kw)
    if sampler == "gemma-block":  # the block sampler's stop ends the active block; the next starts afresh
        assert out.report["blocks_run"] == 1 and out.report["steps_run"] == 3
    else:
        assert out.report["steps_run"] == 3


class Stopper:
    name = "stopper"

    def __init__(self, at: int):
        self.at, self.seen, self.finals = at, [], []

    @hookimpl
    def diffaccel_post_step(self, run, output):
        self.seen.append(run.step)
        if run.step == self.at:
            run.stop = True
            self.x0 = output.pred_original.clone()

    @hookimpl
    def diffaccel_finalize(self, run, final):
        self.finals.append(final.draft)


def _diffusers(kind):
    if kind == "unet":
        return tiny_digits_pipeline(), ["digit 3", "digit 5"]
    from diffaccel.adapters.diffusers.dit.adapter import load_checkpoint

    return load_checkpoint("synthetic-dit-tiny"), ["digit 3", "7"]


@pytest.mark.parametrize("kind", ["unet", "dit"])
def test_run_stop_ends_a_diffusers_run_from_its_clean_estimate(kind):
    from diffaccel.adapters.diffusers.hooks import attach, detach, session_of
    from diffaccel.adapters.diffusers.dit.hooks import DiTSession
    from diffaccel.adapters.diffusers.unet.hooks import Session as UNetSession

    pipe, prompts = _diffusers(kind)
    pipe.set_progress_bar_config(disable=True)
    s = Stopper(at=2)
    accel = Accelerator([s], kind)
    attach(pipe, accel, UNetSession if kind == "unet" else DiTSession)
    first = pipe.unet.down_blocks[0] if kind == "unet" else pipe.transformer.transformer_blocks[0]
    blocks = []
    handle = first.register_forward_pre_hook(lambda m, a: blocks.append(1))
    try:
        gens = [torch.Generator().manual_seed(i) for i in range(2)]
        images = pipe(prompts, num_inference_steps=8, guidance_scale=2.0, generator=gens, output_type="pt").images
        run = session_of(pipe).last_run
    finally:
        handle.remove()
        detach(pipe)
    assert s.seen == [0, 1, 2]  # no post_step after the stop
    assert run.report()["steps_run"] == 3
    assert len(s.finals) == 1 and torch.equal(s.finals[0], s.x0)  # finalised from step 2's clean estimate
    assert len(blocks) == 3  # the denoiser ran at three steps only (guidance batched: one call a step)
    assert torch.isfinite(images).all()
    # the next run on the same pipeline is whole again
    plain = pipe(prompts, num_inference_steps=8, guidance_scale=2.0,
                 generator=[torch.Generator().manual_seed(i) for i in range(2)], output_type="pt").images
    assert plain.shape == images.shape and not torch.equal(plain, images)


def test_the_null_accelerator_is_public_and_runs_an_unapplied_pipeline(monkeypatch):
    assert isinstance(NULL, NullAccelerator)
    seen = []
    orig = RunSequence.__init__

    def spy(self, accelerator, run):
        seen.append(accelerator)
        orig(self, accelerator, run)

    monkeypatch.setattr(RunSequence, "__init__", spy)
    pipe = tiny_text_pipeline("masked")
    pipe(length=8, steps=2, progress=False)
    assert seen == [None]  # RunSequence turns it into NULL


class Flat(StepModel):
    def __init__(self, value):
        self.value, self.computed = value, 0

    def compute(self):
        self.computed += 1
        return self.value


def test_a_sequence_reuses_a_step_only_when_the_plan_says_so():
    from diffaccel.contract.state import StepPlan

    class Reuser:
        name = "reuser"

        @hookimpl
        def diffaccel_pre_step(self, run):
            return StepPlan(reuse_step=run.step == 1)

    class Step(Flat):
        def reuse(self):
            return torch.full((2,), 7.0)

    run = RunState(adapter="t", num_steps=2, batch_size=1)
    step = Step(torch.ones(2))
    with RunSequence(Accelerator([Reuser()], "t"), run) as seq:
        outs = []
        for i in range(2):
            run.step = i
            outs.append(seq.denoise(step))
    assert step.computed == 1 and run.counters.steps_reused == 1
    assert torch.equal(outs[1], torch.full((2,), 7.0))
