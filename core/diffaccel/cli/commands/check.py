"""``diffaccel check``: validate configs, each strategy's setup against the model's facts read from
its config files (``diffaccel.Run.check``), no weights loaded."""

from __future__ import annotations

from .. import outputs

HELP = "validate configs"
EXAMPLES = """
        example:
          diffaccel check configs/*.toml
        Validates configs: every table and key, then each strategy's setup against the model's
        facts (vocabulary size, layers...) read from its config files, without loading weights;
        prints 'ok' per file. What 'generate' would refuse, 'check' refuses with the same line."""


def arguments(c) -> None:
    c.add_argument("configs", nargs="+")


def run(args) -> int:
    from ...runtime.registry import Registry
    from ...runtime.runs import Run

    registry = Registry()
    for path in args.configs:
        setup = Run(path, registry=registry)
        cfg = setup.config
        checked = setup.check()  # the model's facts (its config files, no weights), each strategy's setup with them
        unchecked = "" if checked or not cfg.strategies else "; strategies' setup not run: the adapter has no facts()"
        peers = f"; peers (bench only): {', '.join(p.name for p in cfg.peers)}" if cfg.peers else ""
        print(f"{path}: ok ({cfg.model.adapter}, strategies: {', '.join(e.name for e in cfg.strategies) or 'none'}{peers}{unchecked})")
    return 0


def register(commands) -> None:
    commands.add("check", help=HELP, arguments=arguments, precheck=outputs.precheck, run=run, examples=EXAMPLES)
