"""The strategy on diffaccel's tiny text model (character tokenizer, 64 tokens, 32 positions):
planning, pinned tokens, the word-boundary guard, the condition vector, metrics, bad input and
composition with topk."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import diffaccel
import diffaccel_bert_cond
from diffaccel import ConfigError, ConfigValueError, hookimpl
from diffaccel.adapters.text.testing import CharTokenizer, tiny_text_pipeline
from diffaccel_bert_cond import BertCond, BertCondConfig, pin_row, spread, term_token_ids, word_continuations
from diffaccel_bert_cond.strategy import guard_word_ends

N = 32
SOURCES = ["velvet soft touch", "mother chinese family"]


def make(tiny_bert, **kw) -> BertCond:
    kw = {"source": SOURCES, "bert": tiny_bert, "max_terms": 2, **kw}
    s = BertCond(BertCondConfig(**kw))
    s.diffaccel_setup({"adapter": "text", "cond_dim": 0})
    return s


def generate(pipe, strategies=(), **kw):
    kw = {"length": N, "steps": 12, "temperature": 1.0, "progress": False, **kw}
    with diffaccel.apply(pipe, strategies=list(strategies)):
        return pipe(**kw)


class Spy:
    """Records, after every step, the tokens, the still-masked and the fixed positions."""

    name = "spy"

    def __init__(self):
        self.steps = []

    @hookimpl
    def diffaccel_post_step(self, run, output):
        masked = output.masked.clone() if output.masked is not None else None
        self.steps.append((output.tokens.clone(), masked, output.fixed.clone()))


def registry():
    import diffaccel_topk

    reg = diffaccel.Registry(load_entrypoints=False)
    reg.register_plugin(diffaccel_bert_cond, name="bert-cond")
    reg.register_plugin(diffaccel_topk, name="topk")
    return reg


# ---- the planner -----------------------------------------------------------------------------

def test_spread_keeps_source_order_and_even_gaps():
    starts = spread([2, 3, 1], 4, 24)
    assert starts == sorted(starts) and starts[0] >= 4
    ends = [s + n for s, n in zip(starts, [2, 3, 1])]
    assert all(e <= s for e, s in zip(ends, starts[1:])) and ends[-1] <= 24
    gaps = [starts[0] - 4] + [s - e for e, s in zip(ends, starts[1:])] + [24 - ends[-1]]
    assert max(gaps[1:-1]) - min(gaps[1:-1]) <= 1  # equal gaps between terms
    assert abs(2 * gaps[0] - gaps[1]) <= 2  # half a gap before the first
    assert spread([3, 2], 0, 5) == [0, 3]  # an exact fit
    with pytest.raises(diffaccel_bert_cond.TermsDoNotFit, match="take 6 tokens but only 5"):
        spread([3, 3], 0, 5)


def test_pin_row_places_ids_and_marks_the_position_after_each_term():
    pinned, after, starts = pin_row([[7, 8], [9]], 2, 12)
    assert starts == spread([2, 1], 2, 12)
    assert pinned[starts[0]:starts[0] + 2].tolist() == [7, 8] and pinned[starts[1]] == 9
    assert int((pinned >= 0).sum()) == 3
    assert after.nonzero().flatten().tolist() == [starts[0] + 2, starts[1] + 1]


def test_terms_are_encoded_as_in_running_text():
    from diffaccel.adapters.text.loading.reference import shipped_path
    from diffaccel.adapters.text.sampling.tokenizer import TextTokenizer

    tok = TextTokenizer.from_file(shipped_path("wordnet-masked") / "tokenizer.json")
    ids = term_token_ids(["organism", "complex organic substances"], tok)
    assert ids[0] == tok.encode(" organism") and tok.tok.id_to_token(ids[0][0]).startswith("▁")
    cont = word_continuations(tok, tok.vocab_size)
    piece = {tok.tok.id_to_token(i): i for i in range(tok.vocab_size)}
    assert not cont[piece["▁organism"]] and cont[piece["ances"]]
    assert not cont[tok.sep_id] and not cont[tok.mask_id]
    assert 0.2 < float(cont.float().mean()) < 0.8


def test_character_tokenizer_continuations_are_letters():
    cont = word_continuations(CharTokenizer(64), 64)
    letters = set(range(5, 31))  # 4 is the space
    assert {i for i in range(64) if cont[i]} == letters


# ---- pinned tokens ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["masked", "continuous"])
def test_pinned_tokens_are_never_remasked_and_are_in_the_output(tiny_bert, kind):
    pipe = tiny_text_pipeline(kind, max_len=N)
    strategy, spy = make(tiny_bert), Spy()
    out = generate(pipe, [strategy, spy], seed=0, batch=2)
    m = out.report["strategies"]["bert-cond"]
    tok = pipe.tokenizer
    for r in range(2):
        terms = m["terms"][r]
        assert terms and m["sources"][r] == r + 1  # row seed r uses source r
        ids = term_token_ids(terms, tok)
        starts = spread([len(i) for i in ids], 0, N)
        pos = torch.cat([torch.arange(s, s + len(i)) for s, i in zip(starts, ids)])
        want = torch.tensor([t for i in ids for t in i])
        assert torch.equal(out.tokens[r, pos], want)
        for tokens, masked, fixed in spy.steps:
            assert bool(fixed[r, pos].all())
            if masked is not None:
                assert not bool(masked[r, pos].any())
                assert torch.equal(tokens[r, pos], want)
        # the terms appear in the output in source order
        text = out.texts[r]
        found = [text.find(" " + t) for t in terms]
        assert all(f >= 0 for f in found) and found == sorted(found)
    assert m["present"] == [[True] * len(t) for t in m["terms"]] and m["key_term_recall"] == 1.0
    assert m["pinned_positions"] == sum(len(i) for r in range(2) for i in term_token_ids(m["terms"][r], tok))


def test_without_the_strategy_the_terms_are_not_there(tiny_bert):
    pipe = tiny_text_pipeline("masked", max_len=N)
    strategy = make(tiny_bert)
    plain = generate(pipe, [], seed=0, batch=2)
    q = strategy.diffaccel_bench_quality([plain], [0])
    assert q["key_term_recall"] < 0.5 and "stage_one_share" not in q and "placement_share" not in q
    out = generate(pipe, [strategy], seed=0, batch=2)
    cond = strategy.diffaccel_bench_quality([out], [0])
    assert cond["key_term_recall"] == 1.0 and 0 < cond["stage_one_share"] < 1
    m = out.report["strategies"]["bert-cond"]  # the pinning's own time over the run's
    assert cond["placement_share"] == pytest.approx(m["place_s"] / m["run_s"])


def test_terms_go_after_the_prompt(tiny_bert):
    pipe = tiny_text_pipeline("masked", max_len=N)
    out = generate(pipe, [make(tiny_bert, max_terms=1)], seed=0, prompt="abc")
    assert out.texts[0].startswith("abc")
    term = out.report["strategies"]["bert-cond"]["terms"][0][0]
    assert out.texts[0].find(" " + term) >= 3


def test_word_boundary_guard_keeps_each_term_a_whole_word(tiny_bert):
    pipe = tiny_text_pipeline("masked", max_len=N)
    cont = word_continuations(pipe.tokenizer, 64)
    for seed in range(4):
        out = generate(pipe, [make(tiny_bert)], seed=seed)
        terms = out.report["strategies"]["bert-cond"]["terms"][0]
        ids = term_token_ids(terms, pipe.tokenizer)
        starts = spread([len(i) for i in ids], 0, N)
        for s, i in zip(starts, ids):
            e = s + len(i)
            if e < N:
                assert not bool(cont[out.tokens[0, e]])
    # off: the guard never runs
    out = generate(pipe, [make(tiny_bert, word_boundary=False)], seed=0)
    assert out.report["strategies"]["bert-cond"]["guard_s"] == 0.0


def test_guard_handles_dense_and_truncated_logits_without_touching_them():
    from diffaccel.adapters.text.sampling.logits import TopKLogits  # noqa: F401  (skipped if the adapter lacks it)

    cont = torch.tensor([False, True, True, False])
    dense = torch.tensor([[[0.0, 5.0, 4.0, 1.0], [0.0, 5.0, 4.0, 1.0]]])
    where = (torch.tensor([0]), torch.tensor([1]))
    out = guard_word_ends(dense, where, cont)
    assert out[0, 1].tolist() == [0.0, -float("inf"), -float("inf"), 1.0] and out[0, 0].tolist() == [0.0, 5.0, 4.0, 1.0]
    assert dense[0, 1, 1] == 5.0  # not modified in place
    trunc = TopKLogits(values=torch.tensor([[[5.0, 4.0], [5.0, 1.0]]]), indices=torch.tensor([[[1, 2], [1, 3]]]), vocab_size=4)
    out = guard_word_ends(trunc, where, cont)
    assert out.values[0, 1].tolist() == [-float("inf"), 1.0] and trunc.values[0, 1, 0] == 5.0
    # every kept token continues the word: leave the position alone rather than leave it nothing
    only = TopKLogits(values=torch.tensor([[[5.0, 4.0], [5.0, 4.0]]]), indices=torch.tensor([[[1, 2], [1, 2]]]), vocab_size=4)
    assert guard_word_ends(only, where, cont).values[0, 1].tolist() == [5.0, 4.0]


# ---- the condition vector --------------------------------------------------------------------

def test_condition_vector_drives_models_with_condition_gating(tmp_path, tiny_bert_builder):
    build_tiny_bert = tiny_bert_builder
    from diffaccel.adapters.text.sampling.denoisers import ReferenceDenoiser
    from diffaccel.adapters.text.sampling.model import TextDiffusionConfig, TextDiffusionLM
    from diffaccel.adapters.text.sampling.pipeline import TextDiffusionPipeline

    bert = build_tiny_bert(tmp_path / "b16", hidden=16)
    torch.manual_seed(0)
    model = TextDiffusionLM(TextDiffusionConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, max_len=N, mask_id=2, cond_dim=16))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    pipe = TextDiffusionPipeline(ReferenceDenoiser(model.eval()), CharTokenizer(64))
    info = diffaccel.adapters.text.adapter.TextAdapter.info(pipe)
    assert info["cond_dim"] == 16

    def strategy(**kw):
        s = BertCond(BertCondConfig(source=SOURCES, bert=bert, max_terms=1, **kw))
        s.diffaccel_setup(info)
        return s

    seen = []

    class Grab:
        name = "grab"

        @hookimpl
        def diffaccel_post_step(self, run, output):
            seen.append(None if run.condition is None else run.condition.clone())

    on = generate(pipe, [strategy(), Grab()], seed=0, batch=2, temperature=0.0)
    assert seen[0].shape == (2, 16) and not torch.allclose(seen[0][0], seen[0][1])
    assert on.report["strategies"]["bert-cond"]["vector_used"] is True
    seen.clear()
    off = generate(pipe, [strategy(vector=False), Grab()], seed=0, batch=2, temperature=0.0)
    assert seen[0] is None and off.report["strategies"]["bert-cond"]["vector_used"] is False
    assert not torch.equal(on.tokens, off.tokens)  # the vector changed the model's choices
    with pytest.raises(ConfigValueError) as err:
        BertCond(BertCondConfig(source="velvet", bert=build_tiny_bert(tmp_path / "b32", hidden=32))).diffaccel_setup(info)
    assert err.value.key == "bert" and "hidden size 32 differs" in err.value.message and "cond_dim 16" in err.value.message


def test_shipped_models_have_no_condition_gating(tiny_bert):
    pipe = tiny_text_pipeline("masked", max_len=N)
    out = generate(pipe, [make(tiny_bert)], seed=0)
    assert out.report["strategies"]["bert-cond"]["vector_used"] is False


# ---- metrics ---------------------------------------------------------------------------------

def test_run_metrics_list_terms_presence_and_stage_one_share(tiny_bert):
    pipe = tiny_text_pipeline("masked", max_len=N)
    m = generate(pipe, [make(tiny_bert, ngram_max=1)], seed=1).report["strategies"]["bert-cond"]
    assert m["sources"] == [2] and len(m["terms"][0]) == 2 and len(m["scores"][0]) == 2
    assert 0 < m["stage_one_s"] < m["run_s"] and m["stage_one_share"] == pytest.approx(m["stage_one_s"] / m["run_s"])
    assert m["encoder_load_s"] > 0
    assert m["pinned_computed_share"] == m["free_computed_share"] == 1.0  # every step computed everything


def test_recall_reports_missing_terms_when_a_later_strategy_overwrites_them(tiny_bert):
    class Clobber:
        """Puts the mask id's neighbour everywhere at finalize: the pinned tokens still win."""

        name = "clobber"

        @hookimpl
        def diffaccel_finalize(self, run, final):
            final.tokens = torch.full_like(final.draft, 40)

    pipe = tiny_text_pipeline("masked", max_len=N)
    out = generate(pipe, [make(tiny_bert), Clobber()], seed=0)
    m = out.report["strategies"]["bert-cond"]
    assert m["key_term_recall"] == 1.0  # pinned positions come from the plan, as the pipeline returns them
    assert "<40>" in out.texts[0]


# ---- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, key, words", [
    ({"source": ""}, "source", "the source is empty"),
    ({"source": "   "}, "source", "the source is empty"),
    ({"source": ["ok text", " "]}, "source", "empty (item #2)"),
    ({"source": []}, "source", "must not be an empty list"),
    ({}, "source", "neither is set"),
    ({"source": "x y", "source_file": __file__}, "source", "both are set"),
    ({"source_file": "/nonexistent/src.txt"}, "source_file", "no such file: /nonexistent/src.txt"),
    ({"source": "x y", "max_terms": 0}, "max_terms", "[1, inf)"),
    ({"source": "x y", "diversity": 1.5}, "diversity", "[0.0, 1.0]"),
    ({"source": "x y", "ngram_max": 0}, "ngram_max", "[1, 6]"),
    ({"source": "x y", "pooling": "max"}, "pooling", "'mean', 'cls'"),
    ({"source": "x y", "bert": ""}, "bert", "must not be empty"),
])
def test_bad_values_name_the_key(kwargs, key, words):
    with pytest.raises(ConfigValueError) as err:
        BertCondConfig(**kwargs)
    assert err.value.key == key and words in err.value.message


def test_empty_source_file_names_the_file(tmp_path):
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(ConfigValueError) as err:
        BertCondConfig(source_file=str(tmp_path / "empty.txt"))
    assert err.value.key == "source_file" and "empty.txt is empty" in err.value.message
    (tmp_path / "a.txt").write_text("velvet soft\n")
    (tmp_path / "b.txt").write_text("mother chinese\n")
    assert BertCondConfig(source_file=[str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]).sources() == ["velvet soft", "mother chinese"]


def test_a_source_of_stop_words_is_rejected_at_setup(tiny_bert):
    with pytest.raises(ConfigValueError) as err:
        make(tiny_bert, source=["velvet", "it is of the"])
    assert err.value.key == "source" and "source #2 has no candidate key term" in err.value.message


def test_more_terms_than_the_output_holds_names_max_terms(tiny_bert):
    pipe = tiny_text_pipeline("masked", max_len=N)
    with pytest.raises(ConfigError, match=r"key 'max_terms': the \d key terms? of source #1 take \d+ tokens but only 8 "
                                          r"positions are free \(length 8, prompt 0\); lower max_terms or raise \[model\] length"):
        generate(pipe, [make(tiny_bert)], seed=0, length=8)


def test_unet_adapter_is_refused_in_the_config_and_at_run_time(tiny_bert):
    with pytest.raises(ConfigError, match=r"x.toml: \[\[strategy\]\] #1 \(bert-cond\): strategy 'bert-cond' requires capability 'token-logits', which adapter 'unet' does not declare"):
        diffaccel.parse_config({"model": {"adapter": "unet"}, "strategy": [{"use": "bert-cond", "source": "a b"}]},
                               source="x.toml", registry=registry())
    with pytest.raises(ConfigValueError, match="this model lacks capability 'token-logits'"):
        BertCond(BertCondConfig(source="velvet", bert=tiny_bert)).diffaccel_setup({"capabilities": ["block-stack"]})


def test_cli_prints_one_line_naming_file_table_and_key(tmp_path, tiny_bert):
    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\nadapter = "text"\n[[strategy]]\nuse = "bert-cond"\nsource = ""\n')
    proc = subprocess.run([sys.executable, "-m", "diffaccel.cli.entry", "check", str(bad)], capture_output=True, text=True,
                          env={**__import__("os").environ, "DIFFACCEL_PLUGINS": "bert-cond"})
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"diffaccel: error: {bad}: [[strategy]] #1 (bert-cond): key 'source': the source is empty; "
                                   "give the text whose key terms must appear")
    notbert = tmp_path / "notbert.toml"
    (tmp_path / "gpt").mkdir()
    (tmp_path / "gpt" / "config.json").write_text('{"model_type": "gpt2"}')
    notbert.write_text(f'[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\n[[strategy]]\nuse = "bert-cond"\n'
                       f'source = "velvet"\nbert = "{tmp_path / "gpt"}"\n')
    proc = subprocess.run([sys.executable, "-m", "diffaccel.cli.entry", "generate", str(notbert), "--no-progress"], capture_output=True,
                          text=True, env={**__import__("os").environ, "DIFFACCEL_PLUGINS": "bert-cond"})
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert f"{notbert}: [[strategy]] #1 (bert-cond): key 'bert':" in proc.stderr and "not a BERT-family encoder" in proc.stderr


def test_registered_with_documented_fields():
    (row,) = [r for r in registry().describe() if r["name"] == "bert-cond"]
    assert row["requires"] == ["token-logits", "pinned-tokens"]
    assert {f["name"] for f in row["fields"]} == {"source", "source_file", "bert", "max_terms", "ngram_max", "diversity",
                                                   "always_keep", "pooling", "word_boundary", "vector", "pin", "place_by", "vector_until"}
    assert all(f["doc"] for f in row["fields"])


# ---- composition -----------------------------------------------------------------------------

@pytest.mark.parametrize("order", [("bert-cond", "topk"), ("topk", "bert-cond")])
def test_composes_with_topk_in_one_config(tiny_bert, order):
    pipe = tiny_text_pipeline("masked", max_len=N)
    tables = {"bert-cond": {"use": "bert-cond", "source": SOURCES, "bert": tiny_bert, "max_terms": 2},
              "topk": {"use": "topk", "k": 5, "k_keep": 16, "at_steps": True, "temperature": 0.7}}
    cfg = diffaccel.parse_config({"model": {"adapter": "text", "length": N, "temperature": 0.0},
                                  "strategy": [tables[n] for n in order]}, source="c.toml", registry=registry())
    with diffaccel.apply(pipe, cfg, registry=registry()):
        out = pipe(length=N, steps=12, seed=0, batch=2, temperature=0.0, progress=False)
    m = out.report["strategies"]
    assert m["bert-cond"]["key_term_recall"] == 1.0 and m["topk"]["steps_sampled"] == 12
    cont = word_continuations(pipe.tokenizer, 64)
    for r in range(2):
        ids = term_token_ids(m["bert-cond"]["terms"][r], pipe.tokenizer)
        starts = spread([len(i) for i in ids], 0, N)
        for s, i in zip(starts, ids):
            assert out.tokens[r, s:s + len(i)].tolist() == i
    plain = generate(pipe, [diffaccel_topk_instance()], seed=0, batch=2, temperature=0.0)
    assert not torch.equal(plain.tokens, out.tokens)


def diffaccel_topk_instance():
    from diffaccel_topk import TopK, TopKConfig

    return TopK(TopKConfig(k=5, k_keep=16, at_steps=True, temperature=0.7))


def test_composes_with_swd_and_pinned_positions_are_computed_only_as_neighbours(tiny_bert):
    swd = pytest.importorskip("diffaccel_swd", reason="the swd plugin (plugins/swd) is not installed")
    from diffaccel_topk import TopK, TopKConfig

    pipe = tiny_text_pipeline("masked", max_len=N)
    R = 2
    for seed in range(3):
        spy = Spy()
        spy_computed = []

        class Computed:
            name = "computed"

            @hookimpl
            def diffaccel_post_step(self, run, output):
                spy_computed.append(None if output.computed is None else output.computed.clone())

        # swd's window rule (fresh_commits = false): pinned positions are computed only as neighbours within R
        window = swd.SWD(swd.SWDConfig(R=R, fresh_commits=False))
        strategies = [make(tiny_bert), window, TopK(TopKConfig(k_keep=16)), spy, Computed()]
        out = generate(pipe, strategies, seed=seed, steps=24, batch=1)
        m = out.report["strategies"]
        assert m["bert-cond"]["key_term_recall"] == 1.0
        assert m["swd"]["mean_computed"] < 1.0  # swd did narrow the steps
        skipped_pinned = 0
        pinned = out.report["strategies"]["bert-cond"]["pinned_positions"]
        for (tokens, masked, fixed), computed in zip(spy.steps, spy_computed):
            if computed is None:
                continue
            fx = fixed[0]
            idx = computed[0].nonzero().squeeze(1).tolist()
            own = [p for p in idx if not fx[p]]  # positions computed for their own sake
            for p in idx:
                if fx[p]:
                    assert any(abs(p - q) <= R for q in own), f"pinned position {p} computed with no free position within {R}"
            skipped_pinned += int(fx.sum()) - sum(1 for p in idx if fx[p])
        assert pinned > 0 and skipped_pinned > 0  # pinned positions were left out of some steps
        share = m["bert-cond"]["pinned_computed_share"]
        assert 0 < share < m["bert-cond"]["free_computed_share"] < 1
