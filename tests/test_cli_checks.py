"""The command line's own checks run before any adapter or model library is imported (issue 35):
each case runs in a fresh interpreter and reports the exit code and whether torch or diffusers
were imported by then, so a check that moved after an adapter import fails here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

DIGITS = '[model]\nadapter = "unet"\ncheckpoint = "digits"\nsteps = 3\n'
TEXT = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 16\n'

PROBE = """
import json, sys
from diffaccel.cli.entry import main
rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "heavy": sorted(m for m in ("torch", "diffusers", "transformers") if m in sys.modules)}))
"""


def run_cli(tmp_path, *argv: str) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "DIFFACCEL_PLUGINS": ""}, timeout=120)
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.fixture
def configs(tmp_path):
    (tmp_path / "digits.toml").write_text(DIGITS)
    (tmp_path / "text.toml").write_text(TEXT)
    (tmp_path / "bad.toml").write_text('[model]\nadapter = "unet"\nsteps = [\n')
    (tmp_path / "eta.toml").write_text(DIGITS + "eta = 3.0\n")
    (tmp_path / "a-file").write_text("x")
    return tmp_path


@pytest.mark.parametrize("argv, named", [
    (["generate", "digits.toml", "--out", "grid.txt"], "must end in .png"),
    (["generate", "digits.toml", "--out", "a-file/grid.png"], "a-file is a file"),
    (["generate", "text.toml", "--out", "."], "is a folder"),
    (["generate", "missing.toml"], "no such config file"),
    (["generate", "bad.toml"], "invalid TOML"),
    (["generate", "eta.toml"], "key 'eta'"),
    (["generate", "digits.toml", "--prompts", "none.txt", "--out", "o"], "prompts file not found"),
    (["bench", "digits.toml", "missing.toml"], "missing.toml"),
    (["bench", "digits.toml", "--seeds", "0"], "--seeds must be 1 or more"),
    (["check", "digits.toml", "bad.toml"], "bad.toml"),
    (["overhead", "text.toml", "--repeats", "0"], "--repeats must be 1 or more"),
])
def test_bad_input_is_refused_before_any_model_library_is_imported(configs, argv, named):
    result, err = run_cli(configs, *argv)
    assert result == {"rc": 2, "heavy": []}
    assert named in err and len(err.strip().splitlines()) == 1


def test_a_good_config_goes_on_to_import_the_adapter(configs):
    """The probe itself can tell: ``check`` of a good config does import the adapter's libraries."""
    result, err = run_cli(configs, "check", "digits.toml")
    assert result["rc"] == 0 and "torch" in result["heavy"], err
