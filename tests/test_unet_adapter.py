"""The UNet adapter on tiny random diffusers pipelines: blocks, hook order, guidance branches,
bitwise identity without strategies, real skipping, loading by path, metrics, config errors."""

from __future__ import annotations

import importlib.util

import attrs
import numpy as np
import pytest
import torch

import diffaccel
from diffaccel import ConfigError, DiffaccelError, ModelLoadError, StepPlan, hookimpl, load_config
from diffaccel.adapters.unet import hooks
from diffaccel.adapters.unet.adapter import UNetAdapter
from diffaccel.adapters.digits import class_accuracy, digit_label
from diffaccel.adapters.unet.metrics import psnr, psnr_per_image, ssim
from diffaccel.adapters.unet.pipeline import DigitsPipeline, char_vocab
from diffaccel.cli import main
from diffaccel.adapters.unet.testing import tiny_digits_pipeline

STEPS = 4


# ---- tiny pipelines, built the way diffusers' own tests build theirs ----------------------------

def tiny_clip(hidden: int, max_len: int):
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    return CLIPTextModel(CLIPTextConfig(vocab_size=len(char_vocab()), hidden_size=hidden, intermediate_size=37,
                                        num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=max_len,
                                        bos_token_id=0, eos_token_id=1, pad_token_id=1)).eval()


def tiny_sd(mid: bool = True):
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=2, sample_size=16, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32, norm_num_groups=8, mid_block_type="UNetMidBlock2DCrossAttn" if mid else None,
    ).eval()
    torch.manual_seed(0)
    vae = AutoencoderKL(block_out_channels=[32, 64], in_channels=3, out_channels=3, latent_channels=4, norm_num_groups=8,
                        down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2).eval()
    sched = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                          set_alpha_to_one=False, steps_offset=1)
    from transformers import CLIPTokenizer

    tok = CLIPTokenizer(vocab=char_vocab(), merges=[], model_max_length=77)
    return StableDiffusionPipeline(vae=vae, text_encoder=tiny_clip(32, 77), tokenizer=tok, unet=unet, scheduler=sched,
                                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)


def tiny_digits():
    return tiny_digits_pipeline()


@pytest.fixture(scope="module")
def sd():
    return tiny_sd()


@pytest.fixture(scope="module")
def digits():
    return tiny_digits()


def sd_images(pipe, seed=0, steps=STEPS, guidance=7.5, prompt="a red cube"):
    return pipe([prompt], num_inference_steps=steps, guidance_scale=guidance, output_type="pt",
                generator=[torch.Generator().manual_seed(seed)]).images


def digit_images(pipe, batched=True, steps=STEPS, guidance=2.0, prompts=("digit 3", "7")):
    gens = [torch.Generator().manual_seed(i) for i in range(len(prompts))]
    pipe.set_progress_bar_config(disable=True)
    return pipe(list(prompts), num_inference_steps=steps, guidance_scale=guidance, generator=gens, output_type="pt",
                cfg_batched=batched).images


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
    no_mid = tiny_sd(mid=False)
    assert UNetAdapter.info(no_mid)["layers"] == ["down_blocks.0", "down_blocks.1", "up_blocks.0", "up_blocks.1"]


def test_accepts_unet_pipelines_only(sd, digits, tiny_text_pipe):
    from diffaccel.adapters_registry import adapter_for

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
    digits = tiny_digits()
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
    pipe = tiny_sd()
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
    pipe = tiny_sd()
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
    pipe = tiny_sd()
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
    pipe = tiny_sd()
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
    pipe = tiny_sd()
    with pytest.raises(ConfigError, match="asks for inner module 'mid_block.resnets.9'.*it has: down_blocks.0.resnets.0"):
        with diffaccel.apply(pipe, strategies=[CacheModules(["mid_block.resnets.9"])]):
            pass
    assert no_instance_patches(pipe)


def test_step_plan_skip_and_reuse_step():
    pipe = tiny_sd()
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
    pipe = tiny_digits()
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
            seen.update(batch=run.batch_size, mode=run.info.cfg_mode, steps=run.num_steps, layers=run.info.layers)

    with diffaccel.apply(digits, strategies=[Peek()]):
        digit_images(digits, batched=True, steps=3, prompts=("1", "2", "3"))
    assert seen["batch"] == 3 and seen["mode"] == "batched" and seen["steps"] == 3
    with diffaccel.apply(digits, strategies=[Peek()]):
        digit_images(digits, batched=True, steps=3, guidance=1.0, prompts=("1", "2", "3"))
    assert seen["batch"] == 3 and seen["mode"] == "none"


# ---- loading, writing, CLI ------------------------------------------------------------------------

def _cfg(steps=STEPS, checkpoint="synthetic-sd-tiny", **options):
    from diffaccel.config import parse_config

    model = {"adapter": "unet", "checkpoint": checkpoint, "steps": steps, "prompts": ["a red cube"], **options}
    return parse_config({"model": model})


def test_save_load_by_path_through_the_cli(tmp_path, capsys):
    from PIL import Image

    pipe = tiny_sd()
    pipe.save_pretrained(tmp_path / "sd")
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(f'[model]\nadapter = "unet"\ncheckpoint = "{tmp_path / "sd"}"\nsteps = 3\nbatch = 2\n'
                   f'guidance_scale = 5.0\nprompts = ["a red cube", "a blue ball"]\ngrid_columns = 2\n')
    out = tmp_path / "x.png"
    assert main(["generate", str(cfg), "--out", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "layers computed 15, skipped 0" in err and str(out) in err
    img = Image.open(out)
    assert img.size == (64, 32) and img.mode == "RGB"  # two 32x32 images side by side
    assert not list(tmp_path.glob("*.partial"))
    # the image is what the in-memory pipeline makes for the same seeds
    direct = UNetAdapter.run(pipe, load_config(cfg), seed=0, progress=False).images
    grid = torch.cat(list(direct), dim=2)
    pixels = torch.from_numpy(np.asarray(img, dtype=np.float32)).permute(2, 0, 1) / 255
    assert (pixels - grid).abs().max() <= 1 / 255 + 1e-6


def test_missing_checkpoints_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(ModelLoadError, match="no-such-org/no-such-model"):
        UNetAdapter.load(_cfg(checkpoint="no-such-org/no-such-model"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no model_index.json"):
        UNetAdapter.load(_cfg(checkpoint=str(tmp_path / "empty")))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[model]\nadapter = "unet"\ncheckpoint = "{tmp_path / "nope"}"\n')
    assert main(["generate", str(cfg), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such model folder" in err


def test_write_needs_an_out_path(sd):
    out = UNetAdapter.run(sd, _cfg(steps=2), seed=0, progress=False)
    with pytest.raises(DiffaccelError, match="--out"):
        UNetAdapter.write([out], None)


def test_rows_are_the_same_alone_or_in_a_batch():
    pipe = tiny_digits()
    both = digit_images(pipe, prompts=("digit 3", "7"))
    alone = digit_images(pipe, prompts=("digit 3",))
    assert torch.allclose(both[:1], alone, atol=1e-5)


# ---- metrics ------------------------------------------------------------------------------------

def test_psnr_and_ssim_sanity():
    gen = torch.Generator().manual_seed(0)
    a = torch.rand(3, 3, 24, 24, generator=gen)
    assert psnr(a, a) == float("inf") and ssim(a, a) == pytest.approx(1.0)
    b = (a + 0.1).clamp(0, 1)
    assert 10 < psnr(a, b) < 40 and 0 < ssim(a, b) < 1
    assert psnr_per_image(torch.zeros(1, 1, 8, 8), torch.full((1, 1, 8, 8), 0.1)) == [pytest.approx(20.0)]
    noise = torch.rand(3, 3, 24, 24, generator=gen)
    assert ssim(a, noise) < 0.2 < ssim(a, b)
    assert ssim(a, b) == pytest.approx(ssim(b, a))


def test_quality_reports_psnr_ssim_and_conditioning_accuracy(digits):
    cfg = _cfg(steps=2, checkpoint="digits", prompts=["digit 1", "2"], guidance_scale=2.0)
    cfg = attrs.evolve(cfg, model=attrs.evolve(cfg.model, batch=2))
    base = UNetAdapter.run(digits, cfg, seed=0, progress=False)
    assert base.labels == [1, 2]
    q = UNetAdapter.quality([base], [base])
    assert q["psnr"] == float("inf") and q["ssim"] == pytest.approx(1.0)
    # cond_acc is the classifier's agreement with the prompts' labels, computed on these images
    from diffaccel.adapters.unet.digits import classify

    assert q["cond_acc"] == pytest.approx(class_accuracy(classify(base.images), [1, 2])["overall"])


def test_conditioning_accuracy_per_class():
    acc = class_accuracy([1, 2, 3, 3], [1, 2, 3, 4])
    assert acc["overall"] == 0.75 and acc["3"] == 1.0 and acc["4"] == 0.0 and "5" not in acc
    assert [digit_label(p) for p in ("digit 7", "7", " Digit 0 ", "a cat", "")] == [7, 7, 0, None, None]


# ---- config errors ------------------------------------------------------------------------------

UNET = '[model]\nadapter = "unet"\ncheckpoint = "synthetic-sd-tiny"\n'
CASES = [
    ("size-zero", UNET + "size = 0\n", "[model]: key 'size': must be positive, got 0"),
    ("guidance-negative", UNET + "guidance_scale = -1\n", "[model]: key 'guidance_scale': must be in [0.0, inf), got -1.0"),
    ("scheduler", UNET + 'scheduler = "euler"\n', "[model]: key 'scheduler': must be one of 'ddim', 'checkpoint', got 'euler'"),
    ("prompts", UNET + "prompts = [1]\n", "[model]: key 'prompts': expected a list of strings, got [1]"),
    ("grid-columns", UNET + "grid_columns = 0\n", "[model]: key 'grid_columns': must be positive, got 0"),
    ("eta", UNET + "eta = 2\n", "[model]: key 'eta': must be in [0.0, 1.0], got 2.0"),
    ("unknown", UNET + "guidance = 2\n", "[model]: unknown key 'guidance'; allowed keys:"),
    ("text-key", UNET + "length = 3\n", "[model]: unknown key 'length'"),
    ("peer-unknown", UNET + '[[peer]]\nuse = "tomesd"\n', "[[peer]] #1: unknown peer 'tomesd'; adapter 'unet' offers: deepcache"),
    ("peer-no-use", UNET + "[[peer]]\ncache_interval = 3\n", "[[peer]] #1: missing key 'use' (the peer name)"),
    ("peer-key", UNET + '[[peer]]\nuse = "deepcache"\ninterval = 3\n', "[[peer]] #1 (deepcache): unknown key 'interval'; allowed keys: cache_branch_id, cache_interval, name"),
    ("peer-range", UNET + '[[peer]]\nuse = "deepcache"\ncache_interval = 0\n', "[[peer]] #1 (deepcache): key 'cache_interval': must be positive, got 0"),
    ("peer-table", UNET + '[peer]\nuse = "deepcache"\n', "'peer' must be an array of tables, written [[peer]]"),
    ("peer-text", '[model]\nadapter = "text"\n[[peer]]\nuse = "deepcache"\n', "[[peer]] #1: unknown peer 'deepcache'; adapter 'text' offers: steps"),
]


@pytest.mark.parametrize("name,text,expected", CASES, ids=[c[0] for c in CASES])
def test_unet_config_errors(tmp_path, name, text, expected):
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(path)) and expected in msg, msg


def test_size_must_fit_the_unet(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(UNET + "size = 17\n")
    with pytest.raises(ConfigError, match=r"key 'size': 17 is not a multiple of 2, the model's downsampling; try 18"):
        UNetAdapter.load(load_config(path))


def test_shipped_configs_decode():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "configs"
    med = load_config(root / "sd-medium.toml")
    assert med.model.checkpoint == "synthetic-sd-medium" and med.model.steps == 50
    assert [(p.name, p.config.cache_interval, p.config.cache_branch_id) for p in med.peers] == [("deepcache", 3, 0)]
    assert UNetAdapter.peer_name(med.peers[0]) == "deepcache-i3"
    dig = load_config(root / "digits.toml")
    assert dig.model.checkpoint == "digits" and len(dig.options.prompts) == 10


# ---- DeepCache, the peer ---------------------------------------------------------------------------

needs_deepcache = pytest.mark.skipif(importlib.util.find_spec("DeepCache") is None, reason="DeepCache not installed")


@needs_deepcache
def test_deepcache_peer_changes_images_and_leaves_no_trace():
    from diffaccel.config import PeerEntry
    from diffaccel.adapters.unet.adapter import DeepCachePeer

    pipe = tiny_sd()
    mid = count_calls(pipe.unet.mid_block.resnets[0])
    before = sd_images(pipe, steps=6)
    mid[0] = 0
    with UNetAdapter.peer_context(pipe, DeepCachePeer(cache_interval=3)):
        cached = sd_images(pipe, steps=6)
    assert mid[0] == 2  # full UNet at steps 0 and 3 only
    assert not torch.equal(before, cached)
    assert no_instance_patches(pipe) and torch.equal(before, sd_images(pipe, steps=6))
    with pytest.raises(DiffaccelError, match="cache_branch_id 9"):
        with UNetAdapter.peer_context(pipe, DeepCachePeer(cache_branch_id=9)):
            pass
    assert UNetAdapter.peer_name(PeerEntry(name="deepcache", index=1, config=DeepCachePeer(cache_branch_id=1))) == "deepcache-i3-b1"


@needs_deepcache
def test_bench_runs_the_peer_interleaved(tmp_path):
    import json

    from diffaccel.bench import format_table, run_bench

    cfg = tmp_path / "tiny.toml"
    cfg.write_text(UNET + 'steps = 6\nprompts = ["a red cube"]\n[[peer]]\nuse = "deepcache"\ncache_interval = 2\n')
    result = run_bench([str(cfg)], seeds=2, progress=False, json_path=str(tmp_path / "b.json"))
    names = [e["name"] for e in result["entries"]]
    assert names == ["baseline", "deepcache-i2"]
    peer = result["entries"][1]
    assert peer["fraction_computed"] is None and peer["peer"] == {"use": "deepcache", "cache_interval": 2, "cache_branch_id": 0, "name": None}
    assert peer["quality"]["psnr"] < float("inf") and result["entries"][0]["quality"]["psnr"] == float("inf")
    table = format_table(result)
    assert "deepcache-i2" in table and "psnr" in table
    assert json.loads((tmp_path / "b.json").read_text())["entries"][1]["name"] == "deepcache-i2"


# ---- the shipped digits model ----------------------------------------------------------------------

def test_shipped_digits_model_is_small_safetensors_and_generates(tmp_path):
    from PIL import Image

    from diffaccel.adapters.unet.adapter import ASSETS

    files = list((ASSETS / "digits").rglob("*"))
    weights = [f for f in files if f.suffix == ".safetensors"]
    assert {f.parent.name for f in weights} == {"unet", "text_encoder"}
    assert sum(f.stat().st_size for f in weights) <= 20 * 2**20
    assert not [f for f in files if f.suffix in (".bin", ".pt", ".pth", ".ckpt")]
    from pathlib import Path

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "digits.toml")
    cfg = attrs.evolve(cfg, model=attrs.evolve(cfg.model, steps=10, batch=4))
    pipe = UNetAdapter.load(cfg)
    assert isinstance(pipe, DigitsPipeline) and 1.4e6 < UNetAdapter.info(pipe)["parameters"] < 2.0e6
    out = UNetAdapter.run(pipe, cfg, seed=0, progress=False)
    assert out.images.shape == (4, 1, 32, 32) and out.labels == [0, 1, 2, 3]
    path = UNetAdapter.write([out], str(tmp_path / "grid.png"))
    assert Image.open(path).size == (4 * 32 * 4, 32 * 4)  # grid_scale 4
    # a trained model draws strokes on a dark background, not noise
    img = out.images
    assert img.mean() < 0.45 and (img > 0.5).float().mean() > 0.05


def test_check_lists_peers_as_bench_only(capsys):
    assert main(["check", "configs/sd-medium.toml"]) == 0
    assert "peers (bench only): deepcache" in capsys.readouterr().out


def test_overhead_command_runs_on_a_unet_pipeline(tmp_path, capsys):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text('[model]\nadapter = "unet"\ncheckpoint = "synthetic-sd-tiny"\nsteps = 2\nprompts = ["a red cube"]\n')
    assert main(["overhead", str(cfg), "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "2 steps per run" in out and "hook dispatch alone" in out
