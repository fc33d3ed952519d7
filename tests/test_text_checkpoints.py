"""Text adapter: BERT-family masked LMs, loading and its errors, saving the reference model, and the ragged partial step across model families (split from test_text_adapter.py)."""

import pytest
import torch

import diffaccel
from diffaccel import StepPlan, hookimpl
from diffaccel.adapters.text.sampling.model import TextDiffusionConfig, TextDiffusionLM
from diffaccel.adapters.text.testing import tiny_text_pipeline
from diffaccel.cli.entry import main
from diffaccel.contract.errors import ModelLoadError
from diffaccel.testing import run_with


# ---- BERT-family masked LMs -------------------------------------------------------------------

def _tiny_bert(tmp_path, family="bert"):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast, RobertaConfig, RobertaForMaskedLM

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz"])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                     sep_token="[SEP]", mask_token="[MASK]")
    torch.manual_seed(0)
    if family == "bert":
        model = BertForMaskedLM(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           intermediate_size=64, max_position_embeddings=64))
    else:
        model = RobertaForMaskedLM(RobertaConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                 intermediate_size=64, max_position_embeddings=70, pad_token_id=0))
    path = tmp_path / family
    model.save_pretrained(path)
    hf_tok.save_pretrained(path)
    return path, model.eval()


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_bert_family_layerwise_forward_matches_transformers(tmp_path, family):
    from diffaccel.adapters.text.families.dispatch import load_pipeline
    from diffaccel.adapters.text.sampling.pipeline import _RunContext
    from diffaccel.runtime.sequence import NullAccelerator as _NoAccelerator
    from diffaccel.contract.state import RunState

    path, model = _tiny_bert(tmp_path, family)
    pipe = load_pipeline(str(path))
    x = torch.randint(5, 31, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ctx = _RunContext(pipe.denoiser, RunState(adapter="text", num_steps=1, batch_size=2))
        pipe._denoise(ctx, _NoAccelerator(), x, None)
        ref = model(input_ids=x, token_type_ids=torch.zeros_like(x)).logits if family == "bert" else model(input_ids=x).logits
    torch.testing.assert_close(ctx.logits, ref, rtol=1e-4, atol=1e-4)


def test_bert_pipeline_generates_with_hooks_and_partial_positions(tmp_path):
    from diffaccel.adapters.text.families.dispatch import load_pipeline

    path, _ = _tiny_bert(tmp_path)
    pipe = load_pipeline(str(path))

    class Half:
        name = "half"

        @hookimpl
        def diffaccel_pre_step(self, run):
            if run.step:
                m = torch.zeros(run.batch_size, run.info.tokens.length, dtype=torch.bool)
                m[:, 1::2] = True
                return StepPlan(positions=m)

    out = run_with(pipe, [Half()], length=10, steps=5, batch=2)
    assert out.tokens.shape == (2, 10) and not (out.tokens == pipe.denoiser.mask_id).any()
    assert out.report["counters"]["fraction_computed"] < 1.0
    plain = pipe(length=10, steps=5, batch=2, progress=False)
    again = pipe(length=10, steps=5, batch=2, progress=False)
    assert torch.equal(plain.tokens, again.tokens)


def test_missing_model_is_one_clear_error(tmp_path):
    from diffaccel.adapters.text.families.dispatch import load_pipeline

    with pytest.raises(ModelLoadError) as info:
        load_pipeline("nobody/no-such-model-xyz")
    msg = str(info.value)
    assert "\n" not in msg and "nobody/no-such-model-xyz" in msg and "wordnet-masked" in msg
    with pytest.raises(ModelLoadError, match="not a model folder"):
        load_pipeline(str(tmp_path))


def test_not_a_masked_lm_is_rejected(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from diffaccel.adapters.text.families.dispatch import load_pipeline

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ModelLoadError, match="gpt2"):
        load_pipeline(str(tmp_path / "gpt2"))


def test_cli_missing_checkpoint_exits_2(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\nadapter = "text"\ncheckpoint = "nobody/no-such-model-xyz"\n')
    assert main(["generate", str(cfg), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("diffaccel: error: checkpoint 'nobody/no-such-model-xyz'") and err.count("\n") == 1


def test_save_and_load_reference_model(tmp_path):
    from diffaccel.adapters.text.families.dispatch import load_pipeline
    from diffaccel.adapters.text.sampling.tokenizer import TextTokenizer, train_tokenizer

    tok = TextTokenizer(train_tokenizer(["a small dog barks", "a big cat sleeps"] * 20, vocab_size=60))
    model = TextDiffusionLM(TextDiffusionConfig(vocab_size=tok.vocab_size, dim=16, n_layers=1, n_heads=2, max_len=16,
                                                mask_id=tok.mask_id))
    model.save(tmp_path / "m")
    tok.save(tmp_path / "m" / "tokenizer.json")
    pipe = load_pipeline(str(tmp_path / "m"))
    for a, b in zip(model.state_dict().values(), pipe.denoiser.model.state_dict().values()):
        assert torch.equal(a, b)
    assert isinstance(pipe(length=8, steps=2, progress=False).texts[0], str)
    assert diffaccel.__version__




@pytest.mark.parametrize("family", ["reference", "bert", "roberta"])
def test_a_ragged_partial_step_on_unchanged_inputs_reproduces_the_full_step(tmp_path, family):
    """Rows computing different numbers of positions (one row none at all): every recomputed
    position must come out as in the full step (its keys, values, rotary position, modulation
    and attention row all land where they belong)."""
    from diffaccel.adapters.text.families.dispatch import load_pipeline
    from diffaccel.adapters.text.sampling.pipeline import _RunContext
    from diffaccel.runtime.sequence import NullAccelerator as _NoAccelerator
    from diffaccel.contract.state import RunState

    pipe = tiny_text_pipeline("masked", time_conditioned=True) if family == "reference" else load_pipeline(str(_tiny_bert(tmp_path, family)[0]))
    x = torch.randint(5, 30, (3, 12), generator=torch.Generator().manual_seed(2))
    t = torch.tensor(300.0) if family == "reference" else None
    mask = torch.zeros(3, 12, dtype=torch.bool)
    mask[0, [0, 3, 4, 11]] = True
    mask[2, [7]] = True
    with torch.no_grad():
        run = RunState(adapter="text", num_steps=2, batch_size=3)
        ctx = _RunContext(pipe.denoiser, run)
        pipe._denoise(ctx, _NoAccelerator(), x, t)
        full = ctx.logits.clone()
        kv = [(c.k.clone(), c.v.clone()) for c in ctx.kv]
        ctx.logits[mask] = 0.0  # what the partial step must rewrite
        run.plan = StepPlan(positions=mask)
        pipe._denoise(ctx, _NoAccelerator(), x, t)
    assert ctx.head_sel.count == 5
    torch.testing.assert_close(ctx.logits, full, rtol=1e-5, atol=1e-5)
    for c, (k, v) in zip(ctx.kv, kv):
        torch.testing.assert_close(c.k, k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(c.v, v, rtol=1e-5, atol=1e-5)
