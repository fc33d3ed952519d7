"""The ``diffaccel`` command line. Every user mistake is one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import textwrap

from ..contract.errors import ConfigError, DiffaccelError, ModelError, NonFiniteError, StrategyError
from .examples import EXAMPLES

CORE_CHECKED = ("generate", "bench", "overhead", "partial", "check", "tune", "scale-bench", "fluency")
"""Core commands whose paths, files and counts ``outputs.precheck`` checks first."""


def add_command(sub, c, common: argparse.ArgumentParser) -> None:
    """A registered command (``diffaccel.cli.commands.Command``) as a subparser that runs it."""
    epilog = f"{textwrap.dedent(c.examples).strip()}\n(from {c.source})" if c.examples else f"(from {c.source})"
    p = sub.add_parser(c.name, help=c.help, description=c.help, epilog=epilog,
                       formatter_class=argparse.RawDescriptionHelpFormatter, parents=[common])
    if c.arguments is not None:
        c.arguments(p)
    p.set_defaults(registered=c.run)


def _parser(extra: list | None = None) -> argparse.ArgumentParser:
    from .. import __version__

    extra = extra or []

    p = argparse.ArgumentParser(
        prog="diffaccel",
        description="Sample diffusion models faster by composing accelerator strategies from a TOML config.",
        epilog="Run 'diffaccel COMMAND --help' for a command's options and an example.",
    )
    p.add_argument("--version", action="version", version=f"diffaccel {__version__}")
    debug_help = "print the traceback of a strategy's exception too, and notes (or set DIFFACCEL_DEBUG=1)"
    p.add_argument("--debug", action="store_true", help=debug_help)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)

    def cmd(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, epilog=textwrap.dedent(EXAMPLES[name]),
                              formatter_class=argparse.RawDescriptionHelpFormatter, parents=[common])

    g = cmd("generate", "run a config and write its outputs")
    g.add_argument("config", help="TOML config file")
    g.add_argument("--out", help="output file (text: default stdout; images: default <config name>.png here)")
    g.add_argument("--seed", type=int, help="override [model] seed")
    g.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    g.add_argument("--prompts", metavar="FILE", help="one item per line; --out is then a folder (docs/scale-out.md)")
    g.add_argument("--prompt", metavar="TEXT", help="the prompt of this run (text models: replaces [model] prompts; "
                   "a task model's must be a problem of its task)")

    b = cmd("bench", "compare configs with the baseline: speedup and quality side by side")
    b.add_argument("configs", nargs="+", help="TOML configs sharing one [model]")
    b.add_argument("--seeds", type=int, default=3, help="seeds (batches) per entry (default 3)")
    b.add_argument("--repeats", type=int, default=1, help="timed passes over all seeds (default 1)")
    b.add_argument("--batch", type=int, help="override [model] batch: rows generated per call (e.g. 8, as a server batches requests)")
    b.add_argument("--json", dest="json_path", help="write the results as JSON")
    b.add_argument("--plots", dest="plot_dir", help="folder for the strategies' plots")
    b.add_argument("--report", dest="report_dir", metavar="DIR",
                   help="write DIR/index.md and DIR/index.html: table, Pareto plot, image grid or samples, plots, versions")
    b.add_argument("--no-noise-floor", action="store_true", help="skip the perturbed reference runs (and gen_ppl_noise's seeds)")
    b.add_argument("--seed", type=int, help="override [model] seed: the first seed (e.g. seeds kept for tuning)")
    b.add_argument("--judge", default="default", metavar="NAME_OR_PATH",
                   help="language model scoring text samples (gen_ppl): smollm2 (default), none, a causal LM folder or hub id, a .gguf file")
    b.add_argument("--quality-only", action="store_true",
                   help="no timing, no warm-up: each entry once per seed, quality only (more seeds; no quiet machine needed)")
    b.add_argument("--solver-line", action="store_true",
                   help="image models: add the same model at fewer steps (steps-N) and under DPM-Solver++ (dpm++2m-N), "
                        "the line every strategy must sit above")
    b.add_argument("--grid", action="append", default=[], metavar="[STRATEGY.]KEY=V1,V2",
                   help="run each config's strategy at each value (repeat for a product grid); entries named by their values")
    b.add_argument("--no-progress", action="store_true")
    b.add_argument("--prompts", metavar="FILE", help="one item per line instead of --seeds; shared by the processes of 'accelerate launch'")

    o = cmd("overhead", "measure the hook machinery's cost with no strategy active")
    o.add_argument("config")
    o.add_argument("--repeats", type=int, default=10, help="interleaved rounds, one run of each entry (default 10)")
    o.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    o.add_argument("--batch", type=int, help="override [model] batch")
    o.add_argument("--steps", type=int, help="override [model] steps (shorter runs; the costs measured are per step)")
    o.add_argument("--guard", type=int, default=0, metavar="N",
                   help="also time a pass-through strategy with [guard] every = N against the same with the guard off")

    pa = cmd("partial", "benchmark partial computation: a step at 100%% down to one position per row")
    pa.add_argument("config")
    pa.add_argument("--repeats", type=int, default=30)
    pa.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    pa.add_argument("--batch", type=int, help="override [model] batch")

    pl = cmd("plugins", "list installed adapters and strategies")
    pl.add_argument("--json", action="store_true", help="machine-readable output")
    pl.add_argument("--check", action="store_true", help="verify each adapter and strategy against the contract")

    c = cmd("check", "validate configs")
    c.add_argument("configs", nargs="+")

    t = cmd("train", "train a model an adapter offers: diffaccel train MODEL --help")
    models = t.add_subparsers(dest="model", required=True, metavar="MODEL")
    for c in extra:
        if c.group == "train":
            add_command(models, c, common)

    sb = cmd("scale-bench", "throughput of generate --prompts on N processes against one")
    sb.add_argument("config")
    sb.add_argument("--prompts", required=True, metavar="FILE", help="the items (one per line)")
    sb.add_argument("--processes", type=int, default=2, help="processes of the scaled run (default 2)")
    sb.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    sb.add_argument("--repeats", type=int, default=1, help="pairs of runs, alternating which goes first (default 1)")

    tu = cmd("tune", "find the fastest strategy settings within a quality budget, proven on held-out seeds")
    tu.add_argument("config", help="TOML config whose [[strategy]] tables are tuned (each may also be switched off)")
    tu.add_argument("--budget", action="append", required=True, metavar="EXPR",
                    help="a bound on a bench quality metric, repeatable: gen_ppl<=+5%%, distinct2>=-5%%, psnr>=30, acc>=-0.02")
    tu.add_argument("--out", required=True, metavar="TUNED.toml", help="where the tuned config goes (written only if a point passes)")
    tu.add_argument("--trials", type=int, default=30, help="search trials in all, a resumed study included (default 30)")
    tu.add_argument("--tune-seeds", type=int, default=8, help="seeds (batches) each trial runs, from [model] seed (default 8)")
    tu.add_argument("--heldout", type=int, default=32, help="held-out samples for the final check (default 32; 128 for a +-5%% text bound)")
    tu.add_argument("--heldout-seed", type=int, default=100_000, help="first held-out seed (default 100000)")
    tu.add_argument("--batch", type=int, help="the held-out bench's second batch size (default: the config's, or 8 if it is 1)")
    tu.add_argument("--candidates", type=int, default=3, help="best feasible trials re-measured on held-out seeds (default 3)")
    tu.add_argument("--judge", default="default", metavar="NAME_OR_PATH", help="as bench's --judge (gen_ppl budgets need one)")
    tu.add_argument("--model-space", action="append", default=[], metavar="KEY=V1,V2",
                    help="image models: search [model] steps or scheduler too, repeatable: steps=8,10,12 scheduler=ddim,dpm++2m")
    tu.add_argument("--report", metavar="DIR", help="study (study.db: rerun to resume), held-out benches and figures (default OUT.tune/)")
    tu.add_argument("--no-progress", action="store_true")

    se = cmd("serve", "serve a config over HTTP (OpenAI-compatible), batching requests")
    se.add_argument("config", help="TOML config: the model and its strategies (preset 'default')")
    se.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    se.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    se.add_argument("--max-batch", type=int, default=8, help="rows generated together at most (default 8; 1: no batching)")
    se.add_argument("--batch-window-ms", type=float, default=10.0, help="wait this long after a request for others to batch with (default 10)")
    se.add_argument("--queue", type=int, default=64, help="requests waiting at most; past it 503 + Retry-After (default 64)")
    se.add_argument("--preset", action="append", metavar="NAME=CONFIG", help="another strategy preset: a config with the same [model]")
    se.add_argument("--batch-inexact", action="store_true",
                    help="batch requests together even where a row differs alone and in a batch by float rounding (checked at start)")
    se.add_argument("--shutdown-timeout", type=float, default=60.0, help="seconds SIGTERM waits for the running batch (default 60)")
    se.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"], help="uvicorn's log level (default warning)")

    f = cmd("fluency", "fluency of a model's samples beside reference texts")
    f.add_argument("config")
    f.add_argument("--seeds", type=int, default=4)
    f.add_argument("--judge", default="default", metavar="NAME_OR_PATH", help="as bench's --judge: gen_ppl's language model, or none")
    for c in extra:
        if c.group is None:
            add_command(sub, c, common)
    return p


CORE = ("generate", "bench", "overhead", "partial", "plugins", "check", "train", "tune", "scale-bench", "fluency")
"""The core's commands: parsed without importing any plugin or adapter, except ``train`` (its
models come from adapters)."""


def _registered(argv: list[str]) -> list:
    """The registered commands parsing ``argv`` needs: none for a core command (``train``
    aside); for ``diffaccel --help`` (and ``train --help``) each declared command as a listing
    entry, from the distributions' metadata, importing nothing; for a registered command, that
    command's registration alone (and the others as listing entries, for usage messages). A
    command no distribution declares is unknown (``plugins --check`` names registrations that
    add undeclared ones), so a mistyped command fails at once."""
    words = [a for a in argv if not a.startswith("-")]
    if words and words[0] in CORE and words[0] != "train":
        return []
    if not words and not ("-h" in argv or "--help" in argv):
        return []
    from .commands import declared, load_declared

    found, problems = declared(CORE)
    for line in problems:
        _say(f"diffaccel: warning: {line}")
    if words[:1] == ["train"]:
        want = ("train", words[1]) if len(words) > 1 else None
    else:
        want = (None, words[0]) if words else None
    match = next((d for d in found if (d.group, d.name) == want), None)
    try:
        loaded = load_declared(match, CORE) if match is not None else None
    except DiffaccelError as exc:
        _say(f"diffaccel: error: {exc}")
        sys.exit(2)
    return [loaded if d is match else _listed(d) for d in found]


def _listed(d) -> object:
    """A declared command, not imported, as an entry of the usage lists: its help says where it
    comes from; typing it imports its registration (``_registered``)."""
    from .commands import Command

    def not_loaded(args):  # only reachable if _registered did not import the typed command
        raise ConfigError(f"command '{d.typed}' ({d.source}) was not loaded")

    return Command(name=d.name, group=d.group, help=f"from {d.source}: 'diffaccel {d.typed} --help'", run=not_loaded,
                   source=d.source)


def with_prompt(cfg, prompt: str):
    """``cfg`` whose rows all take ``prompt`` (``generate --prompt``): one line if the adapter takes
    no prompt or the options refuse it (a task model's prompt that is not a problem of its task)."""
    import attrs

    from ..contract.errors import ConfigValueError

    if "prompts" not in attrs.fields_dict(type(cfg.options)):
        raise ConfigError(f"--prompt: the {cfg.model.adapter} adapter takes no prompt")
    try:
        return attrs.evolve(cfg, options=attrs.evolve(cfg.options, prompts=[prompt]))
    except ConfigValueError as exc:
        raise ConfigError(f"--prompt: {exc.message}") from None


def _generate(args) -> int:
    if args.prompts is not None:
        from ..runtime.jobs import main_generate

        return main_generate(args)
    import attrs

    from ..runtime.accelerator import apply, build_strategies
    from ..runtime.adapters_registry import get_adapter
    from ..runtime.config import load_config
    from .outputs import generate_out
    from ..runtime.registry import Registry

    registry = Registry()
    cfg = load_config(args.config, registry)
    if args.seed is not None:
        cfg = attrs.evolve(cfg, model=attrs.evolve(cfg.model, seed=args.seed))
    if args.prompt is not None:
        cfg = with_prompt(cfg, args.prompt)
    adapter = get_adapter(cfg.model.adapter)
    out_path = generate_out(adapter, cfg, args.out)  # checked before the model loads
    pipe = adapter.load(cfg)
    strategies = build_strategies(cfg, registry, adapter.info(pipe))
    if cfg.peers and _debugging(args):  # a config valid for bench and generate runs quietly
        print(f"diffaccel: {cfg.source}: [[peer]] tables ({', '.join(p.name for p in cfg.peers)}) are compared by "
              f"'diffaccel bench' only; generate runs the config's strategies", file=sys.stderr)
    with apply(pipe, cfg, strategies=strategies, registry=registry):
        out = adapter.run(pipe, cfg, cfg.model.seed, progress=not args.no_progress)
    where = adapter.write([out], out_path)
    c = out.report["counters"]
    print(f"diffaccel: {cfg.model.checkpoint}, {out.report['steps_run']} steps, strategies: "
          f"{', '.join(s.name for s in strategies) or 'none'}; layers computed {c['layers_computed']}, "
          f"skipped {c['layers_skipped']}, positions computed {c['fraction_computed']:.0%}; output: {where}", file=sys.stderr)
    rel = out.report.get("reliability")
    if rel:
        from ..runtime.guard import describe

        print(f"diffaccel: {describe(rel)}", file=sys.stderr)
    return 0


def _bench(args) -> int:
    from .outputs import check_bench_args

    check_bench_args(args)  # before any config or model loads
    if args.prompts is not None:
        from ..bench.prompt_bench import main_bench

        for option, given in (("--report", args.report_dir), ("--plots", args.plot_dir), ("--quality-only", args.quality_only or None),
                              ("--grid", args.grid or None), ("--solver-line", args.solver_line or None)):
            if given is not None:
                raise ConfigError(f"{option}: not available with --prompts (the sharded bench writes --json only)")
        return main_bench(args)
    from ..bench.runner import format_table, run_bench
    from ..bench.grid import parse_grid
    from ..bench.options import BenchOptions

    if args.quality_only and args.report_dir:
        raise ConfigError("--report: not available with --quality-only (a report plots speedup against quality)")
    outputs: dict | None = {} if args.report_dir else None
    plot_dir = args.plot_dir or (f"{args.report_dir}/plots" if args.report_dir else None)
    result = run_bench(args.configs, BenchOptions(
        seeds=args.seeds, repeats=args.repeats, json_path=args.json_path, noise_floor=not args.no_noise_floor,
        progress=not args.no_progress, plot_dir=plot_dir, batch=args.batch, seed=args.seed, judge=args.judge,
        timed=not args.quality_only, grid=parse_grid(args.grid), solver_line=args.solver_line), keep_outputs=outputs)
    print(format_table(result))
    if args.json_path:
        print(f"wrote {args.json_path}")
    if args.report_dir:
        from ..bench.report import write_report

        print(f"wrote {write_report(args.report_dir, result, outputs, command=args.command_line, plot_dir=plot_dir)}")
    return 0


def _scale_bench(args) -> int:
    from ..bench.scale_bench import scale_bench

    return scale_bench(args)


def _plugins(args) -> int:
    import attrs

    from ..runtime.adapters_registry import describe_adapters
    from ..runtime.registry import Registry

    registry = Registry()
    adapters, rows = describe_adapters(), registry.describe()
    if args.check:
        return _plugins_check(registry, adapters)
    broken = [attrs.asdict(b) for b in registry.broken.values()]
    if args.json:
        print(json.dumps({"adapters": adapters, "strategies": rows, "broken": broken}, indent=2, default=str))
        return 0
    print("adapters:")
    for a in adapters:
        print(f"  {a['name']}  ({a['distribution']} {a['version']}, {a['object']})")
        print(f"      capabilities: {', '.join(a['capabilities']) or 'none'}")
        if a["peers"]:
            print(f"      peers (bench): {', '.join(a['peers'])}")
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


def _plugins_check(registry, adapters) -> int:
    """Build each strategy with its config's defaults and check its hooks; adapters were checked
    against the Adapter protocol when ``describe_adapters`` loaded them. Exit 1 when any plugin is
    broken (left out: it failed to import or to register) or breaks the contract: a plugin's fault,
    as for every command; a plugin author runs this in CI."""
    from ..runtime.registry import contract_problems

    from .commands import undeclared

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


def _check(args) -> int:
    from ..runtime.accelerator import build_strategies
    from ..runtime.adapters_registry import get_adapter
    from ..runtime.config import load_config
    from ..runtime.registry import Registry

    registry = Registry()
    for path in args.configs:
        cfg = load_config(path, registry)
        facts = getattr(get_adapter(cfg.model.adapter), "facts", None)  # optional (adapter.KnowsFacts)
        if facts is not None:  # the model's facts (its config files, no weights), each strategy's setup with them
            build_strategies(cfg, registry, facts(cfg))
        unchecked = "" if facts is not None or not cfg.strategies else "; strategies' setup not run: the adapter has no facts()"
        peers = f"; peers (bench only): {', '.join(p.name for p in cfg.peers)}" if cfg.peers else ""
        print(f"{path}: ok ({cfg.model.adapter}, strategies: {', '.join(e.name for e in cfg.strategies) or 'none'}{peers}{unchecked})")
    return 0


def _serve(args) -> int:
    from ..serve import main as serve  # FastAPI and uvicorn load only for this command

    return serve(args)


def _tune(args) -> int:
    from ..tuning.model_space import parse_model_space
    from ..tuning.options import TuneOptions
    from ..tuning.tuner import tune

    model_space = parse_model_space(args.model_space)  # before anything loads
    try:
        result = tune(args.config, args.budget, args.out, TuneOptions(
            trials=args.trials, tune_seeds=args.tune_seeds, heldout=args.heldout, heldout_seed=args.heldout_seed,
            batch=args.batch, judge=args.judge, candidates=args.candidates, report=args.report,
            progress=not args.no_progress, model_space=model_space))
    except KeyboardInterrupt:
        _say(f"diffaccel: tune interrupted; the finished trials are kept: run the same command again to resume")
        return 130
    _say(f"diffaccel: {result.message}")
    return 0 if result.path is not None else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    _warnings_as_lines()
    args = _parser(_registered(argv)).parse_args(argv)
    args.command_line = "diffaccel " + shlex.join(argv)  # as the report records it
    debug = _debugging(args)
    handlers = {"generate": _generate, "bench": _bench, "plugins": _plugins, "check": _check, "tune": _tune,
                "scale-bench": _scale_bench, "serve": _serve}
    try:
        if args.command in CORE_CHECKED:
            from .outputs import precheck

            precheck(args)  # before any adapter, plugin or model library is imported
        if getattr(args, "registered", None) is not None:
            return args.registered(args)
        if args.command in handlers:
            return handlers[args.command](args)
        from . import tools

        return getattr(tools, args.command)(args)
    except (StrategyError, NonFiniteError, ModelError) as exc:  # a plugin's fault or broken numbers: exit 1
        if debug:
            import traceback

            traceback.print_exc()
        _say(f"diffaccel: {exc}")
        return 1
    except DiffaccelError as exc:
        _say(f"diffaccel: error: {exc}")
        return 2
    except KeyboardInterrupt:
        _say("diffaccel: interrupted")
        return 130


def _debugging(args) -> bool:
    """``--debug`` or ``DIFFACCEL_DEBUG`` (tracebacks, and notes a normal run keeps quiet)."""
    import os

    return bool(getattr(args, "debug", False)) or os.environ.get("DIFFACCEL_DEBUG", "") not in ("", "0")


def _warnings_as_lines() -> None:
    """diffaccel's own warnings (a plugin left out as broken) as one stderr line each, no source line."""
    import warnings

    from ..runtime.registry import PluginWarning

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, PluginWarning):
            _say(f"diffaccel: warning: {message}")
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def _say(line: str) -> None:
    """One line on stderr in one write: processes of one launch share the stream, and print's
    separate write of the newline lets their lines run together."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
