"""Run on its own (``pytest plugins/<name>/tests``) this suite does not see the repository's
conftest.py: the text caches' cost gate is pinned on here too, so that their decisions do not
depend on the machine's load (``diffaccel.kit.paygate``; the gate's own tests use a fake clock)."""

import os

os.environ.setdefault("DIFFACCEL_COST_GATE", "on")
