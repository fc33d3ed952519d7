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


# ---- the adapter guide ----------------------------------------------------------------------------

ADAPTER_GUIDE = GUIDE.with_name("writing-an-adapter.md")


def _docgen():
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_generate", GUIDE.parent / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def missing_from_guide(text: str) -> list[str]:
    """What an adapter author must find in the guide and ``text`` lacks: every hook an adapter
    drives, every capability and optional adapter protocol, every member of ``Adapter``,
    ``StepModel`` and ``RunSequence``, the counters, run info, conformance checks and the diffusers
    hook session's public names. Read from the code here, not from the generator."""
    import inspect

    from diffaccel import conformance
    from diffaccel.contract import adapter, capabilities, hookspecs
    from diffaccel.runtime.accelerator import Accelerator
    from diffaccel.adapters.diffusers import hooks as diffusers_hooks
    from diffaccel.runtime.sequence import RunSequence, StepModel
    from diffaccel.contract.info import GROUPS
    from diffaccel.contract.state import Counters, RunInfo

    import attrs

    want = [f"`{n}`" for n in dir(hookspecs) if n.startswith("diffaccel_") and hasattr(Accelerator, n[len("diffaccel_"):])]
    want += [f"`{v}`" for k, v in vars(capabilities).items() if k.isupper() and isinstance(v, str)]
    want += [f"`{n}`" for n, v in vars(adapter).items() if isinstance(v, type) and getattr(v, "_is_runtime_protocol", False)]
    want += [f"`{n}" for n in adapter.MEMBERS]
    want += [f"`{n}(" for n, v in vars(StepModel).items() if inspect.isfunction(v) and not n.startswith("_")]
    want += [f"`seq.{n}" for n in vars(RunSequence) if not n.startswith("_") and n not in RunSequence.__slots__]
    want += [f"`counters.{f.name}`" for f in attrs.fields(Counters)]
    want += [f"`run.info.{f.name}`" for f in attrs.fields(RunInfo) if f.name not in GROUPS]
    want += [f"`run.info.{g}.{f.name}`" for g, cls in GROUPS.items() for f in attrs.fields(cls)]
    want += [f"`{c}`" for c in conformance.CHECKS]
    want += [f"`{n}" for n in diffusers_hooks.__all__]
    from diffaccel.adapters.text import protocol  # the text-model protocol: every public piece and member

    want += [f"`{n}`" for n in protocol.__all__]
    want += [f"`{n}" for n in [*protocol.TextDenoiser.__annotations__, "condition", "embed", "block", "logits", *protocol.OPTIONAL]]
    return [w for w in want if w not in text]


def test_the_adapter_guide_is_generated_and_current():
    assert ADAPTER_GUIDE.read_text() == _docgen().render_adapter_guide(), \
        "docs/writing-an-adapter.md is out of date: run 'make docs'"


def test_the_adapter_guide_names_every_contract():
    text = ADAPTER_GUIDE.read_text()
    assert missing_from_guide(text) == []
    assert (Path(__file__).resolve().parents[1] / "adapters" / "diffusers" / "unet2d" / "adapter.py").read_text() in text  # the worked example, whole
    assert (Path(__file__).resolve().parents[1] / "adapters" / "text" / "families" / "modernbert.py").read_text() in text  # the text one


def test_a_contract_missing_from_the_guide_is_found():
    text = ADAPTER_GUIDE.read_text()
    for item in ("`diffaccel_post_step`", "`block-stack`", "`KnowsFacts`", "`seq.denoise", "`reuse(", "`counters.layers_skipped`",
                 "`call_pipeline", "`attend_positions`"):
        assert item in missing_from_guide(text.replace(item, "`gone")), item


def test_the_guides_are_linked_from_readme_and_architecture():
    root = Path(__file__).resolve().parents[1]
    for doc in ("README.md", "docs/architecture.md"):
        assert "writing-an-adapter.md" in (root / doc).read_text(), doc
