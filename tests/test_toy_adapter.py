"""Proof by a third party: an adapter the core never heard of, installed as its own distribution.

tests/toy_adapter/ is a distribution with a ``diffaccel.adapters`` entry point (``toy``): a small
U-shaped MLP denoiser over vectors, declaring only ``block-stack``. It is pip-installed into a
throwaway folder put on PYTHONPATH, so only the subprocesses below see it. No file of the core or
of a shipped plugin mentions it: time-anchor runs on it unchanged (its block policy), and the
strategies needing what it lacks are refused by ``diffaccel check`` naming the capability.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOY = Path(__file__).resolve().parent / "toy_adapter"
MODEL = '[model]\nadapter = "toy"\nsteps = 24\nbatch = 3\ndim = 8\n'


@pytest.fixture(scope="module")
def site(install_distribution):
    return install_distribution(TOY)


def _run(site, *args):
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-m", "diffaccel.cli.entry", *args], capture_output=True, text=True, env=env)


def test_listed_beside_the_shipped_adapters(site):
    proc = _run(site, "plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    adapters = {a["name"]: a for a in json.loads(proc.stdout)["adapters"]}
    assert adapters["toy"]["distribution"] == "diffaccel-toy-adapter" and adapters["toy"]["version"] == "0.3.1"
    assert adapters["toy"]["capabilities"] == ["block-stack"]
    assert {"text", "unet"} <= set(adapters)
    assert _run(site, "plugins", "--check").returncode == 0


@pytest.mark.parametrize("strategy, missing", [
    ("swd", "token-positions"), ("topk", "token-logits"), ("dct-anchor", "block-stack"),
])
def test_strategies_it_cannot_serve_are_refused_naming_the_capability(site, tmp_path, strategy, missing):
    cfg = tmp_path / "c.toml"
    cfg.write_text(MODEL + f'[[strategy]]\nuse = "{strategy}"\n')
    proc = _run(site, "check", str(cfg))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    if strategy == "dct-anchor":  # the toy has a block stack, but no image steps and no feature maps
        missing = "spatial-features' or 'image-steps"
    assert (f"{cfg}: [[strategy]] #1 ({strategy}): strategy '{strategy}' requires capability '{missing}', "
            f"which adapter 'toy' does not declare; it declares: block-stack") in proc.stderr


RUN = '''
import json, sys, torch
import diffaccel
from diffaccel.bench.options import BenchOptions
from diffaccel.bench.runner import run_bench

cfg = diffaccel.load_config(sys.argv[1])
pipe = diffaccel.load_pipeline(cfg)
with diffaccel.apply(pipe, cfg):
    fast = pipe(seed=0, batch=3, steps=24)
plain = pipe(seed=0, batch=3, steps=24)
again = pipe(seed=0, batch=3, steps=24)
bench = run_bench([sys.argv[1]], BenchOptions(seeds=2, progress=False))
print(json.dumps({"report": fast.report, "plain_report": plain.report,
                  "removed_bitwise": bool(torch.equal(plain.vectors, again.vectors)),
                  "rel_error": float((fast.vectors - plain.vectors).norm() / plain.vectors.norm()),
                  "bench": [(e.name, e.quality, e.fraction_computed) for e in bench.entries]}))
'''


def test_time_anchor_runs_on_it_unchanged(site, tmp_path):
    cfg = tmp_path / "ta.toml"
    cfg.write_text(MODEL + '[[strategy]]\nuse = "time-anchor"\nthreshold = 0.05\nwarmup = 3\nmax_age = 4\nmin_depth = 1\n')
    assert _run(site, "check", str(cfg)).returncode == 0
    proc = subprocess.run([sys.executable, "-c", RUN, str(cfg)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(site)})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    c, ta = out["report"]["counters"], out["report"]["strategies"]["time-anchor"]
    # the deep blocks (depth >= 1: down.1, mid, up.1) were answered from their cache, not run
    assert c["layers_skipped"] > 0 and c["layers_computed"] + c["layers_skipped"] == 24 * 5
    assert ta["layers"] == ["down.0", "down.1", "mid", "up.1", "up.0"]
    assert ta["skipped_per_block"][0] == 0 and ta["skipped_per_block"][4] == 0  # the outer depth always runs
    assert ta["skipped_per_block"][1] == ta["skipped_per_block"][2] == ta["skipped_per_block"][3] > 0
    assert out["plain_report"]["counters"]["layers_skipped"] == 0 and out["removed_bitwise"]
    assert 0 < out["rel_error"] < 0.5  # cached deep features change the result, a little
    names = [name for name, _q, _f in out["bench"]]
    assert names == ["baseline", "ta"]
    assert out["bench"][0][1]["rel_error"] == 0.0 and out["bench"][1][1]["rel_error"] > 0


BAD_PYPROJECT = '''
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "diffaccel-bad-adapter"
version = "1.0"

[project.entry-points."diffaccel.adapters"]
bad = "diffaccel_bad:Adapter"

[tool.setuptools]
py-modules = ["diffaccel_bad"]
'''


@pytest.mark.parametrize("body, message", [
    ("class Adapter:\n    name = 'bad'\n    Options = object\n",
     "adapter 'bad' (distribution diffaccel-bad-adapter) does not implement the Adapter protocol: missing PEERS, accepts,"),
    ("raise RuntimeError('adapter import exploded')\n",
     "adapter 'bad' (distribution diffaccel-bad-adapter) failed to load: RuntimeError: adapter import exploded"),
])
def test_a_broken_adapter_is_one_line_naming_its_distribution(tmp_path, install_distribution, body, message):
    src = tmp_path / "bad-adapter"
    src.mkdir()
    (src / "pyproject.toml").write_text(BAD_PYPROJECT)
    (src / "diffaccel_bad.py").write_text(body)
    proc = _run(install_distribution(src), "plugins")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert message in proc.stderr
