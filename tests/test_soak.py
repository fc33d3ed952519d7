"""The soak run (``tests/soak.py``), marked slow: excluded from ``make test``; ``make soak`` runs
it and writes its figures to docs/reliability.md."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import soak  # noqa: E402


@pytest.mark.slow
def test_500_generations_keep_memory_flat_and_outputs_identical_to_a_fresh_process():
    result = soak.soak(500)
    assert result["identical"], f"outputs after the soak differ from a fresh process: {result['differ']}"
    assert result["growth"] < soak.MAX_GROWTH, (
        f"resident memory grew {100 * result['growth']:.1f}% after the first {soak.WARMUP} generations")
