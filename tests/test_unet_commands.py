"""The UNet adapter: loading, writing and the command line, metrics, config errors, the DeepCache
peer, the shipped digits model (split from test_unet_adapter.py)."""

from __future__ import annotations

import importlib.util

import attrs
import numpy as np
import pytest
import torch

from diffaccel import ConfigError, DiffaccelError, ModelLoadError, load_config
from diffaccel.adapters.diffusers.unet.adapter import UNetAdapter
from diffaccel.adapters.diffusers.digits import class_accuracy, digit_label
from diffaccel.adapters.diffusers.unet.metrics import psnr, psnr_per_image, ssim
from diffaccel.adapters.diffusers.unet.pipeline import DigitsPipeline
from diffaccel.cli.entry import main
from diffaccel.adapters.diffusers.unet.testing import digit_images, sd_images, tiny_digits_pipeline, tiny_sd_pipeline

STEPS = 4



@pytest.fixture(scope="module")
def sd(tiny_sd):
    return tiny_sd


@pytest.fixture(scope="module")
def digits(tiny_digits):
    return tiny_digits


# ---- loading, writing, CLI ------------------------------------------------------------------------

def count_calls(module: torch.nn.Module) -> list[int]:
    n = [0]
    module.register_forward_hook(lambda *_: n.__setitem__(0, n[0] + 1))
    return n


def no_instance_patches(pipe) -> bool:
    mods = [pipe.unet, *pipe.unet.modules()]
    return (not any("forward" in m.__dict__ for m in mods)
            and not {"step", "set_timesteps"} & set(pipe.scheduler.__dict__))


def _cfg(steps=STEPS, checkpoint="synthetic-sd-tiny", **options):
    from diffaccel.runtime.config import parse_config

    model = {"adapter": "unet", "checkpoint": checkpoint, "steps": steps, "prompts": ["a red cube"], **options}
    return parse_config({"model": model})


def test_save_load_by_path_through_the_cli(tmp_path, capsys):
    from PIL import Image

    pipe = tiny_sd_pipeline()
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
    pipe = tiny_digits_pipeline()
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
    from diffaccel_models.unet.digits import classify

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
    ("scheduler", UNET + 'scheduler = "heun"\n', "[model]: key 'scheduler': must be one of 'ddim', 'dpm++2m', 'unipc', 'euler', 'checkpoint', got 'heun'"),
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
    from diffaccel.runtime.config import PeerEntry
    from diffaccel.adapters.diffusers.unet.adapter import DeepCachePeer

    pipe = tiny_sd_pipeline()
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

    from diffaccel.bench.options import BenchOptions
    from diffaccel.bench.runner import format_table, run_bench

    cfg = tmp_path / "tiny.toml"
    cfg.write_text(UNET + 'steps = 6\nprompts = ["a red cube"]\n[[peer]]\nuse = "deepcache"\ncache_interval = 2\n')
    result = run_bench([str(cfg)], BenchOptions(seeds=2, progress=False, json_path=str(tmp_path / "b.json")))
    names = [e.name for e in result.entries]
    assert names == ["baseline", "deepcache-i2"]
    peer = result.entries[1]
    assert peer.fraction_computed is None and peer.peer == {"use": "deepcache", "cache_interval": 2, "cache_branch_id": 0, "name": None}
    assert peer.quality["psnr"] < float("inf") and result.entries[0].quality["psnr"] == float("inf")
    table = format_table(result)
    assert "deepcache-i2" in table and "psnr" in table
    assert json.loads((tmp_path / "b.json").read_text())["entries"][1]["name"] == "deepcache-i2"


# ---- the shipped digits model ----------------------------------------------------------------------

def test_shipped_digits_model_is_small_safetensors_and_generates(tmp_path):
    from PIL import Image

    from diffaccel_models import ASSETS

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
