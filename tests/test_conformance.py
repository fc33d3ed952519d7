"""The adapter conformance suite (``diffaccel.testing.check_adapter``) on every shipped adapter
and on the toy adapter from outside, and proof that it fails an adapter that breaks the contract."""

from pathlib import Path

import attrs
import pytest
import torch

import diffaccel
from diffaccel.runtime.adapters_registry import get_adapter
from diffaccel.adapters.text.testing import tiny_llama_folder
from diffaccel.testing import check_adapter

MODELS = {
    "text-masked": {"adapter": "text", "checkpoint": "wordnet-masked", "length": 16, "steps": 6, "batch": 2},
    "text-continuous": {"adapter": "text", "checkpoint": "wordnet-continuous", "length": 16, "steps": 6, "batch": 2},
    "text-llama": {"adapter": "text", "checkpoint": None, "length": 16, "steps": 4, "batch": 2},  # a tiny folder, below
    "unet-digits": {"adapter": "unet", "checkpoint": "digits", "steps": 4, "batch": 2, "prompts": ["digit 1", "digit 2"]},
    "dit-digits": {"adapter": "dit", "checkpoint": "dit-digits", "steps": 4, "batch": 2, "prompts": ["digit 1", "digit 2"]},
    # each diffusers adapter under a second scheduler: multistep solvers keep a history across steps
    "unet-digits-dpm++2m": {"adapter": "unet", "checkpoint": "digits", "steps": 4, "batch": 2, "prompts": ["digit 1", "digit 2"],
                            "scheduler": "dpm++2m"},
    "dit-digits-unipc": {"adapter": "dit", "checkpoint": "dit-digits", "steps": 4, "batch": 2, "prompts": ["digit 1", "digit 2"],
                         "scheduler": "unipc"},
    # a tiny random UNet2DModel folder (the tiny_unet2d fixture), under its schedulers
    "unet2d-ddim": {"adapter": "unet2d", "checkpoint": "tiny_unet2d", "steps": 4, "batch": 2, "scheduler": "ddim"},
    "unet2d-ddpm": {"adapter": "unet2d", "checkpoint": "tiny_unet2d", "steps": 4, "batch": 2, "scheduler": "ddpm"},
    "unet2d-euler": {"adapter": "unet2d", "checkpoint": "tiny_unet2d", "steps": 4, "batch": 2, "scheduler": "euler"},
}
FOLDERS = ("tiny_llama", "tiny_unet2d")
"""Checkpoints made by a fixture of that name (None: tiny_llama)."""


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A tiny random LLaMA causal LM saved as a masked-DLM folder (LLaDA-class loader)."""
    return tiny_llama_folder(tmp_path_factory.mktemp("tiny-llama"))


TOY = Path(__file__).resolve().parent / "toy_adapter"


@pytest.fixture(scope="module")
def toy(install_distribution):
    """The toy adapter (tests/toy_adapter, a third party's distribution) installed and on sys.path
    for this module only: what an outside developer's test of their own adapter sees."""
    from diffaccel.runtime import adapters_registry

    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(install_distribution(TOY)))
        yield
    adapters_registry._loaded.pop("toy", None)


def test_the_toy_adapter_from_outside_conforms(toy):
    adapter, pipe, cfg = _load({"adapter": "toy", "steps": 5, "batch": 2})
    assert adapter.__module__ == "diffaccel_toy"
    assert set(check_adapter(adapter, pipe, cfg)) == {"idle", "order", "stop", "state", "guards", "report", "name"}


def _load(model):
    cfg = diffaccel.parse_config({"model": model}, source=f"conformance:{model.get('checkpoint', model['adapter'])}")
    adapter = get_adapter(cfg.model.adapter)
    return adapter, adapter.load(cfg), cfg


@pytest.mark.parametrize("name", list(MODELS))
def test_shipped_adapter_conforms(name, request):
    checkpoint = MODELS[name]["checkpoint"] or "tiny_llama"
    model = dict(MODELS[name], checkpoint=request.getfixturevalue(checkpoint) if checkpoint in FOLDERS else checkpoint)
    adapter, pipe, cfg = _load(model)
    ran = check_adapter(adapter, pipe, cfg)
    expected = {"idle", "order", "stop", "state", "guards", "report", "name"} | ({"facts"} if hasattr(adapter, "facts") else set())
    expected |= {"commit"} if name in ("text-masked", "text-llama") else set()
    expected |= {"partial"} if name.startswith("text-") else set()
    assert set(ran) == expected


def test_the_suite_fails_an_adapter_that_ignores_run_stop():
    adapter, pipe, cfg = _load(MODELS["text-masked"])

    class Deaf:  # the same adapter, but its runs never see run.stop
        def __getattr__(self, name):
            return getattr(adapter, name)

        @staticmethod
        def run(pipe, config, seed, progress=True, **kw):
            out = adapter.run(pipe, config, seed, progress=progress, **kw)
            return attrs.evolve(out, report={**out.report, "steps_run": config.model.steps})

    with pytest.raises(AssertionError, match="adapter conformance, stop: run.stop set at step 1 must end the run there"):
        check_adapter(Deaf(), pipe, cfg, skip=("idle", "order", "state", "guards", "commit"))


def test_the_suite_fails_an_adapter_whose_report_is_not_the_runs():
    adapter, pipe, cfg = _load(MODELS["unet-digits"])

    class Stale:  # the same adapter, but its output's report comes from somewhere else than the run
        def __getattr__(self, name):
            return getattr(adapter, name)

        @staticmethod
        def run(pipe, config, seed, progress=True, **kw):
            out = adapter.run(pipe, config, seed, progress=progress, **kw)
            return attrs.evolve(out, report=diffaccel.RunState(adapter="unet", num_steps=4, batch_size=2).report())

    with pytest.raises(AssertionError, match=r"adapter conformance, report: the output's report is not the run's"):
        check_adapter(Stale(), pipe, cfg, skip=("idle", "order", "state", "guards", "stop", "commit"))


class _Proxy:
    """The same adapter, but for the members a test overrides."""

    def __init__(self, adapter, **members):
        self._adapter, self._members = adapter, members

    def __getattr__(self, name):
        return self._members[name] if name in self._members else getattr(self._adapter, name)


class _ZeroPartial:
    """A denoiser whose partial layer calls return zeros: its full steps are right."""

    def __init__(self, den):
        self._den = den

    def __getattr__(self, name):
        return getattr(self._den, name)

    def block(self, i, h, c, kv, positions=None):
        out = self._den.block(i, h, c, kv, positions)
        return out if positions is None else torch.zeros_like(out)


def test_the_suite_fails_an_adapter_whose_partial_steps_return_zeros():
    adapter, pipe, cfg = _load(MODELS["text-masked"])
    assert "partial" in check_adapter(adapter, pipe, cfg, skip=("idle", "order", "state", "guards", "stop", "report",
                                                                "commit", "facts", "name"))
    pipe.denoiser = _ZeroPartial(pipe.denoiser)
    with pytest.raises(AssertionError, match=r"adapter conformance, partial: layer 'block.0' computed on part of its "
                                             r"positions differs from its full computation there"):
        check_adapter(adapter, pipe, cfg, skip=("idle", "order", "state", "guards", "stop", "report", "commit", "facts"))


def test_the_suite_fails_an_adapter_whose_facts_accept_what_load_refuses():
    adapter, pipe, cfg = _load(MODELS["text-masked"])
    lax = _Proxy(adapter, facts=lambda config: adapter.info(pipe))  # never reads the checkpoint
    with pytest.raises(AssertionError, match=r"adapter conformance, facts: load refuses checkpoint '.*no-such-model' "
                                             r"\(.*\) but facts accepts it"):
        check_adapter(lax, pipe, cfg, skip=("idle", "order", "state", "guards", "stop", "report", "commit", "partial"))


def test_facts_refuses_each_config_load_refuses(tmp_path):
    adapter, pipe, cfg = _load(MODELS["text-masked"])
    long = attrs.evolve(cfg, options=attrs.evolve(cfg.options, length=10_000))  # beyond the model's positions
    skip = ("idle", "order", "state", "guards", "stop", "report", "commit", "partial", "name")
    assert "facts" in check_adapter(adapter, pipe, cfg, skip=skip, refused=[long])
    lax = _Proxy(adapter, load=lambda config: pipe)  # load accepts anything; facts refuses the long one
    with pytest.raises(AssertionError, match=r"adapter conformance, facts: .*refuses checkpoint"):
        check_adapter(lax, pipe, cfg, skip=skip, refused=[long])


def test_the_report_names_the_adapter_that_ran():
    from diffaccel.adapters.text.adapter import TextAdapter

    class Mine(TextAdapter):  # a third party's text adapter, under its own name
        name = "mine"

    _, _, cfg = _load(MODELS["text-masked"])
    pipe = Mine.load(cfg)
    assert Mine.run(pipe, cfg, 0, progress=False).report["adapter"] == "mine"
    assert "name" in check_adapter(Mine, pipe, cfg, skip=("idle", "order", "state", "guards", "stop", "commit", "partial",
                                                          "report"))
    with pytest.raises(AssertionError, match=r"adapter conformance, name: the report names adapter 'mine', but 'other' ran"):
        check_adapter(_Proxy(Mine, name="other"), pipe, cfg, skip=("idle", "order", "state", "guards", "stop", "report",
                                                                   "commit", "partial", "facts"))
