"""The run counters are the core's: the same figures on every adapter, whatever computes a layer.

Each case runs an adapter (text: masked, continuous, the prefix cache, a tiny LLaMA folder,
DiffusionGemma; UNet and DiT, batched and unbatched guidance; the toy adapter from outside)
with and without strategies that skip layers, positions or whole steps, under the guard's
recomputations and ``run.stop``, and compares the report's counters with those recorded in
``golden/counters.json``, recorded when the adapters still counted by hand: the move of the
counting into the core changed one figure, ``positions_total`` of a text run without ``apply``
(0 then: the null accelerator did not count layer calls; now it counts them as every other run
does, 1536)::

    .venv/bin/python tests/test_counters.py --write     # only when a figure is meant to change
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import torch

import diffaccel

ROOT = Path(__file__).resolve().parent
FIXTURE = ROOT / "golden" / "counters.json"
KEYS = ("layers_computed", "layers_skipped", "positions_computed", "positions_total", "steps_reused")

TEXT = {"adapter": "text", "checkpoint": "wordnet-masked", "length": 24, "steps": 8, "batch": 2}
CONT = {"adapter": "text", "checkpoint": "wordnet-continuous", "length": 24, "steps": 8, "batch": 2}
UNET = {"adapter": "unet", "checkpoint": "digits", "steps": 8, "batch": 2, "prompts": ["digit 1", "digit 2"]}
DIT = {"adapter": "dit", "checkpoint": "dit-digits", "steps": 8, "batch": 2, "prompts": ["digit 1", "digit 2"]}
TOY = {"adapter": "toy", "steps": 10, "batch": 2}
SWD = {"use": "swd", "tau": 0.05, "K": 1}
TA_TEXT = {"use": "time-anchor", "threshold": 0.05, "warmup": 1, "max_age": 3}
TA_BLOCKS = {"use": "time-anchor", "threshold": 0.2, "warmup": 1, "max_age": 3, "min_depth": 0, "tail_layers": 1}
TA_DIT = {"use": "time-anchor", "threshold": 0.2, "warmup": 1, "max_age": 3}
TA_TOY = {"use": "time-anchor", "threshold": 0.5, "warmup": 1, "max_age": 3, "min_depth": 1}
DCT = {"use": "dct-anchor", "signal": "x0", "threshold": 0.3, "warmup": 1, "max_reuse": 4, "tail_layers": 1}
DCT_DIT = {"use": "dct-anchor", "signal": "x0", "threshold": 0.3, "warmup": 1, "max_reuse": 4, "extrapolate": True}



class Planner:
    """A strategy of plans only: from step 1 the plan skips one block (``StepPlan.skip``; text
    layers ignore it) and every third step is reused whole (``StepPlan.reuse_step``)."""

    name = "planner"

    def __init__(self, skip: str):
        self.skip = frozenset({skip})

    @diffaccel.hookimpl
    def diffaccel_pre_step(self, run):
        if run.step >= 1:
            return diffaccel.StepPlan(skip=self.skip, reuse_step=run.step % 3 == 2)
        return None


PLAN_UNET, PLAN_DIT, PLAN_TOY, PLAN_TEXT = (Planner(s) for s in ("mid_block", "transformer_blocks.4", "mid", "block.1"))

# name -> (model table, strategy tables, extra config tables, extra run keywords)
CASES: dict[str, tuple[dict, list, dict, dict]] = {
    "text-masked": (TEXT, [], {}, {}),
    "text-masked-swd": (TEXT, [SWD], {}, {}),
    "text-masked-time-anchor": (TEXT, [TA_TEXT], {}, {}),
    "text-masked-swd-guard": (TEXT, [SWD], {"guard": {"every": 2}}, {}),
    "text-prefix-cache-swd": (dict(TEXT, block_size=8, prefix_cache=True), [SWD], {}, {}),
    "text-continuous": (CONT, [], {}, {}),
    "text-continuous-time-anchor": (CONT, [TA_TEXT], {}, {}),
    "text-llama-swd": (dict(TEXT, checkpoint="<llama>", steps=6), [SWD], {}, {}),
    "text-diffusion-gemma": (dict(TEXT, checkpoint="<gemma>", length=32, steps=6, batch=1), [], {}, {}),
    "text-diffusion-gemma-swd": (dict(TEXT, checkpoint="<gemma>", length=32, steps=6, batch=1),
                                 [dict(SWD, tau=0.01)], {}, {}),
    "unet": (UNET, [], {}, {}),
    "unet-time-anchor-tail": (UNET, [TA_BLOCKS], {}, {}),
    "unet-dct-anchor-tail": (UNET, [DCT], {}, {}),
    "unet-dct-anchor-unbatched": (UNET, [DCT], {}, {"cfg_batched": False}),
    "unet-dct-anchor-guard": (UNET, [DCT], {"guard": {"every": 3}}, {}),
    "text-masked-planner": (TEXT, [PLAN_TEXT], {}, {}),
    "text-diffusion-gemma-peaky-swd": (dict(TEXT, checkpoint="<gemma-peaky>", length=32, steps=6, batch=1),
                                       [dict(SWD, tau=0.01)], {}, {}),
    "unet-planner": (UNET, [PLAN_UNET], {}, {}),
    "unet-planner-unbatched": (UNET, [PLAN_UNET], {}, {"cfg_batched": False}),
    "unet-stop": (UNET, [DCT, "stop"], {}, {}),
    "dit": (DIT, [], {}, {}),
    "dit-planner": (DIT, [PLAN_DIT], {}, {}),
    "dit-time-anchor": (DIT, [TA_DIT], {}, {}),
    "dit-dct-anchor": (DIT, [DCT_DIT], {}, {}),
    "toy": (TOY, [], {}, {}),
    "toy-time-anchor": (TOY, [TA_TOY], {}, {}),
    "toy-planner": (TOY, [PLAN_TOY], {}, {}),
    "text-masked-stop": (TEXT, [SWD, "stop"], {}, {}),
    "text-masked-unapplied": (TEXT, [], {}, {}),
    "toy-unapplied": (TOY, [], {}, {}),
}


class Stopper:
    """Ends the run after step 3 (``run.stop``)."""

    name = "stopper"

    @diffaccel.hookimpl
    def diffaccel_post_step(self, run, output):
        run.stop = run.step == 3


def _checkpoints(tmp: Path) -> dict[str, str]:
    """The tiny random folders some cases load by path (built, never downloaded)."""
    from diffaccel.adapters.text.families.diffusion_gemma.build import build

    import importlib.util

    # a helper of another test file (``--import-mode=importlib`` keeps tests/ off sys.path)
    spec = importlib.util.spec_from_file_location("_counters_llama", ROOT / "test_llama_denoiser.py")
    llama = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(llama)

    (tmp / "llama").mkdir(exist_ok=True)
    gemma = str(build(tmp / "gemma", "tiny", seed=0))
    return {"<llama>": str(llama.tiny_decoder(tmp / "llama")[0]), "<gemma>": gemma, "<gemma-peaky>": gemma}


def toy_site(tmp: Path) -> str:
    """tests/toy_adapter (a distribution of its own, entry point ``toy``) pip-installed into a
    folder of ``tmp``, built from a copy; put it on ``sys.path`` to use the adapter in process."""
    import shutil
    import subprocess

    src, target = tmp / "toy-src", tmp / "toy-site"
    shutil.copytree(ROOT / "toy_adapter", src)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(src)], check=True, capture_output=True)
    return str(target)


def record(name: str, checkpoints: dict[str, str]) -> dict[str, int]:
    import diffaccel
    from diffaccel.runtime.adapters_registry import get_adapter

    model, strategies, extra, kwargs = CASES[name]
    model = dict(model, checkpoint=checkpoints.get(model.get("checkpoint"), model.get("checkpoint")))
    if model["adapter"] == "toy":
        model.pop("checkpoint")
    tables = [s for s in strategies if isinstance(s, dict)]
    cfg = diffaccel.parse_config({"model": model, "strategy": tables, **extra}, source=f"counters:{name}")
    adapter = get_adapter(cfg.model.adapter)
    pipe = adapter.load(cfg)
    if CASES[name][0].get("checkpoint") == "<gemma-peaky>":
        # peaked distributions whose top-1 holds from step to step: swd finds positions to skip
        with torch.no_grad():
            pipe.model.model.decoder.norm.weight.mul_(300.0)
    built = diffaccel.build_strategies(cfg, None, adapter.info(pipe))
    built += [Stopper() if s == "stop" else s for s in strategies if not isinstance(s, dict)]
    if name.endswith("-unapplied"):  # no accelerator at all: what an adapter counts on its own
        out = adapter.run(pipe, cfg, 0, progress=False, **kwargs)
    else:
        with diffaccel.apply(pipe, cfg, strategies=built):
            out = adapter.run(pipe, cfg, 0, progress=False, **kwargs)
    c = out.report["counters"]
    return {k: c[k] for k in KEYS}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The tiny folders, and the toy adapter on ``sys.path`` for this module only."""
    from diffaccel.runtime import adapters_registry

    tmp = tmp_path_factory.mktemp("counters")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(toy_site(tmp))
        yield _checkpoints(tmp)
    adapters_registry._loaded.pop("toy", None)


@pytest.mark.parametrize("name", list(CASES))
def test_counters_are_the_recorded_figures(name, checkpoints):
    expected = json.loads(FIXTURE.read_text())[name]
    assert record(name, checkpoints) == expected


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, toy_site(Path(tmp)))
        cps = _checkpoints(Path(tmp))
        figures = {name: record(name, cps) for name in CASES}
    FIXTURE.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in figures.items()) + "\n}\n")
    print(json.dumps(figures, indent=1))


def test_inner_modules_computed_inside_a_computed_block_are_each_counted_once():
    """A block's inner modules hooked as layers compute inside the block's own compute: the core
    counts both, and does not take the inner counts for the block counting itself (the deprecated
    form), so no warning."""
    import warnings

    from diffaccel.adapters.diffusers.unet.adapter import UNetAdapter
    from diffaccel.adapters.diffusers.unet.testing import tiny_sd_pipeline

    class Inner:
        name = "inner"

        def __init__(self):
            self.calls = 0

        @diffaccel.hookimpl
        def diffaccel_hooked_modules(self, available):
            return ["mid_block.attentions.0", "up_blocks.0.resnets.1"]

        @diffaccel.hookimpl
        def diffaccel_layer_output(self, run, layer, hidden):
            self.calls += 1

    pipe, inner = tiny_sd_pipeline(), Inner()
    cfg = diffaccel.parse_config({"model": {"adapter": "unet", "checkpoint": "synthetic-sd-tiny", "steps": 3, "batch": 1,
                                            "size": 32}})
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with diffaccel.apply(pipe, strategies=[inner]):
            out = UNetAdapter.run(pipe, cfg, 0, progress=False)
    c = out.report["counters"]
    n_blocks = len(UNetAdapter.info(pipe)["layers"])
    assert inner.calls == 3 * (n_blocks + 2)  # every block and both modules, at each step
    assert c["layers_computed"] == inner.calls and c["layers_skipped"] == 0
    assert c["positions_computed"] == c["positions_total"] == inner.calls * 2  # 2 rows: the guided batch


def test_the_counters_change_in_one_place():
    """Only the run's tally (``diffaccel.runtime.sequence.Tally``) writes ``counters.<field>``:
    no other module of the core, the shipped adapters or the shipped plugins adds to one."""
    import re

    from diffaccel.contract.state import Counters
    import attrs

    fields = "|".join(f.name for f in attrs.fields(Counters))
    write = re.compile(rf"(?:counters|\bc)\.(?:{fields})\s*(?:[-+*]?=)(?!=)")
    repo = ROOT.parent
    owner = repo / "core" / "diffaccel" / "runtime" / "sequence.py"
    found = [f"{path.relative_to(repo)}:{i}" for tree in ("core", "adapters", "plugins")
             for path in sorted((repo / tree).rglob("*.py")) if path != owner and "tests" not in path.parts
             for i, line in enumerate(path.read_text().splitlines(), 1) if write.search(line)]
    assert found == []
    assert write.search(owner.read_text())  # the pattern finds the tally's own writes
