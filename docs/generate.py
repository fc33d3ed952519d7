"""Generate docs/writing-a-plugin.md from its template and the code that is the contract, and the
tables of docs/architecture.md from what the installed adapters and strategies declare.

    python docs/generate.py           # rewrite the generated docs
    python docs/generate.py --check   # exit 1 if one is out of date (tests/test_contract.py)

The reference part comes from ``diffaccel.hookspecs`` (lifecycle, exceptions, every hook with its
merge rule), ``diffaccel.capabilities``, the installed adapters (their capabilities and layer
objects, through the ``diffaccel.adapters`` entry points) and ``RunState.report`` (report keys).
"""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
TEMPLATE = DOCS / "templates" / "writing-a-plugin.md"
GUIDE = DOCS / "writing-a-plugin.md"
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
    from diffaccel import hookspecs

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

    from diffaccel import capabilities, hookspecs
    from diffaccel.adapters_registry import adapter_names, get_adapter
    from diffaccel.plugins import field_doc
    from diffaccel.state import Counters, RunState

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
            parts += [f"* **`{value}`** (`diffaccel.capabilities.{const[value]}`): {' '.join(doc.split())}"]
    parts += ["", "### Adapters and their layer objects", "",
              "Installed here (`diffaccel plugins` lists yours): what each declares and the `Layer` objects "
              "its `diffaccel_layer_output` calls hand over.", ""]
    for aname in adapter_names():
        a = get_adapter(aname)
        parts += [f"#### `{aname}`", "", f"Capabilities: {', '.join(f'`{c}`' for c in sorted(a.capabilities))}.", ""]
        for layer_type in a.layer_types:
            doc = " ".join((inspect.getdoc(layer_type) or "").split())
            parts += [f"* `{layer_type.__name__}`: {doc}"]
        parts += [""]
    from diffaccel.state import RunInfo

    parts += ["### Run info", "", " ".join(inspect.getdoc(RunInfo).split()), ""]
    for f in attrs.fields(RunInfo):
        parts += [f"* `run.info.{f.name}`: {field_doc(RunInfo, f.name)}"]
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
    from diffaccel.guard import Reliability

    parts += ["", "Only when the core did something for the run's reliability (docs/reliability.md), `reliability`:", ""]
    for f in attrs.fields(Reliability):
        parts += [f"* `reliability.{f.name}`: {field_doc(Reliability, f.name)}"]
    return "\n".join(parts).rstrip() + "\n"


def render() -> str:
    return TEMPLATE.read_text().replace("{{REFERENCE}}\n", reference())


# ---- the tables of docs/architecture.md ------------------------------------------------------------

def _needs(requires) -> str:
    """A strategy's ``requires`` as ``diffaccel plugins`` writes it (a tuple: alternatives)."""
    return ", ".join(r if isinstance(r, str) else " or ".join(r) for r in requires) or "nothing"


def architecture_tables() -> dict[str, str]:
    """Table name -> its markdown: ``adapters`` (each installed adapter's capabilities) and
    ``strategies`` (what each installed strategy declares it requires)."""
    from diffaccel import Registry
    from diffaccel.adapters_registry import describe_adapters

    adapters = ["| adapter | distribution | capabilities |", "| --- | --- | --- |"]
    adapters += [f"| {a['name']} | {a['distribution']} | {', '.join(a['capabilities'])} |" for a in describe_adapters()]
    strategies = ["| strategy | requires |", "| --- | --- |"]
    strategies += [f"| {r['name']} | {_needs(r['requires'])} |" for r in Registry().describe()]
    return {"adapters": "\n".join(adapters) + "\n", "strategies": "\n".join(strategies) + "\n"}


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
    generated = {GUIDE: render(), ARCHITECTURE: render_architecture()}
    if argv == ["--check"]:
        stale = [path for path, text in generated.items() if path.read_text() != text]
        for path in stale:
            print(f"{path} is out of date: run 'make docs'", file=sys.stderr)
        return 1 if stale else 0
    for path, text in generated.items():
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
