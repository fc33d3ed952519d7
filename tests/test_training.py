"""The training command runs end to end on a tiny corpus and writes what the README promises."""

import json

import pytest

from diffaccel.adapters.text.loading import load_pipeline
from diffaccel.adapters.text.train import TrainConfig, pack, token_weights, train

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

    from diffaccel.adapters.unet.adapter import load_checkpoint
    from diffaccel.adapters.unet.digits import TrainDigitsConfig, new_pipeline, train_digits

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

    pytest.importorskip("diffaccel_bert_cond")
    from diffaccel_bert_cond.conditions import save

    base = train(TrainConfig(out=str(tmp_path / "base"), steps=2, batch=4, seq_len=32, dim=16, layers=1, heads=2,
                             vocab=80, threads=1), lines=list(LINES))
    lines = sorted(set(LINES))[:5]
    vectors = torch.nn.functional.normalize(torch.randn(5, 8, generator=torch.Generator().manual_seed(0)), dim=-1)
    save(tmp_path / "c.safetensors", lines, [("x",)] * 5, vectors, {})
    out = train(TrainConfig(out=str(tmp_path / "cond"), steps=3, batch=4, seq_len=32, threads=1, lr=1e-2,
                            init_from=str(base), conditions=str(tmp_path / "c.safetensors"), cond_only=True),
                lines=list(LINES))
    a, b = load_file(str(base / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert not b["blocks.0.mod.weight"].abs().sum() == 0 and a["blocks.0.mod.weight"].abs().sum() == 0
    assert "cond_proj.weight" in b and "cond_proj.weight" not in a
    assert all(torch.equal(a[k], b[k]) for k in a if ".mod." not in k)  # the rest is frozen
    assert load_pipeline(str(out)).denoiser.cond_dim == 8
    with pytest.raises(ValueError, match="cond_only needs"):
        train(TrainConfig(out=str(tmp_path / "x"), steps=1, batch=4, seq_len=32, dim=16, layers=1, heads=2, vocab=80,
                          threads=1, cond_only=True), lines=list(LINES))
