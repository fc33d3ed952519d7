"""DiffusionGemma through the text adapter, on tiny random checkpoints saved and reloaded by path.

No DiffusionGemma weights can be downloaded here: the checkpoints are transformers' own
``DiffusionGemmaForBlockDiffusion`` with seeded random weights (``diffusion_gemma_build``).
"""

from __future__ import annotations

import pytest
import torch

from diffaccel import Registry, build_strategies, parse_config
from diffaccel.runtime.accelerator import Accelerator
from diffaccel.adapters.text.adapter import TextAdapter
from diffaccel.adapters.text.families.diffusion_gemma.pipeline import DiffusionGemmaPipeline, Positions, _Block, _GemmaContext, decoder_layer
from diffaccel.adapters.text.families.diffusion_gemma.build import build
from diffaccel.adapters.text.families.dispatch import load_pipeline
from diffaccel.cli.entry import main
from diffaccel.contract.errors import ConfigError
from diffaccel.contract.state import RunState

LENGTH, STEPS = 32, 6  # two blocks of 16


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build(tmp_path_factory.mktemp("dg") / "tiny", "tiny", seed=0)


@pytest.fixture(scope="module")
def pipe(ckpt):
    return load_pipeline(str(ckpt))


@pytest.fixture(scope="module")
def peaky(ckpt):
    """The same checkpoint with its final norm scaled up: peaked distributions whose top-1 holds
    from step to step, so that the strategies find something to skip."""
    p = load_pipeline(str(ckpt))
    with torch.no_grad():
        p.model.model.decoder.norm.weight.mul_(300.0)
    return p


def hooked(pipe, strategies, prompt=None, batch=1, seed=3, **kw):
    for s in strategies:
        s.name = getattr(s, "name", type(s).__name__.lower())
    pipe.accelerator = Accelerator(strategies, "text")
    try:
        return pipe(prompt, length=LENGTH, steps=STEPS, seed=seed, batch=batch, progress=False, **kw)
    finally:
        pipe.accelerator = None


def generate(pipe, prompt, batch, seed=3):
    ids = torch.tensor(pipe.prompt_ids([prompt] * batch))
    torch.manual_seed(seed)
    return pipe.model.generate(ids, max_new_tokens=LENGTH, max_denoising_steps=STEPS).sequences


def test_loads_by_path_through_the_text_adapter(ckpt, pipe):
    assert isinstance(pipe, DiffusionGemmaPipeline)
    info = TextAdapter.info(pipe)
    assert info["layers"] == ["decoder.0", "decoder.1"] and info["sampler"] == "block" and info["mask_id"] is None
    assert pipe.canvas_length == 16


@pytest.mark.parametrize("prompt,batch", [(None, 1), ("a small dog", 3)])
def test_hooks_without_strategy_give_generate_tokens(pipe, prompt, batch):
    ref = generate(pipe, prompt, batch)
    out = hooked(pipe, [], prompt, batch)
    plain = pipe(prompt, length=LENGTH, steps=STEPS, seed=3, batch=batch, progress=False)
    assert torch.equal(out.tokens, ref) and torch.equal(plain.tokens, ref)
    c = out.report["counters"]
    assert out.report["blocks_run"] == 2 and c["layers_computed"] == 2 * out.report["steps_run"]
    assert c["positions_computed"] == 2 * out.report["steps_run"] * batch * 16
    assert not torch.equal(hooked(pipe, [], prompt, batch, seed=4).tokens, ref)  # the seed matters


def test_early_exit_matches_generate(ckpt):
    """The model's stopping rule (stable and confident argmax canvas) ends blocks early in both."""
    p = load_pipeline(str(ckpt))
    with torch.no_grad():
        p.model.model.decoder.norm.weight.mul_(100.0)
    p.model.generation_config.confidence_threshold = 50.0  # any entropy counts as confident
    p.model.generation_config.stability_threshold = 0  # and any canvas as stable: each block stops after one step
    ref = generate(p, None, 2)
    out = hooked(p, [], None, 2)
    assert torch.equal(out.tokens, ref)
    assert out.report["steps_run"] == 2 and out.report["blocks_run"] == 2


def _decoder_inputs(pipe, B=2):
    """A context after one full hooked decoder step of a fresh canvas: each layer's input and output."""
    model = pipe.model
    torch.manual_seed(0)
    ids = torch.tensor(pipe.prompt_ids(["some words"] * B))
    cache = model.model.encoder(input_ids=ids).cache
    C = pipe.canvas_length
    pos = torch.arange(ids.shape[1], ids.shape[1] + C).unsqueeze(0)
    run = RunState(adapter="text", num_steps=1, batch_size=B)
    ctx = _GemmaContext(model, run, {"full_attention": None, "sliding_attention": None})
    ctx.new_block(_Block(model, cache, B, C, pos))
    canvas = torch.randint(0, pipe.vocab_size, (B, C))
    logits = pipe._step_logits(ctx, _NoAccel(), canvas, None)
    inputs = [ctx.h0.clone()] + [o.clone() for o in ctx.out[:-1]]
    return ctx, inputs, [o.clone() for o in ctx.out], logits.clone(), (model, ids, canvas, pos)


class _NoAccel:
    active = False

    def pre_step(self, run): run.plan = None
    def layer_output(self, run, layer, hidden): return layer.compute(hidden)


def test_full_hooked_step_equals_the_model_forward(pipe):
    ctx, _, _, logits, (model, ids, canvas, pos) = _decoder_inputs(pipe)
    ref = model(input_ids=ids, decoder_input_ids=canvas, decoder_position_ids=pos).logits
    assert torch.equal(logits, ref)


def test_partial_step_over_all_positions_equals_the_full_step(pipe):
    ctx, inputs, outputs, _, _ = _decoder_inputs(pipe)
    ctx.fresh = False
    B, C = outputs[0].shape[:2]
    sel = Positions(torch.ones(B, C, dtype=torch.bool))
    for i, layer in enumerate(pipe.model.model.decoder.layers):
        y = decoder_layer(layer, sel.gather(inputs[i]), ctx, i, sel)
        torch.testing.assert_close(y.view(B, C, -1), outputs[i], rtol=1e-5, atol=1e-5)


def test_partial_step_over_some_positions_equals_their_full_rows(pipe):
    """With the other positions' keys and values cached from the same input, the computed rows
    are the full step's rows: the partial path attends over the whole canvas and the prefix."""
    ctx, inputs, outputs, _, _ = _decoder_inputs(pipe)
    ctx.fresh = False
    B, C = outputs[0].shape[:2]
    mask = torch.zeros(B, C, dtype=torch.bool)
    mask[0, [1, 5, 6]] = True
    mask[1, [0, 15]] = True
    sel = Positions(mask)
    for i, layer in enumerate(pipe.model.model.decoder.layers):
        y = decoder_layer(layer, sel.gather(inputs[i]), ctx, i, sel)
        torch.testing.assert_close(y, sel.gather(outputs[i]), rtol=1e-5, atol=1e-5)


# -- strategies ----------------------------------------------------------------------------------
def _strategies(config_tables, info):
    cfg = parse_config({"model": {"adapter": "text"}, "strategy": config_tables}, registry=Registry())
    return build_strategies(cfg, Registry(), info)


def test_swd_skips_positions_and_is_exact_when_it_skips_none(peaky):
    info = TextAdapter.info(peaky)
    base = hooked(peaky, [])
    out = hooked(peaky, _strategies([{"use": "swd", "tau": 0.01, "K": 1}], info))
    c = out.report["counters"]
    assert c["fraction_computed"] < 0.95 and out.report["strategies"]["swd"]["mean_computed"] < 1.0
    assert out.tokens.shape == base.tokens.shape and not torch.equal(out.tokens, base.tokens)
    never = hooked(peaky, _strategies([{"use": "swd", "tau": 1.0, "early_stop": False}], info))
    assert never.report["counters"]["fraction_computed"] == 1.0
    assert torch.equal(never.tokens, base.tokens)


def test_time_anchor_runs_and_is_exact_where_inputs_move(peaky):
    """The block sampler re-noises every position it does not accept, so on random weights the
    inputs move everywhere at every step: time-anchor recomputes what moved, serves nothing, and
    the run equals the baseline. (Trained weights accept most of a converging canvas; there it
    may serve states.)"""
    info = TextAdapter.info(peaky)
    out = hooked(peaky, _strategies([{"use": "time-anchor", "threshold": 0.5, "warmup": 1, "max_age": 3}], info))
    m = out.report["strategies"]["time-anchor"]
    assert m["layers"] == ["decoder.0", "decoder.1"] and len(m["anchored_by_step"][0]) == 2 * STEPS
    assert m["hits"] == 0 and torch.equal(out.tokens, hooked(peaky, []).tokens)


def test_topk_truncates_what_the_sampler_draws_from(pipe):
    info = TextAdapter.info(pipe)
    base = hooked(pipe, [])
    out = hooked(pipe, _strategies([{"use": "topk", "k": 5, "k_keep": 8}], info))
    m = out.report["strategies"]["topk"]
    assert m["steps_truncated"] == out.report["steps_run"] and m["finalize_drawn"] == 0
    assert not torch.equal(out.tokens[:, 1:], base.tokens[:, 1:])
    full = hooked(pipe, _strategies([{"use": "topk", "k": 5, "k_keep": 0}], info))
    assert torch.equal(full.tokens, base.tokens)  # no truncation, no draw at finalize: exact


def test_bert_cond_is_refused_at_setup_with_one_line(pipe):
    with pytest.raises(ConfigError) as exc:
        _strategies([{"use": "bert-cond", "source": "velvet: smooth and soft"}], TextAdapter.info(pipe))
    msg = str(exc.value)
    assert "\n" not in msg and "bert-cond" in msg and "pinned-tokens" in msg


# -- bad input -----------------------------------------------------------------------------------
def _cli(tmp_path, capsys, model_lines: str, command: str = "generate") -> tuple[int, str]:
    path = tmp_path / "c.toml"
    path.write_text('[model]\nadapter = "text"\n' + model_lines)
    rc = main([command, str(path)])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("lines,needle", [
    ("length = 40\n", "key 'length': 40 is not a multiple of the model's block (canvas_length 16"),
    ('sampler = "masked"\nlength = 32\n', "key 'sampler': 'masked' does not fit the DiffusionGemma model"),
    ("block_size = 8\nlength = 32\n", "key 'block_size': 8, but this model denoises blocks of canvas_length 16"),
    ("temperature = 0\nlength = 32\n", "key 'temperature': must be > 0 for the block sampler"),
])
def test_bad_options_are_one_line_exit_2(ckpt, tmp_path, capsys, lines, needle):
    rc, err = _cli(tmp_path, capsys, f'checkpoint = "{ckpt}"\n' + lines)
    assert rc == 2 and err.count("\n") == 1 and needle in err and "Traceback" not in err


def test_block_sampler_on_a_masked_model_is_refused(tmp_path, capsys):
    rc, err = _cli(tmp_path, capsys, 'checkpoint = "wordnet-masked"\nsampler = "block"\n')
    assert rc == 2 and "key 'sampler': 'block' is DiffusionGemma's sampler" in err and err.count("\n") == 1


def test_missing_files_are_named(ckpt, tmp_path, capsys):
    import shutil

    bad = tmp_path / "noweights"
    shutil.copytree(ckpt, bad)
    (bad / "model.safetensors").unlink()
    rc, err = _cli(tmp_path, capsys, f'checkpoint = "{bad}"\nlength = 32\n')
    assert rc == 2 and f"{bad}: a DiffusionGemma folder" in err and "model.safetensors" in err
    (tmp_path / "notok").mkdir()
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(ckpt / f, tmp_path / "notok" / f)
    rc, err = _cli(tmp_path, capsys, f'checkpoint = "{tmp_path / "notok"}"\nlength = 32\n')
    assert rc == 2 and "no tokenizer beside the DiffusionGemma weights" in err and err.count("\n") == 1


def test_offline_hub_id_is_one_line(tmp_path, capsys):
    rc, err = _cli(tmp_path, capsys, 'checkpoint = "google/diffusiongemma-26B-A4B-it"\nlength = 256\n')
    assert rc == 2 and err.count("\n") == 1 and "google/diffusiongemma-26B-A4B-it" in err and "Traceback" not in err
