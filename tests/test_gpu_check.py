"""scripts/gpu-check.sh (issue 39), run here in its CPU variant: the matrix and the bench it
runs on a GPU, on the masked text model and one short bench."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diffaccel.runtime.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    """A module of scripts/ (not in the package), loaded once by file path."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


place = _script("dtype_matrix").place
SCRIPT = ROOT / "scripts" / "gpu-check.sh"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PY": sys.executable, "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_place_gives_every_config_the_first_ones_model_on_the_device(tmp_path):
    paths = place([str(ROOT / "configs/text-smollm2-speed.toml"), str(ROOT / "configs/text-swd.toml")], tmp_path,
                  "cpu", "bfloat16", steps=4, peers=False)
    speed, swd = (load_config(p) for p in paths)
    assert speed.model == swd.model and swd.model.checkpoint == "./runs/smollm2-135m"
    assert (swd.model.device, swd.model.dtype, swd.model.steps) == ("cpu", "bfloat16", 4)
    assert [s.name for s in swd.strategies] == ["swd"] and swd.peers == () and speed.strategies == ()


def test_a_bad_argument_is_one_line_exit_2():
    done = _run("--gpus", "2")
    assert done.returncode == 2 and done.stderr == "gpu-check: unknown argument '--gpus'; allowed: --device D, --dtype T, --tiny\n"


def test_cuda_missing_is_said_before_anything_runs():
    if __import__("torch").cuda.is_available():
        pytest.skip("this machine has CUDA")
    done = _run("--tiny")  # --device cuda by default
    assert done.returncode == 1
    assert "dtype_matrix: key 'device': 'cuda' but CUDA is not available here" in done.stderr
    assert "gpu-check: FAILED (cuda, bfloat16)" in done.stdout


def test_the_cpu_variant_runs_the_matrix_and_the_bench():
    done = _run("--device", "cpu", "--tiny")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = done.stdout
    assert "dtype_matrix: cpu bfloat16: 0 failed" in out and "ok   text-masked:swd" in out
    assert out.count("-- text-swd, batch") == 2 and "state MB" in out
    assert out.rstrip().endswith("gpu-check: passed (cpu, bfloat16)")
