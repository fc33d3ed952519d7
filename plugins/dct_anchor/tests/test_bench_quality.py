"""dct-anchor's bench column ``deep_steps``: how often the deep path was computed per run (what
the removed digits_quality.py script printed), from the decisions the strategy records."""

from __future__ import annotations

from types import SimpleNamespace

from diffaccel_dct_anchor.strategy import DCTAnchor


def out(*branches: str):
    """A run's output whose report holds one decision string per guidance branch (first block)."""
    rec = {str(i): {"down.2": {"decisions": list(d)}, "up.0": {"decisions": list("CCCC")}} for i, d in enumerate(branches)}
    return SimpleNamespace(report={"strategies": {"dct-anchor": {"branches": rec}}})


def test_deep_steps_counts_the_first_blocks_steps_not_served_from_the_cache():
    s = DCTAnchor()
    q = s.diffaccel_bench_quality(outputs=[out("WRRC", "WRRR"), out("WCCF", "WRRM")], seeds=[0, 10])
    assert q == {"deep_steps": (2 + 1 + 4 + 2) / 4}


def test_runs_without_the_strategy_report_nothing():
    s = DCTAnchor()
    assert s.diffaccel_bench_quality(outputs=[SimpleNamespace(report={"strategies": {}})], seeds=[0]) == {}
