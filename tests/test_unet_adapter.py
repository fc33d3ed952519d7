"""The UNet adapter on tiny random diffusers pipelines: blocks, hook order, guidance branches,
bitwise identity without strategies, real skipping (loading, metrics, config errors, the
DeepCache peer: test_unet_commands.py)."""

from __future__ import annotations

import pytest
import torch

import diffaccel
from diffaccel import ConfigError, StepPlan, hookimpl
from diffaccel.adapters.diffusers.unet.adapter import UNetAdapter
from diffaccel.adapters.diffusers.unet.testing import digit_images, sd_images, tiny_digits_pipeline, tiny_sd_pipeline

STEPS = 4


@pytest.fixture(scope="module")
def sd(tiny_sd):
    return tiny_sd


@pytest.fixture(scope="module")
def digits(tiny_digits):
    return tiny_digits



# ---- strategies used by the tests ----------------------------------------------------------------

class Recorder:
    """Records every hook call; answers none."""

    name = "recorder"

    def __init__(self):
        self.events: list[tuple] = []

    @hookimpl
    def diffaccel_run_start(self, run):
        self.events.append(("run_start",))

    @hookimpl
    def diffaccel_pre_step(self, run):
        self.events.append(("pre_step", run.step, run.branch))

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        self.events.append(("layer", layer.name, run.branch))

    @hookimpl
    def diffaccel_denoiser_output(self, run, output):
        self.events.append(("denoiser_output", run.step, run.branch))

    @hookimpl
    def diffaccel_post_step(self, run, output):
        self.events.append(("post_step", run.step, run.branch, tuple(output.latents.shape)))

    @hookimpl
    def diffaccel_finalize(self, run, final):
        self.events.append(("finalize", run.step))

    @hookimpl
    def diffaccel_run_end(self, run):
        self.events.append(("run_end", run.batch_size))


class CacheOddSteps:
    """At odd steps, answers the listed blocks from its own per-branch cache (never computes them)."""

    name = "cache-odd"

    def __init__(self, blocks, shared: bool = False):
        self.blocks = set(blocks)
        self.shared = shared  # True: ignore the guidance branch (wrong on purpose)
        self.global_cache: dict = {}

    @hookimpl
    def diffaccel_new_state(self, run):
        return {}

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        if layer.name not in self.blocks:
            return None
        cache = self.global_cache if self.shared else run.state(self)
        if run.step % 2 == 1 and layer.name in cache:
            run.counters.cache_hits += 1
            return cache[layer.name]
        cache[layer.name] = out = layer.compute(hidden)
        return out


def _cfg(steps=STEPS, checkpoint="synthetic-sd-tiny", **options):
    from diffaccel.runtime.config import parse_config

    model = {"adapter": "unet", "checkpoint": checkpoint, "steps": steps, "prompts": ["a red cube"], **options}
    return parse_config({"model": model})


def count_calls(module: torch.nn.Module) -> list[int]:
    n = [0]
    module.register_forward_hook(lambda *_: n.__setitem__(0, n[0] + 1))
    return n


def no_instance_patches(pipe) -> bool:
    mods = [pipe.unet, *pipe.unet.modules()]
    return (not any("forward" in m.__dict__ for m in mods)
            and not {"step", "set_timesteps"} & set(pipe.scheduler.__dict__))


# ---- structure --------------------------------------------------------------------------------

def test_blocks_are_listed_from_the_unet_structure(sd):
    info = UNetAdapter.info(sd)
    assert info["layers"] == ["down_blocks.0", "down_blocks.1", "mid_block", "up_blocks.0", "up_blocks.1"]
    assert [b["type"] for b in info["blocks"]] == ["DownBlock2D", "CrossAttnDownBlock2D", "UNetMidBlock2DCrossAttn",
                                                   "CrossAttnUpBlock2D", "UpBlock2D"]
    assert [b["cross_attention"] for b in info["blocks"]] == [False, True, True, True, False]
    no_mid = tiny_sd_pipeline(mid=False)
    assert UNetAdapter.info(no_mid)["layers"] == ["down_blocks.0", "down_blocks.1", "up_blocks.0", "up_blocks.1"]


def test_accepts_unet_pipelines_only(sd, digits, tiny_text_pipe):
    from diffaccel.runtime.adapters_registry import adapter_for

    assert UNetAdapter.accepts(sd) and UNetAdapter.accepts(digits)
    assert not UNetAdapter.accepts(tiny_text_pipe) and not UNetAdapter.accepts(object())
    assert adapter_for(sd) is UNetAdapter


# ---- hook order ---------------------------------------------------------------------------------

def test_hook_order_batched_guidance(sd):
    rec = Recorder()
    with diffaccel.apply(sd, strategies=[rec]):
        sd_images(sd, steps=3)
    blocks = UNetAdapter.info(sd)["layers"]
    expected = [("run_start",)]
    for step in range(3):
        expected += [("pre_step", step, "main")] + [("layer", b, "main") for b in blocks]
        expected += [("denoiser_output", step, "main"), ("post_step", step, "main", (1, 4, 16, 16))]
    expected += [("finalize", 2), ("run_end", 1)]
    assert rec.events == expected


def test_hook_order_unbatched_guidance():
    digits = tiny_digits_pipeline()
    rec = Recorder()
    with diffaccel.apply(digits, strategies=[rec]):
        digit_images(digits, batched=False, steps=2)
    blocks = UNetAdapter.info(digits)["layers"]
    expected = [("run_start",)]
    for step in range(2):
        for branch in ("uncond", "cond"):
            expected += [("pre_step", step, branch)] + [("layer", b, branch) for b in blocks]
            expected += [("denoiser_output", step, branch)]
        expected += [("post_step", step, b, (2, 1, 16, 16)) for b in ("uncond", "cond")]
    expected += [("finalize", 1), ("run_end", 2)]
    # the first call of the first run was seen before unbatched guidance was recognised
    first = [e for e in rec.events if e[0] in ("pre_step", "layer", "denoiser_output")][: 2 + len(blocks)]
    assert {e[-1] for e in first} == {"main"}
    fixed = [e if e not in first else (*e[:-1], "uncond") for e in rec.events]
    assert fixed == expected
    rec.events.clear()
    with diffaccel.apply(digits, strategies=[rec]):  # second run: recognised from the start
        digit_images(digits, batched=False, steps=2)
    assert rec.events == expected


def test_one_run_state_per_pipeline_call(sd):
    rec = Recorder()
    with diffaccel.apply(sd, strategies=[rec]):
        sd_images(sd, steps=2)
        sd_images(sd, steps=3)
    assert [e[0] for e in rec.events].count("run_start") == 2
    assert [e for e in rec.events if e[0] == "finalize"] == [("finalize", 1), ("finalize", 2)]


# ---- identity and removal -----------------------------------------------------------------------

class NoOp:
    """Implements every hook and changes nothing."""

    name = "noop"

    @hookimpl
    def diffaccel_pre_step(self, run):
        return None

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        return None

    @hookimpl
    def diffaccel_denoiser_output(self, run, output):
        return None

    @hookimpl
    def diffaccel_post_step(self, run, output):
        return None


def test_bitwise_identical_without_strategies_and_after_removal():
    pipe = tiny_sd_pipeline()
    untouched = sd_images(pipe)
    with diffaccel.apply(pipe, strategies=[]):
        hooked = sd_images(pipe)
    with diffaccel.apply(pipe, strategies=[NoOp()]):
        noop = sd_images(pipe)
    with diffaccel.apply(pipe, strategies=[CacheOddSteps(["mid_block", "up_blocks.0"])]):
        changed = sd_images(pipe)
    after = sd_images(pipe)
    assert torch.equal(untouched, hooked) and torch.equal(untouched, noop) and torch.equal(untouched, after)
    assert not torch.equal(untouched, changed)  # the comparison can fail
    assert no_instance_patches(pipe)


def test_removal_after_an_error_restores_the_pipeline():
    pipe = tiny_sd_pipeline()
    before = sd_images(pipe)
    ended = []

    class Boom:
        name = "boom"

        @hookimpl
        def diffaccel_layer_output(self, run, layer, hidden):
            if run.step == 1:
                raise RuntimeError("boom")

        @hookimpl
        def diffaccel_run_end(self, run):
            ended.append(run.step)

    with pytest.raises(diffaccel.StrategyError, match="'boom'.*RuntimeError in layer_output at step 1: boom") as err:
        with diffaccel.apply(pipe, strategies=[Boom()]):
            sd_images(pipe)
    assert isinstance(err.value.__cause__, RuntimeError)
    assert ended == [1]  # run_end also after an error
    assert no_instance_patches(pipe) and torch.equal(before, sd_images(pipe))


# ---- strategies really skip ---------------------------------------------------------------------

def test_a_skipped_block_is_not_called():
    pipe = tiny_sd_pipeline()
    mid = count_calls(pipe.unet.mid_block.resnets[0])
    up0 = count_calls(pipe.unet.up_blocks[0].resnets[0])
    down0 = count_calls(pipe.unet.down_blocks[0].resnets[0])
    with diffaccel.apply(pipe, strategies=[CacheOddSteps(["mid_block", "up_blocks.0"])]):
        out = UNetAdapter.run(pipe, _cfg(steps=6), seed=0, progress=False)
    # steps 1, 3, 5 come from the cache
    assert (mid[0], up0[0], down0[0]) == (3, 3, 6)
    c = out.report["counters"]
    assert c["layers_skipped"] == 6 and c["cache_hits"] == 6 and c["layers_computed"] == 6 * 5 - 6
    assert c["positions_total"] == 30 * 2 and c["fraction_computed"] == pytest.approx(24 / 30)


class CacheModules(CacheOddSteps):
    """CacheOddSteps at the finer granularity: asks the adapter to hook inner modules."""

    name = "cache-modules"
    seen: list

    @hookimpl
    def diffaccel_hooked_modules(self, available):
        self.available = list(available)
        return sorted(self.blocks)


def test_inner_modules_are_listed_and_hooked_only_on_request():
    pipe = tiny_sd_pipeline()
    names = UNetAdapter.info(pipe)["modules"]
    # 2 resnets + 1 downsampler; 2 resnets + 2 attentions; mid: 2 resnets + 1 attention; up: 3 + 3 + 1 upsampler, 3
    assert names[:3] == ["down_blocks.0.resnets.0", "down_blocks.0.resnets.1", "down_blocks.0.downsamplers.0"]
    assert "mid_block.attentions.0" in names and "up_blocks.0.upsamplers.0" in names
    assert len(names) == 3 + 4 + 3 + 7 + 3
    kinds = {}
    with diffaccel.apply(pipe, strategies=[CacheOddSteps(["mid_block"])]):
        assert not any("forward" in m.__dict__ for m in pipe.unet.mid_block.attentions)  # not asked: untouched
    strategy = CacheModules(["mid_block.attentions.0", "up_blocks.0.resnets.1"])
    attn_conv = count_calls(pipe.unet.mid_block.attentions[0].proj_in)
    res_conv = count_calls(pipe.unet.up_blocks[0].resnets[1].conv1)
    other = count_calls(pipe.unet.up_blocks[0].resnets[0].conv1)

    class Kinds:
        name = "kinds"

        @hookimpl
        def diffaccel_layer_output(self, run, layer, hidden):
            kinds[layer.name] = layer.kind

    with diffaccel.apply(pipe, strategies=[Kinds(), strategy]):
        out = UNetAdapter.run(pipe, _cfg(steps=6), seed=0, progress=False)
    assert strategy.available == names
    assert kinds["mid_block.attentions.0"] == "attention" and kinds["up_blocks.0.resnets.1"] == "resnet"
    assert out.report["counters"]["cache_hits"] == 6
    assert (attn_conv[0], res_conv[0], other[0]) == (3, 3, 6)  # the skipped modules' code never ran
    assert no_instance_patches(pipe)


def test_asking_for_a_module_the_unet_lacks_is_a_clear_error():
    pipe = tiny_sd_pipeline()
    with pytest.raises(ConfigError, match="asks for inner module 'mid_block.resnets.9'.*it has: down_blocks.0.resnets.0"):
        with diffaccel.apply(pipe, strategies=[CacheModules(["mid_block.resnets.9"])]):
            pass
    assert no_instance_patches(pipe)


def test_step_plan_skip_and_reuse_step():
    pipe = tiny_sd_pipeline()
    mid = count_calls(pipe.unet.mid_block.resnets[0])
    conv_in = count_calls(pipe.unet.conv_in)

    class Planner:
        name = "planner"

        @hookimpl
        def diffaccel_pre_step(self, run):
            if run.step in (1, 2):
                return StepPlan(skip=frozenset({"mid_block"}))
            if run.step == 4:
                return StepPlan(reuse_step=True)
            return None

    with diffaccel.apply(pipe, strategies=[Planner()]):
        out = UNetAdapter.run(pipe, _cfg(steps=5), seed=0, progress=False)
    assert mid[0] == 2 and conv_in[0] == 4
    c = out.report["counters"]
    assert c["steps_reused"] == 1 and c["layers_skipped"] == 2


def test_denoiser_output_replacement_and_finalize(digits):
    class Zero:
        name = "zero"

        @hookimpl
        def diffaccel_finalize(self, run, final):
            final.latents = torch.zeros_like(final.draft)

    with diffaccel.apply(digits, strategies=[Zero()]):
        img = digit_images(digits)
    assert torch.equal(img, torch.full_like(img, 0.5))  # latents 0 decode to mid grey

    class Halve:
        name = "halve"

        @hookimpl
        def diffaccel_denoiser_output(self, run, output):
            return output * 0.5

    plain = digit_images(digits)
    with diffaccel.apply(digits, strategies=[Halve()]):
        halved = digit_images(digits)
    assert not torch.allclose(plain, halved)


# ---- guidance branches --------------------------------------------------------------------------

def test_guidance_branches_keep_their_own_state():
    pipe = tiny_digits_pipeline()
    blocks = ["down_blocks.1", "up_blocks.0"]
    batched = digit_images(pipe, batched=True, steps=6)
    unbatched = digit_images(pipe, batched=False, steps=6)
    assert torch.allclose(batched, unbatched, atol=1e-4)
    results = {}
    for name, batched_cfg, shared in [("b", True, False), ("u", False, False), ("u2", False, False), ("shared", False, True)]:
        with diffaccel.apply(pipe, strategies=[CacheOddSteps(blocks, shared=shared)]):
            results[name] = digit_images(pipe, batched=batched_cfg, steps=6)
    assert not torch.allclose(results["b"], batched, atol=1e-3)  # the cache changes the images
    assert torch.allclose(results["b"], results["u"], atol=1e-4)  # per-branch state: same result
    assert torch.equal(results["u"], results["u2"])
    assert not torch.allclose(results["b"], results["shared"], atol=1e-3)  # one cache for both branches: wrong


def test_run_info_and_batch_size(digits):
    seen = {}

    class Peek:
        name = "peek"

        @hookimpl
        def diffaccel_run_end(self, run):
            seen.update(batch=run.batch_size, mode=run.info.images.cfg_mode, steps=run.num_steps, layers=run.info.layers)

    with diffaccel.apply(digits, strategies=[Peek()]):
        digit_images(digits, batched=True, steps=3, prompts=("1", "2", "3"))
    assert seen["batch"] == 3 and seen["mode"] == "batched" and seen["steps"] == 3
    with diffaccel.apply(digits, strategies=[Peek()]):
        digit_images(digits, batched=True, steps=3, guidance=1.0, prompts=("1", "2", "3"))
    assert seen["batch"] == 3 and seen["mode"] == "none"


def test_quality_of_a_resample_from_parts_equals_quality_on_its_outputs():
    """The bench's intervals pool per-seed parts (``PoolsQuality``): on seeds drawn with repeats
    the pooled figures equal ``quality`` on those outputs themselves."""
    from diffaccel.contract.adapter import PoolsQuality
    from diffaccel.adapters.diffusers.pipelines import ImageOutput

    g = torch.Generator().manual_seed(0)

    def out(labels):
        return ImageOutput(images=torch.rand(3, 1, 16, 16, generator=g), prompts=[""] * 3, seeds=[0, 1, 2], labels=labels, report={})

    for labels in ([1, 7, None], None):
        base, ent = [out(labels) for _ in range(4)], [out(labels) for _ in range(4)]
        parts = UNetAdapter.quality_parts(base, ent)
        idx = [2, 0, 2, 3]
        want = UNetAdapter.quality([base[i] for i in idx], [ent[i] for i in idx])
        assert UNetAdapter.quality_of_parts([parts[i] for i in idx]) == pytest.approx(want)
        assert ("cond_acc" in want) == (labels is not None)
    assert isinstance(UNetAdapter, PoolsQuality)
