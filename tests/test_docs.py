"""The plugin guide's example strategy runs as written."""

import re
import types
from pathlib import Path

from diffaccel import Registry, parse_config
from diffaccel.adapters.text.testing import tiny_text_pipeline
from diffaccel.testing import run_with

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "writing-a-plugin.md"


def test_guide_example_strategy_works():
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    module = types.ModuleType("diffaccel_lastlayer")
    exec(compile(blocks[0], str(GUIDE), "exec"), module.__dict__)
    reg = Registry(load_entrypoints=False)
    reg.register_plugin(module, name="lastlayer")
    cfg = parse_config({"model": {"adapter": "text"}, "strategy": [{"use": "lastlayer", "every": 2}]}, registry=reg)
    from diffaccel import build_strategies

    pipe = tiny_text_pipeline(n_layers=2)
    strategies = build_strategies(cfg, reg, {"n_layers": 2})
    out = run_with(pipe, strategies, steps=6)
    assert out.report["counters"]["layers_skipped"] == 3
    assert out.report["strategies"]["lastlayer"] == {"skipped": 3}
