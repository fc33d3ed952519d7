"""Tests of the topk strategy on a tiny random text diffusion LM (vocabulary 64, 32 positions)."""

from __future__ import annotations

import math

import pytest
import torch

import diffaccel
from diffaccel.adapters.text.sampling.logits import TopKLogits
import diffaccel_topk
from diffaccel import ConfigError, ConfigValueError, hookimpl
from diffaccel.adapters.text.sampling.denoisers import ReferenceDenoiser
from diffaccel.adapters.text.sampling.model import TextDiffusionConfig, TextDiffusionLM
from diffaccel.adapters.text.sampling.pipeline import TextDiffusionPipeline
from diffaccel_topk import TopK, TopKConfig, draw_topk, self_similarity

V, N = 64, 32


class StubTokenizer:
    def encode(self, text: str) -> list[int]:
        return [4 + (ord(ch) % (V - 4)) for ch in text]

    def decode(self, ids) -> str:
        return " ".join(f"w{int(i)}" for i in ids)


def tiny_pipeline(kind: str = "masked") -> TextDiffusionPipeline:
    torch.manual_seed(0)
    model = TextDiffusionLM(TextDiffusionConfig(vocab_size=V, dim=32, n_layers=2, n_heads=2, max_len=N, mask_id=2, kind=kind))
    for p in model.parameters():  # the gates start at zero: randomise everything so positions differ
        torch.nn.init.normal_(p, std=0.3)
    return TextDiffusionPipeline(ReferenceDenoiser(model.eval()), StubTokenizer())


@pytest.fixture(scope="module")
def pipe():
    return tiny_pipeline()


def generate(pipe, strategies=(), **kw):
    kw = {"length": N, "steps": 16, "temperature": 0.0, "progress": False, **kw}
    if not strategies:
        return pipe(**kw)
    with diffaccel.apply(pipe, strategies=list(strategies)):
        return pipe(**kw)


def registry():
    reg = diffaccel.Registry(load_entrypoints=False)
    reg.register_plugin(diffaccel_topk, name="topk")
    return reg


# ---- configuration -------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, key, words", [
    ({"k": 0}, "k", "[1, inf)"),
    ({"temperature": 0.0}, "temperature", "positive"),
    ({"temperature": -1.0}, "temperature", "positive"),
    ({"k": 8, "k_keep": 4}, "k_keep", "at least k (8)"),
    ({"k_keep": -1}, "k_keep", "[0, inf)"),
    ({"rank": "random"}, "rank", "'model', 'gumbel'"),
])
def test_bad_values_name_the_key(kwargs, key, words):
    with pytest.raises(ConfigValueError) as err:
        TopKConfig(**kwargs)
    assert err.value.key == key and words in err.value.message


@pytest.mark.parametrize("kwargs, key", [({"k": 65, "k_keep": None}, "k"), ({"k_keep": 100}, "k_keep")])
def test_setup_rejects_values_above_the_vocabulary(kwargs, key):
    with pytest.raises(ConfigValueError) as err:
        TopK(TopKConfig(**kwargs)).diffaccel_setup({"vocab_size": V})
    assert err.value.key == key and "vocabulary size (64)" in err.value.message
    TopK(TopKConfig(k=V, k_keep=V)).diffaccel_setup({"vocab_size": V})  # the whole vocabulary is allowed


def test_config_file_errors_name_file_table_and_key(pipe):
    reg = registry()
    with pytest.raises(ConfigError, match=r"x.toml: \[\[strategy\]\] #1 \(topk\): key 'k_keep': must be at least k"):
        diffaccel.parse_config({"model": {"adapter": "text"}, "strategy": [{"use": "topk", "k": 5, "k_keep": 3}]},
                               source="x.toml", registry=reg)
    cfg = diffaccel.parse_config({"model": {"adapter": "text"}, "strategy": [{"use": "topk", "k": 100, "k_keep": 0}]},
                                 source="x.toml", registry=reg)
    with pytest.raises(ConfigError, match=r"\(topk\): key 'k': must be at most the vocabulary size \(64\)"):
        with diffaccel.apply(pipe, cfg, registry=reg):
            pass


def test_registered_with_documented_fields():
    (row,) = registry().describe()
    assert row["name"] == "topk" and row["requires"] == ["token-logits"]
    assert {f["name"]: f["default"] for f in row["fields"]} == {
        "k": 5, "temperature": 1.0, "k_keep": 128, "at_steps": False, "at_finalize": True, "rank": "model"}
    assert all(f["doc"] for f in row["fields"])


# ---- sampling --------------------------------------------------------------------------------

def test_draws_follow_the_renormalised_topk_distribution():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.5, -1.0, -2.0]).expand(1, 4000, -1)
    gens = [torch.Generator().manual_seed(0)]
    for temperature in (1.0, 0.5):
        counts = torch.bincount(draw_topk(logits, 3, temperature, gens).flatten(), minlength=6).float() / 4000
        expected = torch.cat([(logits[0, 0, :3] / temperature).softmax(-1), torch.zeros(3)])
        assert torch.allclose(counts, expected, atol=0.03), (counts, expected)


def test_self_similarity():
    assert self_similarity(["a b c d", "a b c d"]) == 1.0
    assert self_similarity(["a b c", "x y z"]) == 0.0
    assert self_similarity([[1, 2, 3], [1, 2, 4]]) == pytest.approx(1 / 3)


@pytest.mark.parametrize("rank", ["model", "gumbel"])
def test_same_seed_same_tokens_other_seed_other_tokens(pipe, rank):
    topk = TopK(TopKConfig(k=5, k_keep=32, at_steps=True, rank=rank))
    a, b = generate(pipe, [topk], seed=3), generate(pipe, [topk], seed=3)
    assert torch.equal(a.tokens, b.tokens)
    assert not torch.equal(a.tokens, generate(pipe, [topk], seed=4).tokens)
    assert not torch.equal(a.tokens, generate(pipe, seed=3).tokens)  # it does change the argmax text


@pytest.mark.parametrize("rank", ["model", "gumbel"])
def test_batch_rows_draw_independently_and_match_single_rows(pipe, rank):
    topk = TopK(TopKConfig(k=5, k_keep=32, at_steps=True, rank=rank))
    batch = generate(pipe, [topk], seed=10, batch=3)
    for r in range(3):
        assert torch.equal(batch.tokens[r], generate(pipe, [topk], seed=10 + r).tokens[0])
    assert len({tuple(row.tolist()) for row in batch.tokens}) == 3
    assert len({tuple(row.tolist()) for row in generate(pipe, seed=10, batch=3).tokens}) == 1  # argmax: alike
    rows = [row.tolist() for row in batch.tokens]  # no prompt: every position is generated
    assert batch.report["strategies"]["topk"]["self_similarity"] == pytest.approx(self_similarity(rows))
    assert self_similarity(rows) < 1


def test_k1_model_rank_is_argmax_decoding(pipe):
    topk = TopK(TopKConfig(k=1, k_keep=None, at_steps=True))
    assert torch.equal(generate(pipe, [topk], seed=1, batch=2).tokens, generate(pipe, seed=1, batch=2).tokens)


def test_finalize_draws_only_where_the_default_takes_the_argmax():
    cont = tiny_pipeline("continuous")
    topk = TopK(TopKConfig(k=5, k_keep=None))
    base, out = generate(cont, seed=0, batch=2, prompt="ab"), generate(cont, [topk], seed=0, batch=2, prompt="ab")
    assert out.report["strategies"]["topk"]["finalize_drawn"] == 2 * (N - 2)
    assert torch.equal(out.tokens[:, :2], base.tokens[:, :2])  # the prompt stays
    assert not torch.equal(out.tokens, base.tokens)
    assert torch.equal(out.tokens, generate(cont, [topk], seed=0, batch=2, prompt="ab").tokens)
    # the masked sampler commits every position itself: finalize keeps its tokens
    masked = tiny_pipeline()
    m = generate(masked, [topk], seed=0)
    assert m.report["strategies"]["topk"]["finalize_drawn"] == 0
    assert torch.equal(m.tokens, generate(masked, seed=0).tokens)


# ---- truncation ------------------------------------------------------------------------------

class Spy:
    """Records the logits it is handed (put before topk: the raw ones; after: the truncated ones)."""

    def __init__(self, name):
        self.name, self.seen = name, []

    @hookimpl
    def diffaccel_denoiser_output(self, run, output):
        # truncated logits come as TopKLogits (values, indices); compare them in dense form
        self.seen.append(output.dense() if isinstance(output, TopKLogits) else output.clone())


@pytest.mark.parametrize("kind", ["masked", "continuous"])
def test_truncation_keeps_the_k_keep_largest_logits_and_holds_only_them(kind):
    before, after = Spy("before"), Spy("after")
    out = generate(tiny_pipeline(kind), [before, TopK(TopKConfig(k_keep=8, at_finalize=False)), after], seed=2, batch=2)
    assert len(after.seen) == 16
    for raw, cut in zip(before.seen, after.seen):
        vals, idx = raw.topk(8, dim=-1)
        assert int(torch.isfinite(cut).sum(-1).min()) == int(torch.isfinite(cut).sum(-1).max()) == 8
        assert torch.equal(cut.gather(-1, idx), vals)
    m = out.report["strategies"]["topk"]
    assert m["held_values_per_step"] == 2 * N * 8 and m["full_values_per_step"] == 2 * N * V
    assert m["held_bytes_per_step"] == 2 * N * 8 * (4 + 8)  # float32 values + int64 indices, counted honestly
    assert m["held_ratio"] == pytest.approx(V * 4 / (8 * 12))
    assert m["steps_truncated"] == 16


def test_truncation_to_the_whole_vocabulary_changes_nothing(pipe):
    out = generate(pipe, [TopK(TopKConfig(k_keep=V, at_finalize=False))], seed=2, batch=2)
    assert torch.equal(out.tokens, generate(pipe, seed=2, batch=2).tokens)


def test_no_truncation_no_sampling_leaves_the_logits_alone(pipe):
    spy = Spy("after")
    out = generate(pipe, [TopK(TopKConfig(k_keep=0, at_finalize=False)), spy], seed=0)
    assert all(bool(torch.isfinite(x).all()) for x in spy.seen)
    assert out.report["strategies"]["topk"]["steps_truncated"] == 0


def test_alone_through_a_config_and_the_pipeline_is_untouched_afterwards(pipe):
    reg = registry()
    cfg = diffaccel.parse_config({"model": {"adapter": "text", "temperature": 0},
                                  "strategy": [{"use": "topk", "k": 3, "k_keep": 16, "at_steps": True, "temperature": 0.7}]},
                                 registry=reg)
    before = generate(pipe, seed=5).tokens
    with diffaccel.apply(pipe, cfg, registry=reg):
        out = pipe(length=N, steps=16, temperature=0.0, seed=5, progress=False)
    assert out.report["strategies"]["topk"]["steps_sampled"] == 16
    assert not math.isnan(out.report["strategies"]["topk"]["seconds"])
    assert torch.equal(generate(pipe, seed=5).tokens, before)


@pytest.mark.parametrize("kind", ["masked", "continuous"])
def test_composes_with_time_anchor_in_one_config(kind):
    """topk truncation with time-anchor's partial computation: both run, both report, and the
    sampler still draws only kept tokens."""
    anchor = pytest.importorskip("diffaccel_time_anchor", reason="the time-anchor plugin is not installed")
    reg = registry()
    reg.register_plugin(anchor, name="time-anchor")
    model = {"adapter": "text", "checkpoint": "unused", "length": N, "steps": 16, "temperature": 0.0}
    cfg = diffaccel.parse_config({"model": model, "strategy": [{"use": "topk", "k": 3, "k_keep": 8, "at_finalize": False},
                                                               {"use": "time-anchor", "warmup": 2, "threshold": 0.9, "neighbors": 0}]}, registry=reg)
    pipe = tiny_pipeline(kind)
    with diffaccel.apply(pipe, cfg, registry=reg):
        out = pipe(length=N, steps=16, seed=0, temperature=0.0, progress=False)
    assert set(out.report["strategies"]) >= {"topk", "time-anchor"}
    assert out.report["strategies"]["topk"]["steps_truncated"] == 16
    assert out.report["counters"]["fraction_computed"] < 1.0  # time-anchor really narrowed layers
