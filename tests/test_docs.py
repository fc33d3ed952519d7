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


# ---- the task benchmarks page (docs/task_benchmarks.py) ------------------------------------------

def _task_benchmarks():
    import importlib.util

    import sys

    spec = importlib.util.spec_from_file_location("docs_task_benchmarks", GUIDE.parent / "task_benchmarks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_task_benchmarks_page_is_the_one_generated_from_the_benches():
    tb = _task_benchmarks()
    assert tb.PAGE.read_text() == tb.page(), "run `python docs/task_benchmarks.py --combine-only`"


def test_task_benches_measure_256_held_out_problems_per_entry_with_the_steps_line():
    tb = _task_benchmarks()
    for task in tb.TASKS.values():
        b = tb.benches(task)
        for name, batch in ((f"{task.name}-b1", 1), (f"{task.name}-b8", 8)):
            args = b[name]
            assert int(args[args.index("--seeds") + 1]) * batch >= 256 and int(args[args.index("--batch") + 1]) == batch
            assert task.base == args[0] and task.steps in args and all(s in args for s in task.strategies)
        assert "0.999" in b[f"{task.name}-threshold"][b[f"{task.name}-threshold"].index("--grid") + 1]


def test_task_figures_follow_the_bench_json(tmp_path):
    import json

    tb = _task_benchmarks()
    rep = lambda steps: {"steps_run": steps}  # noqa: E731
    entries = [{"name": "baseline", "speedup": 1.0, "quality": {"acc": 0.97, "cells_acc": 0.94}, "reports": [rep(41), rep(41)]},
               {"name": "sudoku-parallel[tau=0.99]", "speedup": 5.0, "quality": {"acc": 0.965, "cells_acc": 0.94}, "reports": [rep(8), rep(12)]},
               {"name": "sudoku-parallel[tau=0.9]", "speedup": 12.0, "quality": {"acc": 0.87, "cells_acc": 0.93}, "reports": [rep(3), rep(3)]},
               {"name": "steps-20", "speedup": 2.0, "quality": {"acc": 0.90, "cells_acc": 0.94}, "reports": [rep(20), rep(20)]}]
    path = tmp_path / "sudoku-threshold" / "bench.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"model": {"batch": 8}, "seeds": [0, 8], "entries": entries}))
    tb.summarise_runs(path, "diffaccel bench ...")
    res = tb.load("sudoku-threshold", tmp_path)
    assert res["command"] == "diffaccel bench ..." and "reports" not in res["entries"][0]
    assert tb.threshold_points(res) == [(0.9, 0.87, 41 / 3), (0.99, 0.965, 41 / 10)]
    assert tb.steps_points(res) == [(1.0, 0.97), (41 / 20, 0.90)]
    name, e = tb.fastest_within(res)  # within one point: tau 0.99 (5x), not 0.9 (12x at -0.10)
    assert name == "sudoku-parallel[tau=0.99]"


# ---- the real-shape benchmarks page (docs/real_shape_benchmarks.py) -------------------------------

def _real_shape():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("docs_real_shape", GUIDE.parent / "real_shape_benchmarks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_real_shape_page_is_the_one_generated_from_the_benches():
    rs = _real_shape()
    assert rs.PAGE.read_text() == rs.page(), "run `python docs/real_shape_benchmarks.py --combine-only`"
    for name, args in rs.BENCHES.items():  # both batches, the baseline first
        assert int(args[args.index("--batch") + 1]) == int(name[-1]) and args[0] in {b for _, b in rs.MODELS.values()}


def test_real_shape_gates_are_kept_from_the_run_reports(tmp_path):
    import json

    rs = _real_shape()
    gate = lambda on: {"swd": {"summary": f"swd cost gate: {'on' if on else 'off, full steps'} (a step with it 3 ms ...)"}}  # noqa: E731
    entries = [{"name": "baseline", "speedup": 1.0, "reports": [{"steps_run": 16, "strategies": {}}]},
               {"name": "long-swd", "speedup": 2.4, "fraction_computed": 0.31,
                "reports": [{"steps_run": 16, "strategies": gate(True)}, {"steps_run": 16, "strategies": gate(False)}]},
               {"name": "steps-8", "speedup": 2.0, "reports": [{"steps_run": 8, "strategies": {}}]}]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"entries": entries}))
    rs.keep_gates(path)
    got = json.loads(path.read_text())["entries"]
    assert got[1]["cost_gate"] == {"swd cost gate: on": 1, "swd cost gate: off, full steps": 1} and got[0]["cost_gate"] == {}
    line = rs.reading(got)
    assert "`long-swd` 2.40x computing 31%" in line and "`steps-8` 2.00x" in line


# ---- the architecture page's lifecycle and dispatch: generated from the hook rules -----------------

ARCHITECTURE = GUIDE.with_name("architecture.md")


def lifecycle_drawing_drift(text: str) -> list[str]:
    """What the hand-drawn lifecycle of docs/architecture.md gets wrong against
    ``hookspecs.RULES``: a run hook it omits, or two hooks drawn out of the rules' order."""
    from diffaccel.contract.hookspecs import RULES, RUN_HOOKS

    section = text.split("## The lifecycle of a run", 1)[1].split("\n## ", 1)[0]
    drawing = section.split("```", 2)[1]
    drawn = list(dict.fromkeys(re.findall(r"diffaccel_\w+", drawing)))
    order = list(RULES)
    problems = [f"{h} is not drawn" for h in RUN_HOOKS if h not in drawn]
    problems += [f"{h} is not a hook" for h in drawn if h not in RULES]
    known = [h for h in drawn if h in RULES]
    problems += [f"{a} is drawn before {b}" for a, b in zip(known, known[1:]) if order.index(a) > order.index(b)]
    return problems


def test_the_architecture_lifecycle_and_dispatch_are_generated_and_current():
    text = ARCHITECTURE.read_text()
    assert text == _docgen().render_architecture(), "docs/architecture.md is out of date: run 'make docs'"
    for block in ("lifecycle", "dispatch"):
        assert f"<!-- generated: {block} -->" in text
    assert lifecycle_drawing_drift(text) == []


def test_a_changed_hook_rule_changes_the_architecture_page(monkeypatch):
    """Drift is seen: a merge rule, a hook's order or its text changed in the code renders a
    different page, so the test above fails until 'make docs' is run."""
    import attrs

    from diffaccel.contract import hookspecs

    docgen = _docgen()
    current = docgen.render_architecture()
    rules = dict(hookspecs.RULES)
    monkeypatch.setitem(hookspecs.RULES, "diffaccel_pre_step", attrs.evolve(rules["diffaccel_pre_step"], merge=hookspecs.UNION))
    assert docgen.render_architecture() != current  # the merge rule, in both tables
    monkeypatch.setattr(hookspecs, "RULES", {k: rules[k] for k in [*list(rules)[::-1]]})
    reordered = docgen.render_architecture()
    assert reordered != current and reordered.index("| 1 | `diffaccel_run_end`") > 0  # the order of a run


def test_a_hand_drawn_lifecycle_out_of_the_rules_order_is_found():
    text = ARCHITECTURE.read_text()
    assert lifecycle_drawing_drift(text.replace("diffaccel_commit(run", "gone(run")) == ["diffaccel_commit is not drawn"]
    swapped = text.replace("diffaccel_pre_step(run)", "@@").replace("diffaccel_run_start(run)", "diffaccel_pre_step(run)").replace("@@", "diffaccel_run_start(run)")
    assert lifecycle_drawing_drift(swapped) == ["diffaccel_pre_step is drawn before diffaccel_run_start"]
