"""The training command runs end to end on a tiny corpus and writes what the README promises."""

import json

import pytest

from diffaccel.adapters.text.families.dispatch import load_pipeline
from diffaccel_models.text.training.train import TrainConfig, pack, token_weights, train

LINES = [f"word{i % 7}: a small thing that does {i % 5} things" for i in range(300)]


@pytest.mark.parametrize("kind", ["masked", "continuous"])
def test_train_writes_a_loadable_checkpoint(tmp_path, kind):
    out = train(TrainConfig(kind=kind, out=str(tmp_path / kind), steps=4, batch=4, seq_len=32, dim=16, layers=1,
                            heads=2, vocab=80, checkpoint_every=2, threads=1, freq_weight=0.5), lines=list(LINES))
    for name in ("model.safetensors", "config.json", "tokenizer.json", "curves.png", "train.json"):
        assert (out / name).is_file(), name
    meta = json.loads((out / "train.json").read_text())
    assert meta["steps_done"] == 4
    pipe = load_pipeline(str(out))
    assert pipe.kind == kind
    assert len(pipe(length=16, steps=4, progress=False).texts) == 1


def test_pack_starts_at_lines():
    stream, starts = pack([[5, 6], [7], [8, 9, 10]], sep_id=3)
    assert stream.tolist() == [5, 6, 3, 7, 3, 8, 9, 10, 3]
    assert starts.tolist() == [0, 3, 5]


def test_frequency_weights_favour_rare_tokens():
    import numpy as np

    w = token_weights(np.array([4, 4, 4, 4, 5]), vocab=6, alpha=0.5)
    assert w[5] > w[4]


def test_frozen_embeddings_from_a_bert(tmp_path):
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted({w for line in LINES for w in line.replace(":", "").split()})]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab_file=str(tmp_path / "vocab.txt")).save_pretrained(tmp_path / "bert")
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=24, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(tmp_path / "bert")
    out = train(TrainConfig(kind="masked", out=str(tmp_path / "m"), steps=3, batch=4, seq_len=32, dim=16, layers=1,
                            heads=2, vocab=80, threads=1, init_embeddings=str(tmp_path / "bert")), lines=list(LINES))
    pipe = load_pipeline(str(out))
    table = pipe.denoiser.model.tok_emb[0].weight
    assert table.shape[1] == 24 and not table.requires_grad
    assert torch.count_nonzero(table.abs().sum(1)) > 10  # most of our tokens found BERT pieces


def test_digits_training_writes_a_pipeline_and_can_continue_from_it(tmp_path):
    """A few steps of ``train digits``; ``init`` then starts from those weights, not random ones."""
    import torch

    from diffaccel.adapters.diffusers.unet.adapter import load_checkpoint
    from diffaccel_models.unet.digits import TrainDigitsConfig, new_pipeline, train_digits

    first = train_digits(TrainDigitsConfig(out=str(tmp_path / "a"), steps=2, max_minutes=0, threads=1, eval_per_class=0, batch=4))
    assert (first / "train.json").exists() and (first / "unet" / "diffusion_pytorch_model.safetensors").exists()
    again = train_digits(TrainDigitsConfig(out=str(tmp_path / "b"), steps=1, max_minutes=0, threads=1, eval_per_class=0,
                                           batch=4, lr=1e-12, init=str(first), seed=1))
    a, b = load_checkpoint(str(first)).unet.state_dict(), load_checkpoint(str(again)).unet.state_dict()
    fresh = new_pipeline(seed=1).unet.state_dict()
    key = "conv_in.weight"
    assert torch.allclose(a[key], b[key], atol=1e-6) and not torch.allclose(fresh[key], b[key])


def test_conditional_training_from_a_checkpoint_trains_the_condition_path_alone(tmp_path):
    """--init + --conditions + --cond-only: the condition projection and the gating layers learn
    (from an unconditioned checkpoint, whose gating weights are zero), everything else is the
    initial checkpoint's, and the result loads with cond_dim = the vectors' size."""
    import torch
    from safetensors.torch import load_file

    from diffaccel.kit.conditions import save

    base = train(TrainConfig(out=str(tmp_path / "base"), steps=2, batch=4, seq_len=32, dim=16, layers=1, heads=2,
                             vocab=80, threads=1), lines=list(LINES))
    lines = sorted(set(LINES))[:5]
    vectors = torch.nn.functional.normalize(torch.randn(5, 8, generator=torch.Generator().manual_seed(0)), dim=-1)
    save(tmp_path / "c.safetensors", lines, [("x",)] * 5, vectors, {})
    out = train(TrainConfig(out=str(tmp_path / "cond"), steps=3, batch=4, seq_len=32, threads=1, lr=1e-2,
                            init_from=str(base), conditions=str(tmp_path / "c.safetensors"), cond_only=True,
                            cond_line_weight=4.0, cond_term_weight=8.0, cond_term_mask=0.5),
                lines=list(LINES))
    a, b = load_file(str(base / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert not b["blocks.0.mod.weight"].abs().sum() == 0 and a["blocks.0.mod.weight"].abs().sum() == 0
    assert "cond_proj.weight" in b and "cond_proj.weight" not in a
    # the rest is frozen, the gating biases too: without a vector the model is the initial one
    assert all(torch.equal(a[k], b[k]) for k in a if not k.endswith(".mod.weight"))
    assert json.loads((out / "train.json").read_text())["conditioned_lines"] == 5
    assert load_pipeline(str(out)).denoiser.cond_dim == 8
    with pytest.raises(ValueError, match="cond_only needs"):
        train(TrainConfig(out=str(tmp_path / "x"), steps=1, batch=4, seq_len=32, dim=16, layers=1, heads=2, vocab=80,
                          threads=1, cond_only=True), lines=list(LINES))


def test_line_weights_weigh_the_conditioned_line_and_its_key_terms():
    """The loss weights of a sequence that starts at a conditioned line: the line and its [SEP]
    get the line weight, its key terms' tokens (as in running text) the term weight, the rest 1;
    a term the line does not hold marks nothing."""
    import numpy as np

    from diffaccel.adapters.text.sampling.tokenizer import TextTokenizer, train_tokenizer
    from diffaccel_models.text.training.train import line_weights

    tok = TextTokenizer(train_tokenizer(LINES, 80))
    ids = tok.encode_lines(["word3: a small thing", "word1: a thing"])
    stream, starts = pack(ids, tok.sep_id)
    w, at = line_weights(stream, starts[:1], [("small thing", "absent")], tok, 8, 4.0, 9.0)
    n = len(ids[0]) + 1  # the line and its [SEP]
    term = tok.encode(" small thing")
    i = next(k for k in range(n) if ids[0][k:k + len(term)] == term)
    expect = np.ones(8)
    expect[:n] = 4.0
    expect[i:i + len(term)] = 9.0
    assert w[0].tolist() == expect.tolist()
    assert at[0].nonzero().flatten().tolist() == list(range(i, i + len(term)))


def test_diffusion_loss_masks_and_weighs_the_given_positions():
    """``also_mask`` positions are scored even at the lowest noise; ``pos_weight`` weighs them."""
    import torch

    from diffaccel.adapters.text.sampling.model import TextDiffusionConfig, TextDiffusionLM
    from diffaccel_models.text.training.train import diffusion_loss

    torch.manual_seed(0)
    model = TextDiffusionLM(TextDiffusionConfig(vocab_size=16, dim=16, n_layers=1, n_heads=2, max_len=8))
    x0 = torch.randint(4, 16, (2, 8))
    force = torch.zeros(2, 8, dtype=torch.bool)
    force[:, 2] = True
    seen = []
    for seed in range(5):
        _, _, _, scored = diffusion_loss(model, x0, None, torch.Generator().manual_seed(seed), also_mask=force)
        seen.append(scored)
    assert all(bool(s[:, 2].all()) for s in seen)
    gen = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    w = torch.ones(2, 8)
    plain, *_ = diffusion_loss(model, x0, None, gen(), pos_weight=w, also_mask=force)
    w[:, 2] = 50.0
    heavy, *_ = diffusion_loss(model, x0, None, gen(), pos_weight=w, also_mask=force)
    _, h, _, scored = diffusion_loss(model, x0, None, gen(), also_mask=force)
    ce = torch.nn.functional.cross_entropy(model.logits(h[:, 2]), x0[:, 2])
    assert abs(heavy.item() - ce.item()) < abs(plain.item() - ce.item())  # pulled towards position 2's loss
