"""``diffaccel generate``: run a config and write its outputs."""

from __future__ import annotations

import sys

from ...contract.errors import ConfigError
from .. import outputs
from ..console import debugging

HELP = "run a config and write its outputs"
EXAMPLES = """
        examples:
          diffaccel generate configs/text-default.toml
          diffaccel generate configs/text-default.toml --seed 3 --out sample.txt
        The config's [model] table picks the model; its [[strategy]] tables, in order, the
        strategies. A run summary (layers computed and skipped) goes to stderr.
        --prompts FILE --out DIR: one item per line (results.jsonl, images NNNNN.png), resumable;
        under 'accelerate launch' the items are shared by the processes (docs/scale-out.md)."""


def arguments(g) -> None:
    g.add_argument("config", help="TOML config file")
    g.add_argument("--out", help="output file (text: default stdout; images: default <config name>.png here)")
    g.add_argument("--seed", type=int, help="override [model] seed")
    g.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    g.add_argument("--prompts", metavar="FILE", help="one item per line; --out is then a folder (docs/scale-out.md)")
    g.add_argument("--prompt", metavar="TEXT", help="the prompt of this run (text models: replaces [model] prompts; "
                   "a task model's must be a problem of its task)")


def precheck(args) -> None:
    """The config, the prompts file and where the outputs go (a file, or with --prompts a folder)."""
    checked = outputs.precheck(args)
    if args.prompts is not None:
        from ...runtime.jobs import check_out_dir

        check_out_dir(args.out)
    else:
        pre = checked[0]
        outputs.generate_out(pre.spec, pre, args.out)


def with_prompt(cfg, prompt: str):
    """``cfg`` whose rows all take ``prompt`` (``generate --prompt``): one line if the adapter takes
    no prompt or the options refuse it (a task model's prompt that is not a problem of its task)."""
    import attrs

    from ...contract.errors import ConfigValueError

    if "prompts" not in attrs.fields_dict(type(cfg.options)):
        raise ConfigError(f"--prompt: the {cfg.model.adapter} adapter takes no prompt")
    try:
        return attrs.evolve(cfg, options=attrs.evolve(cfg.options, prompts=[prompt]))
    except ConfigValueError as exc:
        raise ConfigError(f"--prompt: {exc.message}") from None


def run(args) -> int:
    if args.prompts is not None:
        from ...runtime.jobs import main_generate

        return main_generate(args)
    import attrs

    from ...runtime.config import load_config
    from ...runtime.registry import Registry
    from ...runtime.runs import Run

    registry = Registry()
    cfg = load_config(args.config, registry)
    if args.seed is not None:
        cfg = attrs.evolve(cfg, model=attrs.evolve(cfg.model, seed=args.seed))
    if args.prompt is not None:
        cfg = with_prompt(cfg, args.prompt)
    setup = Run(cfg, registry=registry)
    out_path = outputs.generate_out(setup.adapter, cfg, args.out)  # checked before the model loads
    setup.load()
    if cfg.peers and debugging(args):  # a config valid for bench and generate runs quietly
        print(f"diffaccel: {cfg.source}: [[peer]] tables ({', '.join(p.name for p in cfg.peers)}) are compared by "
              f"'diffaccel bench' only; generate runs the config's strategies", file=sys.stderr)
    out = setup.generate(progress=not args.no_progress)
    where = setup.adapter.write([out], out_path)
    print(f"diffaccel: {setup.summary(out)}; output: {where}", file=sys.stderr)
    rel = out.report.get("reliability")
    if rel:
        from ...runtime.guard import describe

        print(f"diffaccel: {describe(rel)}", file=sys.stderr)
    return 0


def register(commands) -> None:
    commands.add("generate", help=HELP, arguments=arguments, precheck=precheck, run=run, examples=EXAMPLES)
