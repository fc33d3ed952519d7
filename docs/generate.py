"""Generate docs/writing-a-plugin.md and docs/writing-an-adapter.md from their templates and the
code that is the contract, and the tables of docs/architecture.md from what the installed
adapters and strategies declare.

    python docs/generate.py           # rewrite the generated docs
    python docs/generate.py --check   # exit 1 if one is out of date (tests/test_contract.py, tests/test_docs.py)

The plugin guide's reference comes from ``diffaccel.contract.hookspecs`` (lifecycle, exceptions, every hook
with its merge rule), ``diffaccel.contract.capabilities``, the installed adapters (their capabilities and
layer objects, through the ``diffaccel.adapters`` entry points) and ``RunState.report`` (report
keys). The adapter guide's (``adapter_reference``) comes from ``diffaccel.contract.adapter`` (the
``Adapter`` protocol and the optional ones), ``diffaccel.runtime.sequence`` (``RunSequence``,
``StepModel``), the hooks an adapter drives, ``diffaccel.contract.capabilities``, ``RunInfo`` and
``Counters``, ``diffaccel.conformance`` and ``diffaccel.adapters.diffusers.hooks``; its worked
example is the source of ``adapters/diffusers/unet2d/adapter.py``, as it is.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import textwrap
from pathlib import Path

DOCS = Path(__file__).resolve().parent
TEMPLATE = DOCS / "templates" / "writing-a-plugin.md"
GUIDE = DOCS / "writing-a-plugin.md"
ADAPTER_TEMPLATE = DOCS / "templates" / "writing-an-adapter.md"
ADAPTER_GUIDE = DOCS / "writing-an-adapter.md"
EXAMPLE = DOCS.parent / "adapters" / "diffusers" / "unet2d" / "adapter.py"
TEXT_EXAMPLE = DOCS.parent / "adapters" / "text" / "families" / "modernbert.py"
"""The adapter guide's worked example, included whole."""
ARCHITECTURE = DOCS / "architecture.md"
"""Hand-written, but for its tables between ``<!-- generated: NAME -->`` and ``<!-- end generated -->``."""


def _module_docs(module) -> list[tuple[str, str]]:
    """(name, docstring) of module-level constants documented by a string right below them."""
    tree = ast.parse(inspect.getsource(module))
    out = []
    for node, nxt in zip(tree.body, tree.body[1:]):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            out.append((node.targets[0].id, inspect.cleandoc(nxt.value.value)))
    return out


def hooks() -> list[tuple[str, str, bool, str]]:
    """(name, signature, firstresult, docstring) of every hookspec, in source order."""
    from diffaccel.contract import hookspecs

    out = []
    for name, fn in vars(hookspecs).items():
        if not name.startswith("diffaccel_") or not callable(fn):
            continue
        opts = getattr(fn, "diffaccel_spec", {})
        sig = str(inspect.signature(fn)).replace("'", "")
        out.append((name, sig, bool(opts.get("firstresult")), inspect.getdoc(fn) or ""))
    return out


def reference() -> str:
    import attrs

    from diffaccel.contract import capabilities, hookspecs
    from diffaccel.runtime.adapters_registry import adapter_names, get_adapter
    from diffaccel.runtime.registry import field_doc
    from diffaccel.contract.state import Counters, RunState

    parts = ["## Reference (generated)", "", "### Lifecycle and exceptions", "",
             inspect.getdoc(hookspecs).split("\n\n", 1)[1], "", "### Hooks", ""]
    for name, sig, first, doc in hooks():
        rule = hookspecs.RULES[name].describe()  # the merge rule, as the dispatcher reads it
        parts += [f"#### `{name}{sig}`", "", f"*{rule}*", "", doc, ""]
    parts += ["### Capabilities", "", inspect.getdoc(capabilities).split("\n\n", 1)[1], ""]
    const = {v: k for k, v in vars(capabilities).items() if isinstance(v, str) and k.isupper()}
    for name, doc in _module_docs(capabilities):
        value = getattr(capabilities, name)
        if isinstance(value, str):
            parts += [f"* **`{value}`** (`diffaccel.contract.capabilities.{const[value]}`): {' '.join(doc.split())}"]
    parts += ["", "### Adapters and their layer objects", "",
              "Installed here (`diffaccel plugins` lists yours): what each declares and the `Layer` objects "
              "its `diffaccel_layer_output` calls hand over.", ""]
    for aname in adapter_names(shipped=True):  # the project's own: an installed third party's is not ours to document
        a = get_adapter(aname)
        parts += [f"#### `{aname}`", "", f"Capabilities: {', '.join(f'`{c}`' for c in sorted(a.capabilities))}.", ""]
        for layer_type in a.layer_types:
            doc = " ".join((inspect.getdoc(layer_type) or "").split())
            parts += [f"* `{layer_type.__name__}`: {doc}"]
        parts += [""]
    from diffaccel.contract.info import RunInfo

    parts += ["### Run info", "", " ".join(inspect.getdoc(RunInfo).split()), ""]
    parts += run_info_lines()
    parts += [""]
    parts += ["### The run report", "",
              "`RunState.report()`, returned with every output as `out.report`, kept by the handle `diffaccel.apply` "
              "returns as `handle.last_report` (a diffusers pipeline's own output has no report) and per seed in "
              "`bench --json`:", ""]
    report_doc = {"adapter": "the adapter's name", "steps": "denoising steps planned", "steps_run": "steps run (less when a strategy stopped the run)",
                  "counters": "what the denoiser did (below), with `fraction_computed` = positions_computed / positions_total",
                  "strategies": "per strategy name, what it put in `run.metrics[self.name]`"}
    keys = list(RunState(adapter="-", num_steps=0, batch_size=0).report())
    for k in keys:
        parts += [f"* `{k}`: {report_doc.get(k, '')}"]
    parts += [""]
    for f in attrs.fields(Counters):
        parts += [f"* `counters.{f.name}`: {field_doc(Counters, f.name)}"]
    from diffaccel.runtime.guard import Reliability

    parts += ["", "Only when the core did something for the run's reliability (docs/reliability.md), `reliability`:", ""]
    for f in attrs.fields(Reliability):
        parts += [f"* `reliability.{f.name}`: {field_doc(Reliability, f.name)}"]
    return "\n".join(parts).rstrip() + "\n"


def render() -> str:
    return TEMPLATE.read_text().replace("{{REFERENCE}}\n", reference())


# ---- the adapter guide --------------------------------------------------------------------------

def _oneline(doc: str | None) -> str:
    return " ".join((doc or "").split())


def _class_attr_docs(cls) -> dict[str, str]:
    """Docstrings written under a class's annotated or assigned attributes (``x: int`` then a string)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    out = {}
    for node, nxt in zip(body, body[1:]):
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if (isinstance(target, ast.Name) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            out[target.id] = inspect.cleandoc(nxt.value.value)
    return out


def public_members(cls) -> list[tuple[str, str, str]]:
    """(name, signature or '', docstring) of a class's own public members, in source order:
    methods and properties, then documented attributes."""
    attr_docs = _class_attr_docs(cls)
    out, seen = [], set()
    for name, value in vars(cls).items():
        if name.startswith("_") or name in seen:
            continue
        fn = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
        if isinstance(fn, property):
            out.append((name, "", inspect.getdoc(fn) or ""))
        elif inspect.isfunction(fn):
            sig = str(inspect.signature(fn)).replace("'", "")
            out.append((name, sig, inspect.getdoc(fn) or ""))
        elif name in attr_docs:
            out.append((name, "", attr_docs[name]))
        else:
            continue
        seen.add(name)
    for name in getattr(cls, "__annotations__", {}):
        if not name.startswith("_") and name not in seen:
            out.append((name, "", attr_docs.get(name, "")))
    return out


def adapter_protocols() -> list[type]:
    """The optional adapter protocols (``typing.runtime_checkable``) of ``diffaccel.contract.adapter``, in source order."""
    from diffaccel.contract import adapter

    return [v for v in vars(adapter).values()
            if isinstance(v, type) and getattr(v, "_is_runtime_protocol", False) and v is not adapter.Adapter]


def adapter_hooks() -> list[tuple[str, list[str]]]:
    """(hook, the ``RunSequence`` methods that call it) of every hook an adapter drives: those the
    accelerator has a method for (``Accelerator.layer_output`` for ``diffaccel_layer_output``...)."""
    from diffaccel.runtime.accelerator import Accelerator
    from diffaccel.runtime.sequence import RunSequence

    callers: dict[str, list[str]] = {}
    for name, fn in vars(RunSequence).items():
        fn = fn.fget if isinstance(fn, property) else fn
        if inspect.isfunction(fn) and not name.startswith("__"):
            src = inspect.getsource(fn)
            for hook, *_ in hooks():
                if f"accel.{hook[len('diffaccel_'):]}(" in src:
                    callers.setdefault(hook, []).append(name)
    return [(hook, callers.get(hook, [])) for hook, *_ in hooks() if hasattr(Accelerator, hook[len("diffaccel_"):])]


def run_info_lines() -> list[str]:
    """``run.info``'s facts, one line each: its own, then each group's (``run.info.tokens.length``)."""
    import attrs

    from diffaccel.contract.info import GROUPS, RunInfo
    from diffaccel.runtime.registry import field_doc

    own = [f.name for f in attrs.fields(RunInfo) if f.name not in GROUPS]
    lines = [f"* `run.info.{name}`: {field_doc(RunInfo, name)}" for name in own if name != "extra"]
    for group, cls in GROUPS.items():
        lines += [f"* `run.info.{group}` (`diffaccel.contract.info.{cls.__name__}`): {_oneline(inspect.getdoc(cls))}"]
        lines += [f"  * `run.info.{group}.{f.name}`: {field_doc(cls, f.name)}" for f in attrs.fields(cls)]
    return lines + [f"* `run.info.extra`: {field_doc(RunInfo, 'extra')}"]


def _members_list(cls, prefix: str) -> list[str]:
    lines = []
    for name, sig, doc in public_members(cls):
        lines.append(f"* `{prefix}{name}{sig}`" + (f": {_oneline(doc)}" if doc else ""))
    return lines


def adapter_reference() -> str:
    import attrs

    from diffaccel import conformance
    from diffaccel.contract import adapter, capabilities
    from diffaccel.adapters.diffusers import hooks as diffusers_hooks
    from diffaccel.runtime.registry import field_doc
    from diffaccel.runtime.sequence import NullAccelerator, RunSequence, StepModel, Tally
    from diffaccel.contract.state import Counters, Layer, RunInfo, RunState

    parts = ["## Reference (generated)", "", "### The `Adapter` protocol (`diffaccel.contract.adapter.Adapter`)", "",
             _oneline(inspect.getdoc(adapter.Adapter)) + " Every member is required (`diffaccel plugins --check` "
             "names a missing one).", ""]
    parts += _members_list(adapter.Adapter, "")
    parts += ["", "### Optional protocols: what each unlocks", "",
              "Runtime-checkable protocols in `diffaccel.contract.adapter`: an adapter that has the members gets the feature.", ""]
    for proto in adapter_protocols():
        members = ", ".join(f"`{n}`" for n, *_ in public_members(proto))
        parts += [f"#### `{proto.__name__}` ({members})", "", _oneline(inspect.getdoc(proto)), ""]
        parts += _members_list(proto, "")
        parts += [""]
    parts += ["### Hooks an adapter drives", "",
              "The adapter calls these through the accelerator it is given (`attach(pipe, accelerator)`; a "
              "`diffaccel.NullAccelerator` has the same methods and does the least), in the order of "
              "`RunSequence` below. `diffaccel_layer_output` is called by the adapter's own layer code "
              "(`accelerator.layer_output(run, layer, hidden)`); the rest by the step sequence. The hook "
              "texts are in docs/writing-a-plugin.md.", ""]
    for hook, callers in adapter_hooks():
        name = hook[len("diffaccel_"):]
        by = ", ".join(f"`RunSequence.{c}`" for c in callers) or "the adapter's code"
        parts += [f"* `{hook}`: `accelerator.{name}(...)`, called by {by}."]
    parts += ["", "### `RunSequence` (`diffaccel.RunSequence`)", "", inspect.getdoc(sys.modules[RunSequence.__module__]), "",
              _oneline(inspect.getdoc(RunSequence)), ""]
    parts += _members_list(RunSequence, "seq.")
    parts += ["", "### `StepModel` (`diffaccel.StepModel`): what an adapter supplies per denoiser evaluation", "",
              _oneline(inspect.getdoc(StepModel)), ""]
    parts += _members_list(StepModel, "")
    parts += ["", "### `NullAccelerator`", "", _oneline(inspect.getdoc(NullAccelerator)), "",
              "Its methods, the accelerator interface an adapter may call: "
              + ", ".join(f"`{n}`" for n, sig, _ in public_members(NullAccelerator) if sig) + ".", ""]
    parts += ["### `Layer` (`diffaccel.Layer`): the base of every layer object", "", _oneline(inspect.getdoc(Layer)), ""]
    parts += ["* `name`, `index`, `kind`: set by `Layer.__init__(name, index, kind)`."]
    parts += _members_list(Layer, "layer.")
    parts += ["", "### Capabilities (`diffaccel.contract.capabilities`)", "",
              "Declare in `capabilities` only what your layers and steps really provide; each constant's text is "
              "what declaring it promises, and the strategies that need it run on your adapter unchanged.", ""]
    const = {v: k for k, v in vars(capabilities).items() if isinstance(v, str) and k.isupper()}
    for name, doc in _module_docs(capabilities):
        value = getattr(capabilities, name)
        if isinstance(value, str):
            parts += [f"* **`{value}`** (`diffaccel.contract.capabilities.{const[value]}`): {_oneline(doc)}"]
    parts += ["", "### Run state an adapter sets", ""]
    docs = _class_attr_docs(RunState)
    for f in attrs.fields(RunState):
        if not f.name.startswith("_") and f.name in docs:
            parts += [f"* `run.{f.name}`: {_oneline(docs[f.name])}"]
    parts += ["", "### Run info (`run.info`, `diffaccel.RunInfo`)", "", _oneline(inspect.getdoc(RunInfo)), ""]
    parts += run_info_lines()
    parts += ["", "### Counters (`run.counters`, `diffaccel.Counters`)", "", _oneline(inspect.getdoc(Counters)), ""]
    for f in attrs.fields(Counters):
        parts += [f"* `counters.{f.name}`: {field_doc(Counters, f.name)}"]
    parts += ["", "### Counting (`run.tally`, `diffaccel.runtime.sequence.Tally`)", "", _oneline(inspect.getdoc(Tally)), ""]
    parts += _members_list(Tally, "run.tally.")
    parts += ["", "### The conformance suite (`diffaccel.testing.check_adapter`)", "", inspect.getdoc(conformance), "",
              f"`check_adapter{str(inspect.signature(conformance.check_adapter)).replace(chr(39), '')}`: "
              f"{_oneline(inspect.getdoc(conformance.check_adapter))} Checks: "
              + ", ".join(f"`{c}`" for c in conformance.CHECKS) + ".", ""]
    parts += ["### The diffusers hook session (`diffaccel.adapters.diffusers.hooks`)", "", inspect.getdoc(diffusers_hooks), ""]
    for name in diffusers_hooks.__all__:
        obj = getattr(diffusers_hooks, name)
        if inspect.isclass(obj):
            parts += [f"#### `{name}`", "", _oneline(inspect.getdoc(obj)), ""]
            parts += _members_list(obj, "")
            parts += [""]
        else:
            parts += [f"#### `{name}{str(inspect.signature(obj)).replace(chr(39), '')}`", "", _oneline(inspect.getdoc(obj)), ""]
    return "\n".join(parts).rstrip() + "\n"


def text_protocol() -> str:
    """The text-model protocol, from ``diffaccel.adapters.text.protocol``: its docstring, the
    denoiser's members and optional members, the public pieces."""
    from diffaccel.adapters.text import protocol
    from diffaccel.runtime.registry import field_doc

    P = protocol.TextDenoiser
    parts = [inspect.getdoc(protocol), "", "**The denoiser** (`TextDenoiser`), attributes:", ""]
    parts += [f"* `{n}`: {' '.join((field_doc(P, n) or '').split())}" for n in P.__annotations__]
    parts += ["", "Methods:", ""]
    parts += [f"* `{n}{inspect.signature(getattr(P, n))}`: {inspect.getdoc(getattr(P, n))}"
              for n in ("condition", "embed", "block", "logits")]
    parts += ["", "Optional members:", ""] + [f"* `{n}`: {doc}" for n, doc in protocol.OPTIONAL.items()]
    parts += ["", "**The pieces** (`from diffaccel.adapters.text.protocol import ...`):", ""]
    for name in protocol.__all__:
        obj = getattr(protocol, name)
        doc = inspect.getdoc(obj) if callable(obj) or isinstance(obj, type) else None
        first = " ".join((doc or "").split("\n\n")[0].split()) if doc and name not in ("KINDS_GROUP", "OPTIONAL") else ""
        parts += [f"* `{name}`" + (f": {first}" if first else "")]
    return "\n".join(parts) + "\n"


def adapter_kit() -> str:
    """The names of ``diffaccel.adapterkit``, each with the first sentence of its docstring (of a
    constant: the string below it in its module)."""
    import importlib

    from diffaccel import adapterkit

    homes = {getattr(adapterkit, n).__module__ for n in adapterkit.__all__ if callable(getattr(adapterkit, n))}
    constants = {k: v for m in sorted(homes) for k, v in _module_docs(importlib.import_module(m))}
    parts = []
    for name in adapterkit.__all__:
        obj = getattr(adapterkit, name)
        doc = _oneline(inspect.getdoc(obj) if callable(obj) else constants.get(name))
        parts.append(f"* `{name}`" + (f": {doc.split('. ')[0].rstrip('.')}" if doc else ""))
    return "\n".join(parts) + "\n"


def render_adapter_guide() -> str:
    example = EXAMPLE.read_text()
    text_example = TEXT_EXAMPLE.read_text()
    return (ADAPTER_TEMPLATE.read_text().replace("{{EXAMPLE}}\n", f"```python\n{example}```\n")
            .replace("{{ADAPTER_KIT}}\n", adapter_kit())
            .replace("{{TEXT_PROTOCOL}}\n", text_protocol())
            .replace("{{TEXT_EXAMPLE}}\n", f"```python\n{text_example}```\n")
            .replace("{{REFERENCE}}\n", adapter_reference()))


# ---- the tables of docs/architecture.md ------------------------------------------------------------

def _needs(requires) -> str:
    """A strategy's ``requires`` as ``diffaccel plugins`` writes it (a tuple: alternatives)."""
    return ", ".join(r if isinstance(r, str) else " or ".join(r) for r in requires) or "nothing"


def _first_sentence(doc: str) -> str:
    text = _oneline(doc.split("\n\n")[0])
    return re.split(r"(?<=\.)\s+(?=[A-Z`(])", text)[0].rstrip(".")


def _cell(text: str) -> str:
    """A docstring's text as a markdown table cell (rst's double backticks single)."""
    return text.replace("``", "`").replace("|", "\\|")


def lifecycle_table() -> str:
    """The hooks a generation calls, in the order of ``hookspecs.RULES`` (the order a run calls
    them), each with the ``RunSequence`` method that calls it (read from its source, as
    ``adapter_hooks``) and how its results merge (``Rule.describe``)."""
    from diffaccel.contract.hookspecs import RULES

    driven = dict(adapter_hooks())
    rows = ["| # | hook | called by | per | results |", "| --- | --- | --- | --- | --- |"]
    run_hooks = [h for h in RULES if h in driven and (driven[h] or RULES[h].hot)]  # not hooked_modules (at attach)
    for i, hook in enumerate(run_hooks, 1):
        rule, callers = RULES[hook], driven[hook]
        by = ", ".join(f"`RunSequence.{c}`" for c in callers) or "the adapter's layer code (`accelerator.layer_output`)"
        per = "layer" if rule.hot else ("step" if set(callers) & {"denoise", "plan", "commit", "post_step"} else "generation")
        rows.append(f"| {i} | `{hook}` | {by} | {per} | {rule.describe()} |")
    return "\n".join(rows) + "\n"


def dispatch_table() -> str:
    """Every hook of ``hookspecs.RULES``, in order: when it is called (its docstring's first
    sentence), what it returns (its signature) and how the results of several strategies merge
    (``Rule.describe``, the rule the dispatcher is built from)."""
    from diffaccel.contract import hookspecs

    rows = ["| hook | when | returns | results merge |", "| --- | --- | --- | --- |"]
    for name, rule in hookspecs.RULES.items():
        fn = getattr(hookspecs, name)
        ret = inspect.signature(fn).return_annotation
        ret = "nothing" if ret in (None, "None") else f"`{str(ret).strip(chr(39))}`"
        merge = rule.describe() + ("; hot path, resolved once per run" if rule.hot else "")
        rows.append(f"| `{name}` | {_cell(_first_sentence(inspect.getdoc(fn) or ''))} | {_cell(ret)} | {merge} |")
    return "\n".join(rows) + "\n"


def architecture_tables() -> dict[str, str]:
    """Table name -> its markdown: ``adapters`` (each installed adapter's capabilities),
    ``strategies`` (what each installed strategy declares it requires), ``lifecycle`` (a
    generation's hooks in order) and ``dispatch`` (every hook: when, returns, merge rule)."""
    from diffaccel import Registry
    from diffaccel.runtime.adapters_registry import describe_adapters

    adapters = ["| adapter | distribution | capabilities |", "| --- | --- | --- |"]
    adapters += [f"| {a['name']} | {a['distribution']} | {', '.join(a['capabilities'])} |" for a in describe_adapters(shipped=True)]
    strategies = ["| strategy | requires |", "| --- | --- |"]
    strategies += [f"| {r['name']} | {_needs(r['requires'])} |" for r in Registry().describe()]
    return {"adapters": "\n".join(adapters) + "\n", "strategies": "\n".join(strategies) + "\n",
            "lifecycle": lifecycle_table(), "dispatch": dispatch_table()}


def render_architecture() -> str:
    """docs/architecture.md with its generated tables rewritten."""
    text = ARCHITECTURE.read_text()
    for name, table in architecture_tables().items():
        start, end = f"<!-- generated: {name} -->\n", "<!-- end generated -->"
        head, found, rest = text.partition(start)
        if not found:
            raise SystemExit(f"{ARCHITECTURE}: no '{start.strip()}' marker")
        text = head + start + table + rest[rest.index(end):]
    return text


def main(argv: list[str]) -> int:
    generated = {GUIDE: render(), ADAPTER_GUIDE: render_adapter_guide(), ARCHITECTURE: render_architecture()}
    if argv == ["--check"]:
        stale = [path for path, text in generated.items() if not path.is_file() or path.read_text() != text]
        for path in stale:
            print(f"{path} is out of date: run 'make docs'", file=sys.stderr)
        return 1 if stale else 0
    for path, text in generated.items():
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
