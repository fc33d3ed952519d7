"""The masked-LM families the text adapter runs (``bert.FAMILIES``), each on a tiny random model
saved with ``save_pretrained`` and loaded by path: the layer-by-layer forward equals transformers'
own, partial steps equal full ones (the conformance suite), a config with ``adapter = "text"``
and the folder as ``checkpoint`` runs with swd, time-anchor, parallel and topk; a family the
adapter cannot run is refused by ``check`` and ``generate`` alike, in one line."""

from __future__ import annotations

import pytest
import torch

import diffaccel
from diffaccel.adapters.text.families.bert import FAMILIES
from diffaccel.adapters.text.families.dispatch import load_pipeline
from diffaccel.adapters.text.sampling.model import KVCache
from diffaccel.adapters.text.families.tiny_families import tiny_masked_lm
from diffaccel.runtime.adapters_registry import get_adapter
from diffaccel.cli.entry import main
from diffaccel.testing import check_adapter

RUN = ("bert", "roberta", "xlm-roberta", "electra", "distilbert", "albert", "modernbert", "deberta-v2", "deberta-v3")
REFUSED = ("deberta-v2-conv",)  # a convolution outside attention: refused by check and generate alike


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: tiny_masked_lm(root, f) for f in RUN + REFUSED}


def _config(path, strategies=(), **model):
    model = {"adapter": "text", "checkpoint": str(path), "length": 16, "steps": 8, "batch": 2, **model}
    return diffaccel.parse_config({"model": model, "strategy": list(strategies)}, source=f"families:{path.name}")


def test_every_family_that_runs_is_tested():
    assert set(FAMILIES) | {"modernbert"} == set(RUN) - {"deberta-v3"}  # v3: a DeBERTa-v2 config (model_type deberta-v2)


@pytest.mark.parametrize("family", RUN)
def test_the_layerwise_forward_is_transformers_own(folders, family):
    path, model = folders[family]
    den = load_pipeline(str(path)).denoiser
    x = torch.randint(5, 31, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        h = den.embed(x)
        for i in range(den.n_layers):
            h = den.block(i, h, None, KVCache())
        ours, theirs = den.logits(h), model(input_ids=x).logits
    assert ours.shape == theirs.shape and float(theirs.std()) > 0.01
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=0), float((ours - theirs).abs().max())


@pytest.mark.parametrize("family", RUN)
def test_it_conforms_from_a_config_naming_its_folder(folders, family):
    cfg = _config(folders[family][0])
    adapter = get_adapter("text")
    pipe = diffaccel.load_pipeline(cfg)
    ran = check_adapter(adapter, pipe, cfg, refused=[_config(folders["deberta-v2-conv"][0])], skip=("guards",))
    assert {"partial", "facts", "name", "commit"} <= set(ran)


def test_the_sliding_window_is_kept_on_partial_steps(folders):
    """ModernBERT's sliding layers with the window dropped on partial steps alone: the conformance
    suite's partial check fails (a full-steps-only test would not see it)."""
    cfg = _config(folders["modernbert"][0], length=24)
    adapter = get_adapter("text")
    pipe = diffaccel.load_pipeline(cfg)
    den = pipe.denoiser
    assert den.window < 24 and "sliding_attention" in den.types
    full_mask, block = den.mask, den.block

    def leaky(i, h, c, kv, positions=None):  # the partial path forgets the window
        if positions is None:
            return block(i, h, c, kv)
        den.mask = lambda *a: None
        try:
            return block(i, h, c, kv, positions)
        finally:
            den.mask = full_mask

    den.block = leaky
    only = ("idle", "order", "state", "guards", "stop", "report", "commit", "facts", "name")
    with pytest.raises(AssertionError, match=r"adapter conformance, partial: layer 'block.1' computed on part"):
        check_adapter(adapter, pipe, cfg, skip=only)


STRATEGIES = {
    "swd": {"use": "swd", "tau": 0.5, "K": 2, "R": 1},
    "time-anchor": {"use": "time-anchor", "threshold": 0.5, "warmup": 1, "max_age": 4},
    "parallel": {"use": "parallel", "rule": "factor", "scale": "ratio", "factor": 3},
    "topk": {"use": "topk", "k": 4, "temperature": 0.5, "k_keep": 8},
}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("family", RUN)
def test_the_strategies_run_on_it(folders, family, strategy):
    cfg = _config(folders[family][0], [STRATEGIES[strategy]], steps=16)
    adapter = get_adapter("text")
    pipe = diffaccel.load_pipeline(cfg)
    with diffaccel.apply(pipe, cfg):
        out = adapter.run(pipe, cfg, 0, progress=False)
    rep, c = out.report, out.report["counters"]
    assert rep["adapter"] == "text" and out.tokens.shape == (2, 16)
    if strategy == "parallel":  # more than one commit per step: fewer steps
        assert rep["steps_run"] < 16
    elif strategy in ("swd", "time-anchor"):  # layers or positions not computed
        assert c["layers_skipped"] > 0 or c["positions_computed"] < c["positions_total"], c
    else:
        assert "topk" in rep["strategies"], rep["strategies"]


def _refused(command, path, tmp_path, capsys) -> str:
    toml = tmp_path / "c.toml"
    toml.write_text(f'[model]\nadapter = "text"\ncheckpoint = "{path}"\nlength = 16\nsteps = 4\n')
    assert main([command, str(toml)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("command", ["check", "generate"])
def test_check_and_generate_refuse_a_family_alike(tmp_path, capsys, command):
    path = tmp_path / "funnel"  # a config.json alone: refused before any weight is looked for
    path.mkdir()
    (path / "config.json").write_text('{"model_type": "funnel", "vocab_size": 30}')
    assert (f"checkpoint '{path}': model_type 'funnel' is not a masked-LM family the text adapter runs "
            "(it runs: albert, bert, deberta-v2, distilbert, electra, modernbert, roberta, xlm-roberta); another family "
            "needs a text model kind of its own (docs/writing-an-adapter.md)") in _refused(command, path, tmp_path, capsys)


@pytest.mark.parametrize("command", ["check", "generate"])
def test_check_and_generate_refuse_a_variant_alike(folders, tmp_path, capsys, command):
    path = folders["deberta-v2-conv"][0]
    assert (f"checkpoint '{path}': deberta-v2: conv_kernel_size > 0: its first layer's convolution mixes neighbouring "
            "positions outside attention") in _refused(command, path, tmp_path, capsys)
