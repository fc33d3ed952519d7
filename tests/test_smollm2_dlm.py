"""smollm2-dlm: the adaptation recipe (adapters/text/training/adapt.py) and the delta loader
(adapters/text/families/smollm2_dlm.py), on a tiny random LLaMA base saved with save_pretrained."""

from __future__ import annotations

import json
import math

import pytest
import torch

from diffaccel_models.text.training import adapt
from diffaccel.adapters.text.families import smollm2_dlm as dlm
from diffaccel.adapters.text.families.dispatch import load_pipeline
from diffaccel.contract.errors import ModelLoadError

#: training needs peft (the 'adapt' extra, which make setup installs)
needs_peft = pytest.mark.skipif(__import__("importlib").util.find_spec("peft") is None,
                                reason="peft not installed (pip install -e '.[adapt]')")

WORDS = ["a", "the", "of", "person", "who", "act", "state", "quality", "thing", "small", "large", "animal", "plant",
         "water", "made", "used", "to", "in", "or", "and", ":"]
VOCAB = ["<|endoftext|>", "<empty_output>", "[UNK]", *WORDS]
LINES = ["person : a person who act", "water : a thing made of water", "animal : a small animal", "the plant made water",
         "act : the act of a person", "state : a state or quality", "thing : a large thing used to act",
         "the small animal and the large plant", "quality : the quality of water", "plant : a plant used in water"]


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", eos_token="<|endoftext|>",
                                   additional_special_tokens=["<empty_output>"])


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny random LLaMA causal LM (tied head, grouped-query attention) saved as a folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    conf = LlamaConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("base") / "tiny-llama"
    LlamaForCausalLM(conf).save_pretrained(path)
    _tokenizer().save_pretrained(path)
    return path


def _cfg(out, base, **kw):
    return adapt.AdaptConfig(out=str(out), base=str(base), rank=2, alpha=4.0, batch=4, max_tokens=12, steps=3,
                             checkpoint_every=1, lr=1e-2, warmup=1, **kw)


@pytest.fixture(scope="module")
def delta(base, tmp_path_factory):
    """A random rank-2 delta folder on the tiny base, written as ``adapt.export`` writes one."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    gen = torch.Generator().manual_seed(1)
    state = {"mask_embedding": torch.randn(32, generator=gen).half()}
    for name, (out, inp) in dlm.projection_shapes(LlamaConfig.from_pretrained(str(base))).items():
        state[f"{name}.lora_A"] = (torch.randn(2, inp, generator=gen) * 0.3).half()
        state[f"{name}.lora_B"] = (torch.randn(out, 2, generator=gen) * 0.3).half()
    path = tmp_path_factory.mktemp("delta") / "delta"
    path.mkdir()
    save_file(state, str(path / dlm.DELTA_FILE))
    (path / dlm.CONFIG_FILE).write_text(json.dumps({
        "diffaccel_delta": dlm.NAME, "base": str(base), "rank": 2, "alpha": 4.0, "mask_token": dlm.MASK_TOKEN,
        "start_token": dlm.START_TOKEN, "targets": list(dlm.TARGETS)}))
    return path


@pytest.fixture(scope="module")
def trained(base, tmp_path_factory):
    """A run of 3 training steps on the tiny base, and its exported delta folder."""
    pytest.importorskip("peft")
    root = tmp_path_factory.mktemp("run")
    adapt.train(_cfg(root / "run", base), lines=LINES)
    return root / "run", adapt.export(root / "run", root / "delta", base=str(base))


def test_rows_are_one_line_each_never_cut(base):
    tok = _tokenizer()
    rows = adapt.encode_rows(tok, ["a b", "person who act", "the " * 20], start_id=0, max_tokens=5)
    # "a b": "b" is unknown but still a token; the 20-word line does not fit and is left out, not cut
    assert rows == [[0, VOCAB.index("a"), 2], [0, VOCAB.index("person"), VOCAB.index("who"), VOCAB.index("act")]]


def test_noise_masks_text_only_at_least_one_per_row():
    ids = torch.tensor([[0, 5, 6, 7, 0, 0], [0, 5, 6, 7, 8, 9]])
    keep = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    for s in range(50):
        xt, masked, t = adapt.noise(ids, keep, mask_id=1, gen=torch.Generator().manual_seed(s))
        assert not masked[:, 0].any() and not masked[~keep].any()  # never the start token, never padding
        assert masked.any(1).all()
        assert torch.equal(xt == 1, masked)


def test_padding_changes_nothing_for_the_real_tokens(base):
    """A short row padded in a batch computes what it computes alone: the layout the sampler sees."""
    model, _ = dlm.load_base(base)
    emb = torch.randn(32)
    short = torch.tensor([[0, 5, 1, 7]])
    long = torch.tensor([[0, 5, 1, 7, 8, 1, 9]])
    ids, keep = adapt.collate([short[0].tolist(), long[0].tolist()], pad_id=0)
    both = adapt.hidden_states(model, ids, keep, 1, emb)
    alone = adapt.hidden_states(model, short, torch.ones_like(short, dtype=torch.bool), 1, emb)
    assert torch.allclose(both[0, :4], alone[0], atol=1e-5)
    unmasked = adapt.hidden_states(model, ids, torch.ones_like(keep), 1, emb)  # padding attended to: differs
    assert not torch.allclose(unmasked[0, :4], alone[0], atol=1e-3)


@needs_peft
def test_resume_continues_the_same_run(base, tmp_path):
    import attrs

    adapt.train(attrs.evolve(_cfg(tmp_path / "straight", base), steps=4), lines=LINES)
    adapt.train(attrs.evolve(_cfg(tmp_path / "split", base), steps=2), lines=LINES)
    adapt.train(attrs.evolve(_cfg(tmp_path / "split", base), steps=4), lines=LINES)
    a = torch.load(tmp_path / "straight" / "state.pt", weights_only=False)
    b = torch.load(tmp_path / "split" / "state.pt", weights_only=False)
    assert [r["ce"] for r in a["log"]] == pytest.approx([r["ce"] for r in b["log"]], rel=1e-5)
    for k in a["lora"]:
        assert torch.allclose(a["lora"][k], b["lora"][k], atol=1e-6), k
    assert (tmp_path / "split" / "curves.png").is_file()


@needs_peft
def test_loaded_delta_equals_the_trained_model(base, trained):
    """The merged pipeline's logits at p are the trained LoRA model's at p - 1 (the AR head kept)."""
    run, delta = trained
    st = torch.load(run / "state.pt", weights_only=False)
    pipe = load_pipeline(str(delta))
    den = pipe.denoiser
    assert den.logit_shift == 1 and den.mask_id == 1 and 1 in den.special_ids
    model, _ = dlm.load_base(base)
    adapt.with_lora(model, 2, 4.0)
    adapt.set_lora_state(model, {k: v.half().float() for k, v in st["lora"].items()})  # as shipped: fp16
    ids = torch.tensor([[0, 5, 1, 7, 1, 9]])
    with torch.no_grad():
        want = model.lm_head(adapt.hidden_states(model, ids, torch.ones_like(ids, dtype=torch.bool), 1,
                                                 st["mask_embedding"].half().float()))
        from diffaccel.adapters.text.sampling.model import KVCache

        h = den.embed(ids)
        for i in range(den.n_layers):
            h = den.block(i, h, None, KVCache())
        got = den.logits(h)
    assert torch.allclose(got[:, :, 2:], want[:, :, 2:], atol=1e-4)  # the mask row of the tied head differs by design
    assert not torch.allclose(st["lora"][next(k for k in st["lora"] if k.endswith("lora_B"))], torch.zeros(1))


def test_merge_adds_the_scaled_low_rank_product(base, delta):
    """Each target projection of the loaded model is W + (alpha / r) B A; the mask token's
    embedding row is the delta's; nothing else moved."""
    from safetensors.torch import load_file

    pipe = load_pipeline(str(delta))
    model, _ = dlm.load_base(base)
    d = {k: v.float() for k, v in load_file(str(delta / dlm.DELTA_FILE)).items()}
    merged = pipe.denoiser.model.state_dict()
    for name, prm in model.state_dict().items():
        module = name.rsplit(".", 1)[0]
        if f"{module}.lora_A" in d:
            assert torch.allclose(merged[name], prm + 2.0 * d[f"{module}.lora_B"] @ d[f"{module}.lora_A"], atol=1e-6), name
        elif name == "model.embed_tokens.weight":
            assert torch.equal(merged[name][1], d["mask_embedding"]) and torch.equal(merged[name][2:], prm[2:])
        elif name != "lm_head.weight":
            assert torch.equal(merged[name], prm), name


def test_generate_from_a_delta_folder(delta):
    pipe = load_pipeline(str(delta))
    out = pipe([dlm.START_TOKEN] * 2, length=8, steps=7, seed=0, progress=False)
    assert out.tokens.shape == (2, 8) and (out.tokens[:, 0] == 0).all()
    assert not (out.tokens[:, 1:] == 1).any()  # nothing left masked, and the mask never drawn


def test_delta_size_of_the_shipped_rank():
    """Rank 16 on all seven projections of SmolLM2-135M's 30 layers fits the issue's 10 MB in fp16."""
    from transformers import LlamaConfig

    conf = LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                       intermediate_size=1536, head_dim=64)
    n = sum(16 * (o + i) for o, i in dlm.projection_shapes(conf).values()) + 576
    assert 2 * n <= 10_000_000 < 2 * sum(20 * (o + i) for o, i in dlm.projection_shapes(conf).values())


# ---- bad input: one line naming the file, nothing half-loaded --------------------------------

def _copy(delta, tmp_path):
    import shutil

    dst = tmp_path / "delta"
    shutil.copytree(delta, dst)
    return dst


@pytest.fixture
def no_base_load(monkeypatch):
    def refuse(folder):
        raise AssertionError("the base's weights loaded before the delta was checked")
    monkeypatch.setattr(dlm, "load_base", refuse)


def test_missing_base_gguf(delta, tmp_path, monkeypatch, no_base_load):
    d = _copy(delta, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "base": "smollm2"}))
    from diffaccel.adapters.text.loading import gguf

    monkeypatch.setattr(gguf, "smollm2_gguf", lambda: None)
    with pytest.raises(ModelLoadError, match=r"config\.json: base 'smollm2' needs the GGUF file SmolLM2-135M-Instruct\.Q4_1\.gguf"):
        load_pipeline(str(d))


def test_missing_base_folder(delta, tmp_path, no_base_load):
    d = _copy(delta, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "base": str(tmp_path / "nowhere")}))
    with pytest.raises(ModelLoadError, match="key 'base'.*nowhere"):
        load_pipeline(str(d))


def test_delta_shapes_that_do_not_fit_the_base(delta, tmp_path, no_base_load):
    from safetensors.torch import load_file, save_file

    d = _copy(delta, tmp_path)
    state = load_file(str(d / dlm.DELTA_FILE))
    name = "model.layers.1.mlp.down_proj.lora_B"
    state[name] = torch.zeros(33, 2, dtype=torch.float16)  # the base's hidden size is 32
    save_file(state, str(d / dlm.DELTA_FILE))
    with pytest.raises(ModelLoadError, match=rf"delta\.safetensors: tensor '{name}' has shape \(33, 2\), the base needs \(32, 2\)"):
        load_pipeline(str(d))


def test_delta_of_another_rank_or_depth(delta, tmp_path, no_base_load):
    d = _copy(delta, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "rank": 4}))
    with pytest.raises(ModelLoadError, match=r"has shape \(2, 32\), the base needs \(4, 32\)"):
        load_pipeline(str(d))
    from safetensors.torch import load_file, save_file

    (d / "config.json").write_text(json.dumps(cfg))
    state = {k: v for k, v in load_file(str(d / dlm.DELTA_FILE)).items() if ".layers.1." not in k}
    save_file(state, str(d / dlm.DELTA_FILE))
    with pytest.raises(ModelLoadError, match=r"delta\.safetensors: missing model\.layers\.1\.\S+ \(14 missing, 0 unexpected"):
        load_pipeline(str(d))


def test_corrupt_delta(delta, tmp_path, no_base_load):
    d = _copy(delta, tmp_path)
    data = (d / dlm.DELTA_FILE).read_bytes()
    (d / dlm.DELTA_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"delta\.safetensors: not a readable safetensors file"):
        load_pipeline(str(d))
    (d / dlm.DELTA_FILE).unlink()
    with pytest.raises(ModelLoadError, match=r"delta\.safetensors: missing"):
        load_pipeline(str(d))


def test_non_finite_delta(delta, tmp_path, no_base_load):
    from safetensors.torch import load_file, save_file

    d = _copy(delta, tmp_path)
    state = load_file(str(d / dlm.DELTA_FILE))
    state["mask_embedding"][3] = math.nan
    save_file(state, str(d / dlm.DELTA_FILE))
    with pytest.raises(ModelLoadError, match="'mask_embedding' holds NaN"):
        load_pipeline(str(d))


def test_cli_exit_2_one_line(delta, tmp_path, capsys):
    from diffaccel.cli.entry import main

    d = _copy(delta, tmp_path)
    (d / dlm.DELTA_FILE).write_bytes(b"not safetensors")
    conf = tmp_path / "c.toml"
    conf.write_text(f'[model]\nadapter = "text"\ncheckpoint = "{d}"\nlength = 8\nsteps = 4\n')
    assert main(["generate", str(conf)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "delta.safetensors" in err[0] and "Traceback" not in err[0]


# ---- the go/no-go evaluation -----------------------------------------------------------------

class _Pipe:
    """Records the calls of ``sample_like`` and writes ``n`` words per row."""

    def __init__(self, words):
        self.calls, self.words = [], words

    def __call__(self, prompts, length, steps, seed, temperature, progress):
        from types import SimpleNamespace

        self.calls.append((len(prompts), length, steps, seed))
        return SimpleNamespace(texts=[" ".join(self.words(length - 1, seed + r)) for r in range(len(prompts))])


def test_samples_imitate_the_lengths_full_and_half_steps():
    from diffaccel_models.text.training import dlm_eval

    pipe = _Pipe(lambda n, s: [f"w{s}"] * n)
    texts = dlm_eval.sample_like(pipe, [5, 3, 5, 8], seed=100, steps_of=lambda n: n)
    assert [len(t.split()) for t in texts] == [5, 3, 5, 8]
    assert sorted(c[:3] for c in pipe.calls) == [(1, 4, 3), (1, 9, 8), (2, 6, 5)]  # one batch per length
    assert len({w for t in texts for w in t.split()}) == 4  # every row its own seed
    pipe = _Pipe(lambda n, s: ["x"] * n)
    dlm_eval.sample_like(pipe, [5, 3], seed=0, steps_of=lambda n: max(1, math.ceil(n / 2)))
    assert [c[2] for c in pipe.calls] == [2, 3]


def test_verdict_follows_the_issue_bounds(monkeypatch):
    from diffaccel_models.text.training import dlm_eval
    from diffaccel.adapters.text.evaluation.judge import Scores

    class Judge:  # perplexity e^(nats per token): a line's "nats" is its count of 'x' words
        def score(self, lines):
            return Scores(nll=[float(line.split().count("x")) for line in lines], tokens=[len(line.split()) for line in lines])

    real = [(f"r{i} s{i} t{i} u{i}", 4) for i in range(8)]
    monkeypatch.setattr(dlm_eval, "heldout_targets", lambda encode, n, offset: real[:n])
    monkeypatch.setattr(dlm_eval, "confidence", lambda pipe, targets, seed: {"median_top1_prob": 0.5, "top1_accuracy": 0.5})
    tok = type("T", (), {"encode": staticmethod(lambda s: s.split())})

    def run(words):
        pipe = _Pipe(words)
        pipe.tokenizer = tok
        return dlm_eval.evaluate(pipe, Judge(), samples=8, seed=0)

    good = run(lambda n, s: [f"a{s}", f"b{s}", f"c{s}", f"d{s}"][:n])  # as fluent and as diverse as the real lines
    assert good["pass"] and good["criteria"]["distinct2_full_over_real"][0] == pytest.approx(1.0)
    repeated = run(lambda n, s: ["the", "person", "the", "person"][:n])  # fools the judge, not distinct-2
    assert not repeated["pass"] and not repeated["criteria"]["distinct2_full_over_real"][2]
    assert repeated["criteria"]["gen_ppl_full_over_real"][2]


def test_block_diffusion_and_prefix_cache_on_a_delta(delta):
    """The LLaMA-class options apply to a delta-loaded model: semi-autoregressive blocks with the
    prefix cache fill every position (the cache's exactness is tested in test_llama_denoiser)."""
    pipe = load_pipeline(str(delta))
    kw = dict(length=12, steps=8, seed=3, block_size=4, progress=False)
    cached = pipe([dlm.START_TOKEN] * 2, prefix_cache=True, **kw)
    assert (cached.tokens[:, 0] == 0).all() and not (cached.tokens == 1).any()
    plain = pipe([dlm.START_TOKEN] * 2, **kw)
    assert plain.tokens.shape == cached.tokens.shape


def test_confidence_reads_the_shifted_head():
    """A denoiser whose hidden state at p names the token at p + 1 is sure and right everywhere
    once the shift is applied; read unshifted it would be right almost nowhere."""
    from types import SimpleNamespace

    from diffaccel_models.text.training import dlm_eval

    lines = [("3 4 5 6 7 8", 6), ("9 8 7 6 5 4 3 2", 8)]
    truth = {}

    class Den:
        mask_id, n_layers, logit_shift = 1, 0, 1

        def embed(self, x):
            return x

        def logits(self, h):
            ids = truth[h.shape[1]]
            nxt = torch.cat([ids[:, 1:], ids[:, -1:]], 1)
            return torch.nn.functional.one_hot(nxt, 10).float() * 20

    class Tok:
        def encode(self, text):
            ids = [0] if text == dlm.START_TOKEN else [int(w) for w in text.split()]
            if text != dlm.START_TOKEN:
                truth[len(ids) + 1] = torch.tensor([[0, *ids]])
            return ids

    pipe = SimpleNamespace(denoiser=Den(), tokenizer=Tok())
    c = dlm_eval.confidence(pipe, lines, seed=0)
    assert c["top1_accuracy"] == 1.0 and c["median_top1_prob"] > 0.99
    pipe.denoiser.logit_shift = 0
    assert dlm_eval.confidence(pipe, lines, seed=0)["top1_accuracy"] < 0.2


def test_facts_without_weights(delta, no_base_load):
    """``diffaccel check`` reads a delta's facts from its base's config.json, loading nothing."""
    from diffaccel.adapters.text.families.dispatch import model_facts

    facts = model_facts(str(delta))
    assert (facts.kind, facts.vocab_size, facts.n_layers, facts.max_len) == ("masked", len(VOCAB), 2, 64)
