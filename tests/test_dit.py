"""The DiT adapter on the tiny synthetic PixArt-like pipeline: untouched output, residual skips
that really skip, guidance branches, dct-anchor and time-anchor by capabilities, diffusers' hooks as peers."""

from __future__ import annotations

import pytest
import torch

import diffaccel
from diffaccel.runtime.accelerator import Accelerator
from diffaccel.contract.errors import ConfigValueError, DiffaccelError

pytest.importorskip("diffusers")

from diffaccel.adapters.diffusers.dit import hooks, peers  # noqa: E402
from diffaccel.adapters.diffusers.dit.adapter import DiTAdapter, load_checkpoint  # noqa: E402

TINY = "synthetic-dit-tiny"
LAYERS = [f"transformer_blocks.{i}" for i in range(4)]


@pytest.fixture(scope="module")
def pipe():
    p = load_checkpoint(TINY)
    p.set_progress_bar_config(disable=True)
    return p


def _images(pipe, steps=8, **kw):
    gens = [torch.Generator().manual_seed(s) for s in (0, 1)]
    return pipe(["digit 3", "7"], num_inference_steps=steps, guidance_scale=2.0, generator=gens, output_type="pt",
                **kw).images





def test_block_stack_view():
    specs = hooks.block_specs(load_checkpoint(TINY).transformer)
    assert [n for n, _, _, _ in specs] == LAYERS
    assert [d for _, _, d, _ in specs] == [0, 1, 1, 0]
    assert [k for _, k, _, _ in specs] == ["down", "down", "up", "up"]
    odd = hooks.block_specs(type("T", (), {"transformer_blocks": torch.nn.ModuleList([torch.nn.Identity()] * 5)})())
    assert [k for _, k, _, _ in odd] == ["down", "down", "mid", "up", "up"]


@pytest.mark.parametrize("batched", [True, False])
def test_bitwise_untouched_hooked_and_after_detach(pipe, batched):
    ref = _images(pipe, cfg_batched=batched)
    DiTAdapter.attach(pipe, Accelerator([], "dit"))
    hooked = _images(pipe, cfg_batched=batched)
    DiTAdapter.detach(pipe)
    assert torch.equal(ref, hooked)
    assert torch.equal(ref, _images(pipe, cfg_batched=batched))
    assert "forward" not in pipe.transformer.__dict__
    assert all("forward" not in b.__dict__ for b in pipe.transformer.transformer_blocks)


class SkipMiddle:
    """A strategy that computes every block at even steps and skips blocks 1-2 at odd steps."""

    name = "skip-middle"

    def __init__(self):
        self.seen = []

    @diffaccel.hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        if run.step % 2 == 1 and layer.name in LAYERS[1:3]:
            out = layer.cached_output
            self.seen.append((run.branch, layer.name, hidden["hidden_states"], out))
            return out
        return None


def _attn_calls(pipe):
    calls = {name: 0 for name in LAYERS}

    def counter(name):
        def hook(*_):
            calls[name] += 1
        return hook

    handles = [b.attn1.register_forward_hook(counter(n)) for n, b in zip(LAYERS, pipe.transformer.transformer_blocks)]
    return calls, handles


@pytest.mark.parametrize("batched", [True, False])
def test_skipped_blocks_do_not_run_and_add_their_residual(pipe, batched):
    strat = SkipMiddle()
    calls, handles = _attn_calls(pipe)
    steps = 6
    try:
        with diffaccel.apply(pipe, strategies=[strat]):
            out = _images(pipe, steps=steps, cfg_batched=batched)
    finally:
        for h in handles:
            h.remove()
    per_step = 1 if batched else 2
    assert calls["transformer_blocks.0"] == steps * per_step
    assert calls["transformer_blocks.1"] == (steps // 2) * per_step  # odd steps skipped: attention never ran
    assert {b for b, _, _, _ in strat.seen} == ({"main"} if batched else {"uncond", "cond"})
    # block 1's served output is its fresh input plus the residual it had at the last computed step
    _, _, x_in, served = strat.seen[0]
    assert served.shape == x_in.shape and not torch.equal(served, x_in)
    assert not torch.equal(out, _images(pipe, steps=steps, cfg_batched=batched))


def test_residual_is_applied_to_the_current_input(pipe):
    blk = pipe.transformer.transformer_blocks[1]
    sess = hooks.DiTSession(pipe, Accelerator([], "dit"))
    layer = sess.layers[1]
    x0, x1 = torch.randn(2, 16, 32), torch.randn(2, 16, 32)
    res = torch.randn(2, 16, 32)
    assert torch.equal(layer.apply_residual({"hidden_states": x1}, res), x1 + res)
    assert layer.out_h == 0 and layer.out_e is None  # BasicTransformerBlock, from diffusers' registry
    assert torch.equal(layer._residual({"hidden_states": x0}, x0 + res), (x0 + res) - x0)
    assert blk is layer.module


def test_time_anchor_skips_middle_blocks_on_dit():
    pytest.importorskip("diffaccel_time_anchor")
    cfg = diffaccel.parse_config({"model": {"adapter": "dit", "checkpoint": TINY, "steps": 12, "batch": 2,
                                            "guidance_scale": 2.0, "prompts": ["a", "b"]},
                                  "strategy": [{"use": "time-anchor", "threshold": 0.5, "warmup": 2, "max_age": 4, "min_depth": 1}]})
    pipe = DiTAdapter.load(cfg)
    base = DiTAdapter.run(pipe, cfg.without_strategies(), 0, progress=False)
    with diffaccel.apply(pipe, cfg):
        out = DiTAdapter.run(pipe, cfg, 0, progress=False)
    c = out.report["counters"]
    assert c["layers_skipped"] > 0
    skipped = out.report["strategies"]["time-anchor"]["skipped_per_block"]
    assert skipped[0] == 0 and skipped[3] == 0 and skipped[1] > 0  # the outer blocks always run
    q = DiTAdapter.quality([base], [out])
    assert q["psnr"] > 10


def _dct_config(**keys):
    return {"model": {"adapter": "dit", "checkpoint": TINY, "steps": 12, "batch": 2, "guidance_scale": 2.0,
                      "prompts": ["a", "b"]},
            "strategy": [{"use": "dct-anchor", "signal": "x0", "band": 2, "warmup": 1, **keys}]}


def test_dct_anchor_on_dit_reuses_blocks():
    pytest.importorskip("diffaccel_dct_anchor")
    cfg = diffaccel.parse_config(_dct_config(threshold=10.0, blocks=LAYERS[1:3], max_reuse=3))
    pipe = DiTAdapter.load(cfg)
    with diffaccel.apply(pipe, cfg):
        out = DiTAdapter.run(pipe, cfg, 0, progress=False)
    blocks = out.report["strategies"]["dct-anchor"]["blocks"]
    assert blocks["transformer_blocks.1"]["reused"] > 0
    assert out.report["counters"]["layers_skipped"] >= blocks["transformer_blocks.1"]["reused"]


@pytest.mark.parametrize("keys, match", [
    ({"signal": "input"}, "key 'signal'.*feature maps"),
    ({"blocks": ["transformer_blocks.3"]}, "key 'blocks'.*last block"),
    ({"blocks": ["transformer_blocks.9"]}, "unknown block 'transformer_blocks.9'"),
])
def test_dct_anchor_rejects_what_a_dit_lacks(keys, match):
    pytest.importorskip("diffaccel_dct_anchor")
    cfg = diffaccel.parse_config(_dct_config(**keys))
    pipe = DiTAdapter.load(cfg)
    with pytest.raises((ConfigValueError, DiffaccelError), match=match):
        with diffaccel.apply(pipe, cfg):
            DiTAdapter.run(pipe, cfg, 0, progress=False)


@pytest.mark.parametrize("peer, name", [
    (peers.FirstBlockCachePeer(threshold=0.3), "diffusers-fbcache-t0.3"),
    (peers.PyramidAttentionBroadcastPeer(skip_range=2, timestep_low=0, timestep_high=1000), "diffusers-pab-s2"),
    (peers.TaylorSeerPeer(cache_interval=2, disable_cache_before_step=2), "diffusers-taylorseer-i2-o1"),
])
def test_diffusers_hooks_as_peers(pipe, peer, name):
    ref = _images(pipe)
    with DiTAdapter.peer_context(pipe, peer):
        got = _images(pipe)
        again = _images(pipe)
    assert peers.peer_name(peer) == name
    assert not torch.equal(got, ref)  # the hook changed something: it skipped work
    assert torch.equal(again, got)  # each generation starts afresh: no hook state carried over
    assert torch.equal(_images(pipe), ref)  # removed: bitwise the untouched pipeline
    assert "forward" not in pipe.transformer.__dict__


def test_peer_refuses_an_attached_pipeline(pipe):
    with diffaccel.apply(pipe, strategies=[SkipMiddle()]):
        with pytest.raises(DiffaccelError, match="bare pipeline"):
            with DiTAdapter.peer_context(pipe, peers.FirstBlockCachePeer()):
                pass


def test_config_names_unknown_peer():
    from diffaccel.contract.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown peer 'deepcache'; adapter 'dit' offers: diffusers-fbcache"):
        diffaccel.parse_config({"model": {"adapter": "dit", "checkpoint": TINY}, "peer": [{"use": "deepcache"}]})


def test_sd3_dual_stream_blocks_bitwise_and_residual_skip():
    """SD3's JointTransformerBlock returns (text states, hidden states): both streams get their residual."""
    from diffusers import DDIMScheduler, SD3Transformer2DModel

    torch.manual_seed(0)
    t = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=4, attention_head_dim=8,
                              num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16,
                              pooled_projection_dim=8, out_channels=4).eval()
    class Fake:  # a pipeline's two members the hooks touch (weak-referenceable, unlike SimpleNamespace)
        transformer, scheduler = t, DDIMScheduler()

    fake = Fake()
    x, e, p = torch.randn(1, 4, 8, 8), torch.randn(1, 5, 16), torch.randn(1, 8)

    def two_steps():
        with torch.no_grad():
            return [t(hidden_states=x, encoder_hidden_states=e, pooled_projections=p, timestep=torch.tensor([s]),
                      return_dict=False)[0] for s in (900, 800)]

    ref = two_steps()
    assert [k for _, k, _, _ in hooks.block_specs(t)] == ["down", "down", "up", "up"]
    sess = hooks.attach(fake, Accelerator([], "dit"))
    assert sess.layers[1].out_h == 1 and sess.layers[1].out_e == 0  # from diffusers' block registry
    got = two_steps()
    hooks.detach(fake)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))

    strat = SkipMiddle()
    calls = {"n": 0}
    h = t.transformer_blocks[1].attn.register_forward_hook(lambda *_: calls.__setitem__("n", calls["n"] + 1))
    sess = hooks.attach(fake, Accelerator([strat], "dit"))
    try:
        got = two_steps()
    finally:
        h.remove()
        hooks.detach(fake)
    assert calls["n"] == 1  # step 1 skipped block 1: its attention did not run
    branch, name, x_in, served = strat.seen[0]
    assert isinstance(served, tuple) and served[1].shape == x_in.shape and served[0] is not None
    assert torch.equal(got[0], ref[0]) and not torch.equal(got[1], ref[1])


def test_shipped_digits_dit_loads_and_is_labelled():
    from diffaccel.adapters.diffusers.dit.adapter import is_digits

    p = load_checkpoint("dit-digits")
    from diffaccel.adapters.diffusers.dit.nets.pooled_pixart import PooledTextPixArtTransformer2DModel

    assert type(p.transformer) is PooledTextPixArtTransformer2DModel and is_digits(p)
    assert [n for n, _, _, _ in hooks.block_specs(p.transformer)] == [f"transformer_blocks.{i}" for i in range(10)]
    cfg = diffaccel.parse_config({"model": {"adapter": "dit", "checkpoint": "dit-digits", "steps": 2, "batch": 2,
                                            "guidance_scale": 2.0, "prompts": ["digit 3", "7"]}})
    out = DiTAdapter.run(p, cfg, 0, progress=False)
    assert out.images.shape == (2, 1, 32, 32) and out.labels == [3, 7]
    assert "cond_acc" in DiTAdapter.quality([out], [out])


def test_bad_size_is_one_line_config_error():
    from diffaccel.contract.errors import ConfigError

    cfg = diffaccel.parse_config({"model": {"adapter": "dit", "checkpoint": TINY, "size": 9}})
    with pytest.raises(ConfigError, match=r"key 'size': 9 is not a multiple of 2"):
        DiTAdapter.load(cfg)


def test_digits_dit_training_writes_a_loadable_pipeline(tmp_path):
    """Two steps of the shared digits training loop on the DiT: a TextDiTPipeline folder that the
    adapter loads, with train.json; adaLN-Zero makes the untrained transformer output zero."""
    from diffaccel_models.dit.digits import TrainDiTConfig, adaln_zero, new_pipeline, train

    fresh = new_pipeline(0).transformer
    adaln_zero(fresh)
    with torch.no_grad():
        out = fresh(torch.randn(2, 1, 32, 32), encoder_hidden_states=torch.randn(2, 16, 64),
                    timestep=torch.tensor([10, 900]), return_dict=False)[0]
    assert out.shape == (2, 1, 32, 32) and not out.any()
    folder = train(TrainDiTConfig(out=str(tmp_path / "d"), steps=2, max_minutes=0, eval_per_class=0, batch=4))
    assert (folder / "train.json").exists() and (folder / "transformer" / "diffusion_pytorch_model.safetensors").exists()
    p = load_checkpoint(str(folder))
    assert type(p).__name__ == "TextDiTPipeline" and len(p.transformer.transformer_blocks) == 10
    assert p.transformer.proj_out.weight.abs().sum() > 0  # two optimiser steps moved it off zero


def test_dct_anchor_extrapolates_the_kept_residual_on_dit():
    """extrapolate = true: a reused block returns its current input plus the residual extrapolated
    through its last two computed steps (not the last residual alone), and the block does not run."""
    pytest.importorskip("diffaccel_dct_anchor")
    from diffaccel.kit.extrapolate import extrapolated

    a, b = torch.tensor([1.0, 2.0]), torch.tensor([2.0, 5.0])
    assert torch.equal(extrapolated([(2, a), (4, b)], 5), torch.tensor([2.5, 6.5]))  # slope over 2 steps, 1 ahead
    pair = extrapolated([(0, (a, None)), (1, (b, None))], 3)
    assert torch.equal(pair[0], torch.tensor([4.0, 11.0])) and pair[1] is None
    # reach: at most that many spans (s2 - s1) past s2, then held
    assert torch.equal(extrapolated([(0, a), (1, b)], 3, reach=1.0), torch.tensor([3.0, 8.0]))
    assert torch.equal(extrapolated([(2, a), (4, b)], 5, reach=1.0), torch.tensor([2.5, 6.5]))  # within reach: unchanged
    seen = {}
    for flag in (False, True):
        cfg = diffaccel.parse_config(_dct_config(threshold=10.0, blocks=LAYERS[1:3], max_reuse=3, extrapolate=flag))
        pipe = DiTAdapter.load(cfg)
        with diffaccel.apply(pipe, cfg):
            out = DiTAdapter.run(pipe, cfg, 0, progress=False)
        d = out.report["strategies"]["dct-anchor"]["branches"]["main"]["transformer_blocks.1"]["decisions"]
        seen[flag] = (out.images, "".join(d), out.report["counters"]["layers_skipped"])
    assert seen[True][1] == seen[False][1] and "R" in seen[True][1]  # same decisions and skips,
    assert seen[True][2] == seen[False][2] > 0
    assert not torch.equal(seen[True][0], seen[False][0])  # different values served


def test_pooled_text_pixart_reads_the_prompt_through_adaln(tmp_path):
    """PooledTextPixArtTransformer2DModel: with every cross-attention's output projection zeroed the
    prompt still changes the prediction (through the timestep embedding), stock PixArt's does not;
    save_pretrained / from_pretrained in a TextDiTPipeline give the same outputs."""
    from diffaccel_models.dit.digits import new_pipeline
    from diffaccel.adapters.diffusers.dit.pipeline import TextDiTPipeline

    x, t = torch.randn(2, 1, 32, 32), torch.tensor([10, 900])
    e1, e2 = torch.randn(2, 16, 64), torch.randn(2, 16, 64)
    diffs = {}
    for pooled in (True, False):
        tr = new_pipeline(0, pooled_text=pooled).transformer
        with torch.no_grad():
            for blk in tr.transformer_blocks:
                blk.attn2.to_out[0].weight.zero_()
                blk.attn2.to_out[0].bias.zero_()
            y1, y2 = (tr(x, encoder_hidden_states=e, timestep=t, return_dict=False)[0] for e in (e1, e2))
        diffs[pooled] = (y1 - y2).abs().max().item()
    assert diffs[False] == 0.0 and diffs[True] > 1e-4
    pipe = new_pipeline(0)
    pipe.save_pretrained(str(tmp_path / "p"), safe_serialization=True)
    back = TextDiTPipeline.from_pretrained(str(tmp_path / "p"))
    assert type(back.transformer) is type(pipe.transformer)
    with torch.no_grad():
        assert torch.equal(back.transformer(x, encoder_hidden_states=e1, timestep=t).sample,
                           pipe.transformer(x, encoder_hidden_states=e1, timestep=t).sample)


def test_time_anchor_extrapolates_skipped_blocks_on_dit():
    """time-anchor's extrapolate = true serves skipped middle blocks from the extrapolated residual:
    blocks are still skipped, and what they return differs from the plain cached residual."""
    pytest.importorskip("diffaccel_time_anchor")
    images = {}
    for flag in (False, True):
        cfg = diffaccel.parse_config({"model": {"adapter": "dit", "checkpoint": TINY, "steps": 12, "batch": 2,
                                                "guidance_scale": 2.0, "prompts": ["a", "b"]},
                                      "strategy": [{"use": "time-anchor", "threshold": 0.9, "warmup": 2, "max_age": 4,
                                                    "min_depth": 1, "extrapolate": flag}]})
        pipe = DiTAdapter.load(cfg)
        with diffaccel.apply(pipe, cfg):
            out = DiTAdapter.run(pipe, cfg, 0, progress=False)
        assert out.report["counters"]["layers_skipped"] > 0
        images[flag] = out.images
    assert not torch.equal(images[True], images[False])


def test_loading_in_the_models_own_dtype_prints_no_cast_warning(caplog, capfd):
    # diffusers warns on every .to(dtype) of a model keeping float32 modules (PixArt's), a no-op
    # one included; a float32 config on a float32 checkpoint must not print it on every run
    cfg = diffaccel.parse_config({"model": {"adapter": "dit", "checkpoint": "dit-digits", "steps": 2}})
    from diffusers.utils import logging as dlogging

    dlogging.enable_propagation()  # diffusers' records reach caplog (its own handler writes to stderr)
    try:
        with caplog.at_level("WARNING"):
            DiTAdapter.load(cfg)
    finally:
        dlogging.disable_propagation()
    said = caplog.text + capfd.readouterr().err
    assert "should be kept in float32" not in said
