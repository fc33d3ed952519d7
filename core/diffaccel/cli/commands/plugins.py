"""``diffaccel plugins``: the installed adapters and strategies; ``--check`` verifies each against
the contract (and the commands' registrations)."""

from __future__ import annotations

import json
import sys

HELP = "list installed adapters and strategies"
EXAMPLES = """
        example:
          diffaccel plugins
          DIFFACCEL_BLOCK_PLUGINS=swd diffaccel plugins
        Lists each adapter installed through the 'diffaccel.adapters' entry-point group (with the
        capabilities it declares) and each strategy installed through the 'diffaccel' group (with
        the capabilities it requires). --check also builds every strategy with its defaults and
        verifies its hooks against the contract (diffaccel.contract.hookspecs): misspelled or unmarked
        hooks and methods the core no longer calls are reported, exit code 2."""


def arguments(pl) -> None:
    pl.add_argument("--json", action="store_true", help="machine-readable output")
    pl.add_argument("--check", action="store_true", help="verify each adapter and strategy against the contract")


def run(args) -> int:
    import attrs

    from ...runtime.adapters_registry import describe_adapters
    from ...runtime.registry import Registry

    registry = Registry()
    adapters, rows = describe_adapters(), registry.describe()
    if args.check:
        return check(registry, adapters)
    broken = [attrs.asdict(b) for b in registry.broken.values()]
    if args.json:
        print(json.dumps({"adapters": adapters, "strategies": rows, "broken": broken}, indent=2, default=str))
        return 0
    _print_adapters(adapters)
    if broken:
        print("broken plugins (left out; every other plugin works):")
        for b in broken:
            print(f"  {b['name']}  ({b['distribution']} {b['version']})  {b['reason']}")
    if not rows:
        print("no strategies installed (pip install a plugin, e.g. pip install -e plugins/<name>)")
        return 0
    print("strategies:")
    for r in rows:
        needs = ", ".join(r if isinstance(r, str) else " or ".join(r) for r in r["requires"]) or "nothing"
        print(f"  {r['name']}  ({r['distribution']} {r['version']}, plugin '{r['plugin']}')  requires: {needs}")
        if r["description"]:
            print(f"      {r['description']}")
        for f in r["fields"]:
            doc = f"  # {f['doc']}" if f["doc"] else ""
            print(f"      {f['name']} = {f['default']!r}{doc}")
    return 0


def _print_adapters(adapters) -> None:
    print("adapters:")
    for a in adapters:
        print(f"  {a['name']}  ({a['distribution']} {a['version']}, {a['object']})")
        print(f"      capabilities: {', '.join(a['capabilities']) or 'none'}")
        if a["peers"]:
            print(f"      peers (bench): {', '.join(a['peers'])}")


def check(registry, adapters) -> int:
    """Build each strategy with its config's defaults and check its hooks; adapters were checked
    against the Adapter protocol when ``describe_adapters`` loaded them. Exit 1 when any plugin is
    broken (left out: it failed to import or to register) or breaks the contract: a plugin's fault,
    as for every command; a plugin author runs this in CI."""
    from ...runtime.registry import contract_problems
    from . import CORE, undeclared

    bad = 0
    for line in undeclared(CORE, registry):  # a command --help would not list and typing would not find
        print(line, file=sys.stderr)
        bad += 1
    for b in sorted(registry.broken.values(), key=lambda b: b.name):
        print(f"plugin {b.name} ({b.distribution} {b.version}): broken, left out: {b.reason}", file=sys.stderr)
        bad += 1
    for a in adapters:
        print(f"adapter {a['name']}: ok")
    for name, spec in sorted(registry.strategies.items()):
        try:
            strategy = spec.factory(spec.config())
        except Exception as exc:  # a config without defaults, or a factory that needs a model
            print(f"strategy {name}: not built with its defaults ({type(exc).__name__}: {exc}); hooks of its class checked")
            strategy = spec.factory.__new__(spec.factory) if isinstance(spec.factory, type) else None
        problems = contract_problems(strategy) if strategy is not None else []
        for p in problems:
            print(f"strategy {name}: {p}", file=sys.stderr)
        bad += bool(problems)
        if not problems:
            print(f"strategy {name}: ok")
    return 1 if bad else 0


def register(commands) -> None:
    commands.add("plugins", help=HELP, arguments=arguments, run=run, examples=EXAMPLES)
