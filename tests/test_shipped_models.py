"""The shipped default text models load offline and generate through the CLI."""

import pytest
import torch

from diffaccel.adapters.text.families.dispatch import load_pipeline
from diffaccel_models import ASSETS
from diffaccel.cli.entry import main


def test_shipped_weights_are_small_safetensors():
    files = sorted(ASSETS.glob("*/model.safetensors"))
    assert {f.parent.name for f in files} == {"wordnet-masked", "wordnet-continuous", "wordnet-masked-cond", "arith", "sudoku",
                                                 "sudoku9", "ledger"}
    # 30 MiB before the 9x9 sudoku model (2.3 MiB), 32 before the ledger model (3.5 MiB)
    assert sum(f.stat().st_size for f in files) <= 36 * 2**20
    assert all(f.stat().st_size <= 10 * 2**20 for f in files if f.parent.name in ("arith", "sudoku", "sudoku9", "ledger"))
    assert not list(ASSETS.rglob("*.bin")) and not list(ASSETS.rglob("*.pt"))


# share of generated words that the held-out text knows; random BPE tokens score far lower (checked below)
@pytest.mark.parametrize("name,kind,temperature,known", [("wordnet-masked", "masked", 1.0, 0.7),
                                                          ("wordnet-continuous", "continuous", 0.7, 0.45),
                                                          ("wordnet-masked-cond", "masked", 1.0, 0.7)])
def test_shipped_model_generates_text(name, kind, temperature, known):
    pipe = load_pipeline(name)
    assert pipe.kind == kind
    out = pipe(length=64, steps=32, seed=0, temperature=temperature, progress=False)
    words = out.texts[0].split()
    assert len(words) >= 5
    # a trained model writes mostly known words, not byte soup
    from diffaccel.adapters.text.evaluation.metrics import fluency_model, words as tokenize

    vocab = fluency_model().vocab
    toks = tokenize(out.texts[0])
    assert sum(t in vocab for t in toks) / len(toks) > known
    noise = tokenize(pipe.tokenizer.decode(torch.randint(4, pipe.tokenizer.vocab_size, (64,),
                                                         generator=torch.Generator().manual_seed(0)).tolist()))
    assert sum(t in vocab for t in noise) / len(noise) < known


def test_cli_generate_writes_a_file(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 32\nsteps = 8\n')
    out = tmp_path / "sample.txt"
    assert main(["generate", str(cfg), "--out", str(out), "--no-progress"]) == 0
    assert out.read_text().startswith("--- sample 0 ---")
    assert "layers computed 32" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.partial"))


def test_generate_is_reproducible():
    pipe = load_pipeline("wordnet-masked")
    a = pipe(length=32, steps=8, seed=5, progress=False)
    b = pipe(length=32, steps=8, seed=5, progress=False)
    assert torch.equal(a.tokens, b.tokens)


def test_conditional_model_takes_a_minilm_sized_vector_that_changes_its_text():
    """wordnet-masked-cond: condition gating of MiniLM's size (384), fed through RunState.condition."""
    from diffaccel.adapters.text.sampling.model import TextDiffusionLM

    pipe = load_pipeline("wordnet-masked-cond")
    assert pipe.denoiser.cond_dim == 384
    assert load_pipeline("wordnet-masked").denoiser.cond_dim == 0
    model = TextDiffusionLM.load(ASSETS / "wordnet-masked-cond")
    x = torch.full((2, 16), model.config.mask_id)
    cond = torch.nn.functional.normalize(torch.randn(2, 384, generator=torch.Generator().manual_seed(0)), dim=-1)
    with torch.no_grad():
        plain, conditioned = model(x), model(x, cond=cond)
    assert not torch.allclose(plain, conditioned, atol=1e-3)  # the trained projection is not zero
    assert not torch.allclose(conditioned[0], conditioned[1], atol=1e-3)  # and tells the vectors apart
