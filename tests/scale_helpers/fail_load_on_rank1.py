"""Run the diffaccel CLI where the text model fails to load on process 1 only (RANK=1 under
accelerate launch): test_scale_out.py checks that both processes stop with the one line."""

import os
import sys

from diffaccel.adapters.text.adapter import TextAdapter
from diffaccel.cli.entry import main
from diffaccel.contract.errors import ModelLoadError

real_load = TextAdapter.load


def load(config):
    if os.environ.get("RANK") == "1":
        raise ModelLoadError(f"checkpoint '{config.model.checkpoint}': cannot load on this process")
    return real_load(config)


TextAdapter.load = staticmethod(load)
sys.exit(main(sys.argv[1:]))
