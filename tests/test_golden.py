"""No output changes: every shipped config, run small, against outputs recorded in ``golden/outputs.json``.

Each config in ``configs/`` and ``plugins/*/configs/`` runs with its own strategies, shrunk so the
whole file takes seconds per config (text: 2 rows of 32 tokens, 16 steps; digits: 4 rows, 16
steps; synthetic Stable Diffusion: 6 steps at 32 pixels). The run's counters (which layers and
positions were computed: every strategy decision) and the generated token ids (text) must be
equal; images must match a fingerprint (each image average-pooled to 8x8 per channel) within
``IMAGE_ATOL``. Image bytes are not compared: one CPU's vector units round differently from
another's (the sha256 of every image recorded on one machine differed on another with the same
wheels), while the fingerprint's tolerance is far below what any change of computation moves.

Sampled tokens are discrete, so no tolerance helps them: a draw that lands near the boundary
between two tokens flips when the CPU's vector units round one logit differently (top-k at
temperature 0.5 on the synthetic LLaDA model drew other tokens on an AVX2 machine than on an
AVX-512 one). ``--write`` therefore records each text config with the machine's own kernels and
again with each of five other kernel choices (``KERNEL_PROBES``, as another CPU would pick them).
Configs whose tokens agree in all six are compared with the machine's own kernels, as above. The
others are float-sensitive: their entry says ``"kernels": "pinned"`` and they are recorded and
checked in a child process whose kernels are pinned to the portable code paths (``PINNED``: ATen's
scalar kernels, MKL's conditional numerical reproducibility in its compatible mode, oneDNN at
SSE4.1), which give the same numbers on any x86-64 CPU; so their tokens still must be equal.

    .venv/bin/python tests/test_golden.py --write     # only when an output is meant to change
    .venv/bin/python tests/test_golden.py --missing   # a new config: records it, leaves the others
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).with_name("golden") / "outputs.json"
# Configs whose checkpoint a command builds into ./runs/ (random-weights DiffusionGemma stand-ins,
# absent on a fresh clone) are left out; tests/test_diffusion_gemma.py builds and checks them.
CONFIGS = sorted(p for p in [*ROOT.glob("configs/*.toml"), *ROOT.glob("plugins/*/configs/*.toml")]
                 if 'checkpoint = "./runs/' not in p.read_text())


def shrink(cfg):
    """The config, small: the same model, strategies and seed, fewer steps, rows and pixels."""
    import attrs

    m, o = cfg.model, cfg.options
    if m.adapter == "text":
        model = attrs.evolve(m, steps=16, batch=2)
        # blocks must still divide the length: a task model's is its task's, the others 32 in blocks of 8
        options = attrs.evolve(o, length=32) if not o.block_size else o if o.task else attrs.evolve(o, length=32, block_size=8)
        if o.prompts and not o.task:  # a long prompt would fill the 32 positions: its first words keep the prompt path
            options = attrs.evolve(options, prompts=[" ".join(p.split()[:8]) for p in o.prompts])
    elif m.checkpoint.startswith("synthetic"):
        model = attrs.evolve(m, steps=6, batch=1)
        options = attrs.evolve(o, size=32) if hasattr(o, "size") else o  # unet2d: the model's own size
    else:  # digits: enough steps for the anchors to settle past their warm-up
        model = attrs.evolve(m, steps=16, batch=min(m.batch, 4))
        options = o
    return attrs.evolve(cfg, model=model, options=options)


def record(path: Path) -> dict:
    """Run one shipped config, small; what it produced, as plain data."""
    import torch

    import diffaccel
    from diffaccel.runtime.accelerator import apply, build_strategies
    from diffaccel.runtime.adapters_registry import get_adapter

    cfg = shrink(diffaccel.load_config(path))
    adapter = get_adapter(cfg.model.adapter)
    pipe = adapter.load(cfg)
    strategies = build_strategies(cfg, None, adapter.info(pipe))
    with apply(pipe, cfg, strategies=strategies):  # the config's [guard] and on_error too
        out = adapter.run(pipe, cfg, cfg.model.seed, progress=False)
    c = out.report["counters"]
    counters = {k: c[k] for k in ("layers_computed", "layers_skipped", "positions_computed", "positions_total",
                                  "steps_reused")}
    if hasattr(out, "tokens"):
        return {"tokens": out.tokens.tolist(), "counters": counters}
    return {"images_8x8": fingerprint(out.images), "shape": list(out.images.shape), "counters": counters}


PINNED = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"}
"""Kernels that do not depend on the CPU's vector units; read once when torch starts, so set in a
child process (about 2x slower than the machine's own kernels: used only where draws need it)."""

KERNEL_PROBES = (PINNED, {"ATEN_CPU_CAPABILITY": "default"}, {"MKL_CBWR": "COMPATIBLE"}, {"ATEN_CPU_CAPABILITY": "avx2"},
                 {"MKL_ENABLE_INSTRUCTIONS": "AVX2"})
"""Other kernel choices a text config's tokens must survive to be compared with the machine's own,
one change each: two changes together can flip a near-tie draw and flip it back (the top-k config
drew its AVX2 tokens with ATen's or MKL's AVX2 kernels alone, its AVX-512 tokens with both)."""


def record_in_child(paths: list[Path], env: dict[str, str]) -> dict[str, dict]:
    """``record`` of each path in one fresh interpreter with ``env`` added (one thread, offline),
    by ``_key``."""
    proc = subprocess.run([sys.executable, __file__, "--emit", *map(str, paths)], capture_output=True, text=True,
                          timeout=1800, env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **env})
    if proc.returncode != 0:
        raise RuntimeError(f"recording {[_key(p) for p in paths]} with {env} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def record_pinned(path: Path, env: dict[str, str] | None = None) -> dict:
    """The record of a float-sensitive config, with ``PINNED`` kernels (``env`` on top)."""
    return {**record_in_child([path], {**PINNED, **(env or {})})[_key(path)], "kernels": "pinned"}


def float_sensitive(paths: list[Path], native: dict[str, dict]) -> set[str]:
    """The text configs among ``paths`` whose tokens change with the kernels (``KERNEL_PROBES``)."""
    texts = [p for p in paths if "tokens" in native[_key(p)]]
    changed: set[str] = set()
    for env in KERNEL_PROBES if texts else ():
        got = record_in_child(texts, env)
        changed |= {k for k, r in got.items() if r["tokens"] != native[k]["tokens"]}
    return changed


IMAGE_ATOL = 1e-3
"""Largest difference allowed between fingerprints (images in [0, 1]): far above rounding noise
between CPUs, far below what a changed computation moves."""


def fingerprint(images) -> list[float]:
    """Images (B, C, H, W) in [0, 1], average-pooled to 8x8 per channel, rounded to 5 decimals."""
    import torch.nn.functional as F

    pooled = F.adaptive_avg_pool2d(images.detach().to("cpu").float(), (8, 8))
    return [round(float(v), 5) for v in pooled.flatten()]


def matches(got: dict, want: dict) -> bool:
    """Equal, except that image fingerprints may differ by up to ``IMAGE_ATOL``."""
    if got.keys() != want.keys():
        return False
    if "images_8x8" not in got:
        return got == want
    a, b = got["images_8x8"], want["images_8x8"]
    rest = [k for k in got if k != "images_8x8"]
    return (len(a) == len(b) and max((abs(x - y) for x, y in zip(a, b)), default=0.0) <= IMAGE_ATOL
            and all(got[k] == want[k] for k in rest))


def _key(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.fixture
def one_thread():
    """Bit equality needs the same reductions: one CPU thread, as when the fixture was written."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_every_shipped_config_is_recorded(golden):
    assert sorted(golden) == sorted(_key(p) for p in CONFIGS)


@pytest.mark.parametrize("path", CONFIGS, ids=_key)
def test_outputs_equal_the_recorded_ones(path, golden, one_thread):
    want = golden[_key(path)]
    got = record_pinned(path) if want.get("kernels") == "pinned" else record(path)
    assert matches(got, want), f"{_key(path)}: {got} != {want}"


def test_pinned_tokens_do_not_follow_the_cpus_vector_units(golden):
    """A pinned config recorded as if MKL found AVX2 only (as on the machine whose draws differed
    from this kind's): the same tokens as recorded. Unpinned, that setting changes them."""
    pinned = sorted(k for k, v in golden.items() if v.get("kernels") == "pinned")
    assert "configs/text-llada-small-topk.toml" in pinned
    path = ROOT / pinned[0]
    assert record_pinned(path, {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}) == golden[pinned[0]]


def test_an_image_change_above_the_tolerance_fails():
    import torch

    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    want = {"images_8x8": fingerprint(images), "shape": [2, 3, 32, 32], "counters": {"layers_computed": 4}}
    noise = {**want, "images_8x8": fingerprint(images + 1e-5)}
    assert matches(noise, want)  # rounding noise passes
    brighter = images.clone()
    brighter[0, 0, :4, :4] += 0.1  # one 4x4 patch of one channel: 0.1 * 16 / 16 on its pooled cell
    assert not matches({**want, "images_8x8": fingerprint(brighter)}, want)
    assert not matches({**want, "counters": {"layers_computed": 5}}, want)  # a decision changed


if __name__ == "__main__":
    if sys.argv[1:2] == ["--emit"]:  # record_in_child's child: the configs' records, one JSON line
        import torch

        torch.set_num_threads(1)
        print(json.dumps({_key(Path(a)): record(Path(a)) for a in sys.argv[2:]}))
        sys.exit(0)
    if sys.argv[1:] not in (["--write"], ["--missing"]):
        sys.exit("usage: python tests/test_golden.py --write | --missing (record only configs with no record yet)")
    import torch

    torch.set_num_threads(1)
    result = json.loads(FIXTURE.read_text()) if sys.argv[1] == "--missing" else {}
    todo = [p for p in CONFIGS if _key(p) not in result]
    for p in todo:
        print(_key(p), flush=True)
        result[_key(p)] = record(p)
    for key in sorted(float_sensitive(todo, result)):
        print(f"{key}: tokens change with the kernels, recorded with PINNED ones", flush=True)
        result[key] = record_pinned(ROOT / key)
    result = dict(sorted(result.items()))
    FIXTURE.parent.mkdir(exist_ok=True)
    lines = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in result.items()]  # one config per line
    FIXTURE.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    print(f"wrote {FIXTURE}")
