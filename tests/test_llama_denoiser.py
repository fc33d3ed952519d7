"""LLaMA/Qwen2-class masked DLMs (LLaDA, Dream) in the text adapter: tiny random checkpoints
saved with ``save_pretrained`` (or written in LLaDA's naming) and loaded by path."""

from __future__ import annotations

import json

import pytest
import torch

from diffaccel import hookimpl
from diffaccel.cli.entry import main
from diffaccel.contract.errors import ModelLoadError
from diffaccel.contract.state import RunState, StepPlan
from diffaccel.testing import run_with

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz", *[f"w{i}" for i in range(33)]]
MASK = 4


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", mask_token="[MASK]")


def _hf_model(family="llama", tie=False, kv_heads=2, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    ccls, mcls = (LlamaConfig, LlamaForCausalLM) if family == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    conf = ccls(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=kv_heads, intermediate_size=48, max_position_embeddings=64,
                tie_word_embeddings=tie, rope_theta=500.0)
    torch.manual_seed(seed)
    model = mcls(conf).eval()
    if family == "qwen2":  # transformers initialises biases to zero: make them count
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    return model


def tiny_decoder(tmp_path, family="llama", tie=False, kv_heads=2, mask=True, model_type=None):
    """A tiny random LLaMA/Qwen2 causal LM saved as a masked-DLM checkpoint folder."""
    model = _hf_model(family, tie, kv_heads)
    path = tmp_path / f"{family}-{model_type or ''}-{tie}-{kv_heads}"
    model.save_pretrained(path)
    _tokenizer().save_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    if mask:
        cfg["mask_token_id"] = MASK
    if model_type:
        cfg["model_type"] = model_type
        cfg["architectures"] = ["DreamModel"]
    (path / "config.json").write_text(json.dumps(cfg))
    return path, model


def bidirectional_logits(model, x):
    """transformers' own forward with an all-zero additive 4D mask: no causal masking."""
    B, N = x.shape
    return model(input_ids=x, attention_mask=torch.zeros(B, 1, N, N)).logits


def _full_then_partial(pipe, x, mask, zero=None):
    from diffaccel.adapters.text.sampling.pipeline import _RunContext
    from diffaccel.runtime.sequence import NullAccelerator as _NoAccelerator

    with torch.no_grad():
        run = RunState(adapter="text", num_steps=2, batch_size=x.shape[0])
        ctx = _RunContext(pipe.denoiser, run)
        pipe._denoise(ctx, _NoAccelerator(), x, None)
        full = ctx.logits.clone()
        kv = [(c.k.clone(), c.v.clone()) for c in ctx.kv]
        ctx.logits[mask if zero is None else zero] = 0.0  # what the partial step must rewrite
        run.plan = StepPlan(positions=mask)
        pipe._denoise(ctx, _NoAccelerator(), x, None)
    return ctx, full, kv


@pytest.mark.parametrize("family,tie,kv_heads", [("llama", False, 2), ("llama", True, 4), ("qwen2", False, 1)])
def test_layerwise_forward_matches_transformers_bidirectional(tmp_path, family, tie, kv_heads):
    from diffaccel.adapters.text.families.dispatch import load_pipeline

    path, model = tiny_decoder(tmp_path, family, tie, kv_heads)
    pipe = load_pipeline(str(path))
    x = torch.randint(5, len(VOCAB), (2, 13), generator=torch.Generator().manual_seed(0))
    ctx, full, _ = _full_then_partial(pipe, x, torch.zeros(2, 13, dtype=torch.bool))
    with torch.no_grad():
        ref = bidirectional_logits(model, x)
        causal = model(input_ids=x).logits
    torch.testing.assert_close(full, ref, rtol=1e-4, atol=1e-4)
    assert (full - causal).abs().max() > 1e-2  # the causal forward is a different function
    assert pipe.denoiser.mask_id == MASK and MASK in pipe.denoiser.special_ids


@pytest.mark.parametrize("family,kv_heads", [("llama", 2), ("qwen2", 1)])
def test_a_ragged_partial_step_on_unchanged_inputs_reproduces_the_full_step(tmp_path, family, kv_heads):
    from diffaccel.adapters.text.families.dispatch import load_pipeline

    pipe = load_pipeline(str(tiny_decoder(tmp_path, family, kv_heads=kv_heads)[0]))
    x = torch.randint(5, len(VOCAB), (3, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.zeros(3, 12, dtype=torch.bool)
    mask[0, [0, 3, 4, 11]] = True
    mask[2, [7]] = True
    ctx, full, kv = _full_then_partial(pipe, x, mask)
    assert ctx.head_sel.count == 5
    torch.testing.assert_close(ctx.logits, full, rtol=1e-5, atol=1e-5)
    for c, (k, v) in zip(ctx.kv, kv):
        torch.testing.assert_close(c.k, k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(c.v, v, rtol=1e-5, atol=1e-5)


def test_partial_step_after_a_token_change_matches_transformers_on_the_changed_rows(tmp_path):
    """One layer, so the positions the step recomputes see every other position's fresh keys:
    their logits must equal the bidirectional forward of the changed input."""
    from diffaccel.adapters.text.families.llama import LlamaDenoiser
    from diffaccel.adapters.text.sampling.pipeline import TextDiffusionPipeline, _RunContext
    from diffaccel.runtime.sequence import NullAccelerator as _NoAccelerator

    model = _hf_model("llama")
    model.model.layers = model.model.layers[:1]
    model.config.num_hidden_layers = 1
    pipe = TextDiffusionPipeline(LlamaDenoiser(model, MASK, {0}), None)
    x = torch.randint(5, len(VOCAB), (2, 10), generator=torch.Generator().manual_seed(3))
    y = x.clone()
    y[0, 6], y[1, 2] = 7, 9
    with torch.no_grad():
        run = RunState(adapter="text", num_steps=2, batch_size=2)
        ctx = _RunContext(pipe.denoiser, run)
        pipe._denoise(ctx, _NoAccelerator(), x, None)
        run.plan = StepPlan(positions=y != x)
        pipe._denoise(ctx, _NoAccelerator(), y, None)
        ref = bidirectional_logits(model, y)
    torch.testing.assert_close(ctx.logits[y != x], ref[y != x], rtol=1e-4, atol=1e-4)


# ---- LLaDA naming -----------------------------------------------------------------------------

def _to_llada(model, n_layers: int) -> dict[str, torch.Tensor]:
    """The inverse of the mapping, written out by hand from LLaDA's module names."""
    sd = model.state_dict()
    out = {"model.transformer.wte.weight": sd["model.embed_tokens.weight"], "model.transformer.ln_f.weight": sd["model.norm.weight"],
           "model.transformer.ff_out.weight": sd["lm_head.weight"]}
    for i in range(n_layers):
        p, q = f"model.layers.{i}.", f"model.transformer.blocks.{i}."
        out.update({q + "attn_norm.weight": sd[p + "input_layernorm.weight"], q + "q_proj.weight": sd[p + "self_attn.q_proj.weight"],
                    q + "k_proj.weight": sd[p + "self_attn.k_proj.weight"], q + "v_proj.weight": sd[p + "self_attn.v_proj.weight"],
                    q + "attn_out.weight": sd[p + "self_attn.o_proj.weight"], q + "ff_norm.weight": sd[p + "post_attention_layernorm.weight"],
                    q + "ff_proj.weight": sd[p + "mlp.gate_proj.weight"], q + "up_proj.weight": sd[p + "mlp.up_proj.weight"],
                    q + "ff_out.weight": sd[p + "mlp.down_proj.weight"]})
    return {k: v.clone().contiguous() for k, v in out.items()}


def tiny_llada(tmp_path, **overrides):
    from safetensors.torch import save_file

    model = _hf_model("llama", kv_heads=2, seed=5)
    with torch.no_grad():  # norms away from one, so a norm mapped to the wrong place shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    path = tmp_path / "llada"
    path.mkdir()
    save_file(_to_llada(model, 2), str(path / "model.safetensors"))
    cfg = {"model_type": "llada", "architectures": ["LLaDAModelLM"], "block_type": "llama", "d_model": 32, "n_layers": 2,
           "n_heads": 4, "n_kv_heads": 2, "mlp_hidden_size": 48, "vocab_size": len(VOCAB), "embedding_size": len(VOCAB),
           "max_sequence_length": 64, "rope_theta": 500.0, "rms_norm_eps": 1e-6, "weight_tying": False, "include_bias": False,
           "include_qkv_bias": False, "layer_norm_type": "rms", "activation_type": "silu", "rope": True, "alibi": False,
           "scale_logits": False, "input_emb_norm": False, "attention_layer_norm": False, "mask_token_id": MASK}
    cfg.update(overrides)
    (path / "config.json").write_text(json.dumps(cfg))
    _tokenizer().save_pretrained(path)
    return path, model


def test_llada_weight_names_map_onto_llama(tmp_path):
    from diffaccel.adapters.text.families.llama import LLADA_MASK_ID, llada_name
    from diffaccel.adapters.text.families.dispatch import load_pipeline

    path, model = tiny_llada(tmp_path)
    pipe = load_pipeline(str(path))
    x = torch.randint(5, len(VOCAB), (2, 11), generator=torch.Generator().manual_seed(1))
    ctx, full, _ = _full_then_partial(pipe, x, torch.zeros(2, 11, dtype=torch.bool))
    with torch.no_grad():
        ref = bidirectional_logits(model, x)
    torch.testing.assert_close(full, ref, rtol=1e-4, atol=1e-4)
    assert llada_name("model.transformer.blocks.7.ff_proj.weight") == "model.layers.7.mlp.gate_proj.weight"
    assert llada_name("model.transformer.blocks.7.up_proj.weight") == "model.layers.7.mlp.up_proj.weight"
    assert llada_name("model.transformer.blocks.0.att_proj.weight") is None  # the fused sequential block
    assert LLADA_MASK_ID == 126336


@pytest.mark.parametrize("key,value,named", [("block_type", "sequential", "block_type"), ("alibi", True, "alibi"),
                                             ("include_bias", True, "include_bias")])
def test_llada_variants_outside_the_mapping_are_refused(tmp_path, key, value, named):
    from diffaccel.adapters.text.families.dispatch import load_pipeline

    path, _ = tiny_llada(tmp_path, **{key: value})
    with pytest.raises(ModelLoadError) as info:
        load_pipeline(str(path))
    assert f"'{named}'" in str(info.value) and "config.json" in str(info.value) and "\n" not in str(info.value)


def test_dream_config_loads_as_qwen2_with_its_shifted_head(tmp_path):
    """Dream: Qwen2 weights, and position p's logits read from p - 1 (position 0 its own); a
    ragged partial step on unchanged inputs must still reproduce the full step."""
    from diffaccel.adapters.text.families.dispatch import load_pipeline

    path, model = tiny_decoder(tmp_path, "qwen2", model_type="Dream")
    pipe = load_pipeline(str(path))
    assert pipe.denoiser.logit_shift == 1
    x = torch.randint(5, len(VOCAB), (2, 9), generator=torch.Generator().manual_seed(4))
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[0, [0, 4, 8]] = True
    mask[1, [2]] = True
    ctx, full, _ = _full_then_partial(pipe, x, torch.zeros(2, 9, dtype=torch.bool))
    with torch.no_grad():
        ref = bidirectional_logits(model, x)
    torch.testing.assert_close(full, torch.cat([ref[:, :1], ref[:, :-1]], dim=1), rtol=1e-4, atol=1e-4)
    heads = torch.zeros_like(mask)
    heads[0, [0, 1, 5]] = heads[1, 3] = True
    ctx, full, _ = _full_then_partial(pipe, x, mask, zero=heads)
    # the head re-ran at the positions after the computed ones (and at 0, reading itself)
    assert sorted(ctx.head_sel.flat.tolist()) == [0, 1, 5, 9 + 3]
    torch.testing.assert_close(ctx.logits, full, rtol=1e-5, atol=1e-5)


# ---- bad input --------------------------------------------------------------------------------

def _cli_error(tmp_path, capsys, checkpoint, extra=""):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[model]\nadapter = "text"\ncheckpoint = "{checkpoint}"\nlength = 8\nsteps = 2\n{extra}')
    capsys.readouterr()  # what building the checkpoint printed (save_pretrained's progress bar)
    code = main(["generate", str(cfg), "--no-progress"])
    err = capsys.readouterr().err
    return code, err


def test_missing_mask_token_id_exits_2_naming_the_key(tmp_path, capsys):
    path, _ = tiny_decoder(tmp_path, mask=False)
    code, err = _cli_error(tmp_path, capsys, path)
    assert code == 2 and err.count("\n") == 1 and "'mask_token_id'" in err and "config.json" in err


def test_unsupported_decoder_architecture_exits_2(tmp_path, capsys):
    from transformers import MistralConfig, MistralForCausalLM

    MistralForCausalLM(MistralConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     num_key_value_heads=1, intermediate_size=32)).save_pretrained(tmp_path / "mistral")
    code, err = _cli_error(tmp_path, capsys, tmp_path / "mistral")
    assert code == 2 and err.count("\n") == 1 and "'model_type'" in err and "mistral" in err and "llama" in err


def test_hub_id_while_offline_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, err = _cli_error(tmp_path, capsys, "GSAI-ML/no-such-llada-xyz")
    assert code == 2 and err.count("\n") == 1 and "GSAI-ML/no-such-llada-xyz" in err


def test_block_size_must_divide_length_for_the_prefix_cache(tmp_path, capsys):
    code, err = _cli_error(tmp_path, capsys, "default", "block_size = 3\nprefix_cache = true\n")
    assert code == 2 and err.count("\n") == 1 and "'block_size'" in err
    code, err = _cli_error(tmp_path, capsys, "default", "prefix_cache = true\n")
    assert code == 2 and "'prefix_cache'" in err and "block_size" in err


def test_prefix_cache_on_a_time_conditioned_model_is_refused(tmp_path, capsys):
    code, err = _cli_error(tmp_path, capsys, "wordnet-continuous", "block_size = 4\nprefix_cache = true\n")
    assert code == 2 and err.count("\n") == 1 and "'prefix_cache'" in err


# ---- the exact prefix cache -------------------------------------------------------------------

class _EveryStep:
    """Recomputes the prefix at every step: the uncached run of the same attention pattern."""

    name = "every-step"

    def __init__(self, pipe):
        self.pipe = pipe

    @hookimpl
    def diffaccel_pre_step(self, run):
        self.pipe._ctx_hook.prefix_done = -1


def _run_prefix(pipe, uncached: bool, **kw):
    """A prefix-cache run; ``uncached`` redoes the prefix pass at every step (the reference)."""
    from diffaccel.adapters.text.sampling import pipeline as P

    orig = P._RunContext.__init__

    def init(ctx, den, run):
        orig(ctx, den, run)
        pipe._ctx_hook = ctx

    P._RunContext.__init__ = init
    try:
        return run_with(pipe, [_EveryStep(pipe)] if uncached else [], prefix_cache=True, **kw)
    finally:
        P._RunContext.__init__ = orig


@pytest.mark.parametrize("batch,temperature,dream", [(1, 1.0, False), (3, 0.0, False), (2, 1.0, True)])
def test_prefix_cache_equals_the_uncached_run(tmp_path, batch, temperature, dream):
    from diffaccel.adapters.text.families.dispatch import load_pipeline

    path = tiny_decoder(tmp_path, "qwen2", model_type="Dream")[0] if dream else tiny_decoder(tmp_path)[0]
    pipe = load_pipeline(str(path))
    kw = dict(length=16, steps=16, block_size=4, batch=batch, temperature=temperature, seed=3)
    cached = _run_prefix(pipe, uncached=False, **kw)
    every = _run_prefix(pipe, uncached=True, **kw)
    assert torch.equal(cached.tokens, every.tokens)
    c, e = cached.report["counters"], every.report["counters"]
    # cached: the prefix runs once per block (3 blocks after the first), not at each of 12 steps
    assert c["positions_computed"] < e["positions_computed"]
    per_layer_prefix = batch * (4 + 8 + 12)  # positions of the prefix passes, per layer
    assert e["positions_computed"] - c["positions_computed"] == 2 * 3 * per_layer_prefix


def test_prefix_cache_step_matches_a_block_causal_transformers_forward(tmp_path):
    """The attention pattern the cache makes exact: finished blocks see finished blocks only,
    the active block and the masked rest see everything. Checked against transformers' forward
    with that 4D mask, on the logits of a step in the second block."""
    from diffaccel.adapters.text.families.dispatch import load_pipeline

    path, model = tiny_decoder(tmp_path)
    pipe = load_pipeline(str(path))
    seen = {}

    class Spy:
        name = "spy"

        @hookimpl
        def diffaccel_post_step(self, run, output):
            if run.step == 5:
                seen["logits"] = output.logits.clone()

        @hookimpl
        def diffaccel_pre_step(self, run):
            if run.step == 5:
                seen["x"] = pipe._ctx_hook_x.clone()

    from diffaccel.adapters.text.sampling import pipeline as P

    orig = P.TextDiffusionPipeline._step_model

    def step_model(self, ctx, accel, x_in, t):
        self._ctx_hook_x = x_in
        return orig(self, ctx, accel, x_in, t)

    P.TextDiffusionPipeline._step_model = step_model
    try:
        run_with(pipe, [Spy()], length=12, steps=12, block_size=4, prefix_cache=True, temperature=0.0)
    finally:
        P.TextDiffusionPipeline._step_model = orig
    lo = 4  # step 5 is the second block's second step
    allowed = torch.ones(12, 12, dtype=torch.bool)
    allowed[:lo, lo:] = False
    add = torch.zeros(1, 1, 12, 12).masked_fill(~allowed, float("-inf"))
    with torch.no_grad():
        ref = model(input_ids=seen["x"], attention_mask=add).logits
    torch.testing.assert_close(seen["logits"], ref, rtol=1e-4, atol=1e-4)
    with torch.no_grad():  # and it is not the plain bidirectional forward
        assert (bidirectional_logits(model, seen["x"])[:, :lo] - ref[:, :lo]).abs().max() > 1e-3


# ---- strategies on the family -----------------------------------------------------------------

@pytest.mark.parametrize("strategy,prefix", [("swd", False), ("time-anchor", False), ("topk", False),
                                             ("swd", True), ("time-anchor", True)])
def test_text_strategies_run_on_the_llama_family(tmp_path, strategy, prefix):
    from diffaccel import apply
    from diffaccel.adapters.text.adapter import TextAdapter
    from diffaccel.runtime.config import parse_config
    from diffaccel.runtime.registry import Registry

    path, _ = tiny_decoder(tmp_path)
    params = {"swd": {"tau": 0.01, "K": 2, "R": 1}, "time-anchor": {"threshold": 0.05, "warmup": 2, "max_age": 4},
              "topk": {"k": 3, "k_keep": 8}}[strategy]
    registry = Registry()
    model = {"adapter": "text", "checkpoint": str(path), "length": 16, "steps": 16, "batch": 2}
    if prefix:
        model.update(block_size=4, prefix_cache=True)
    cfg = parse_config({"model": model, "strategy": [{"use": strategy, **params}]}, registry=registry)
    pipe = TextAdapter.load(cfg)
    plain = TextAdapter.run(pipe, cfg, seed=0, progress=False)
    with apply(pipe, cfg.without_strategies(), registry=registry):  # hooked, no strategy: the counters' baseline
        hooked = TextAdapter.run(pipe, cfg, seed=0, progress=False)
    assert torch.equal(hooked.tokens, plain.tokens)
    with apply(pipe, cfg, registry=registry):
        out = TextAdapter.run(pipe, cfg, seed=0, progress=False)
    assert out.tokens.shape == (2, 16) and not (out.tokens == MASK).any()
    assert strategy in out.report["strategies"]
    if strategy != "topk":  # the position-skipping strategies computed less than every position
        assert out.report["counters"]["fraction_computed"] < hooked.report["counters"]["fraction_computed"] <= 1.0
    else:  # top-k draws change the tokens of this temperature-1 run
        assert not torch.equal(out.tokens, plain.tokens)


# ---- the speed model --------------------------------------------------------------------------

def test_synthetic_llada_small_is_the_stated_shape_and_deterministic():
    from diffaccel.adapters.text.families.dispatch import load_pipeline

    a = load_pipeline("synthetic-llada-small")
    den = a.denoiser
    n = sum(p.numel() for p in den.model.parameters())
    assert den.n_layers == 12 and den.vocab_size == 32000 and den.max_len == 256
    assert 105e6 < n < 115e6
    w = den.layers[3].mlp.up_proj.weight
    b = load_pipeline("synthetic-llada-small").denoiser.layers[3].mlp.up_proj.weight
    assert torch.equal(w, b) and w.std() > 0.01
    assert a.tokenizer.decode([5, 31000]).endswith("<31000>")
