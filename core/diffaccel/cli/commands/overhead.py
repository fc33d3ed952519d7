"""``diffaccel overhead``: the hook machinery's cost with no strategy active (the measurement is
``diffaccel.cli.tools.overhead``)."""

from __future__ import annotations

from .. import outputs

HELP = "measure the hook machinery's cost with no strategy active"
EXAMPLES = """
        examples:
          diffaccel overhead configs/text-default.toml
          diffaccel overhead configs/digits.toml --threads 1 --batch 8 --guard 8
        Times the untouched sampler against the same sampler routed through diffaccel's hooks with
        every installed plugin loaded but no strategy active, with the non-finite check of each
        step's output on (the default) and off, interleaved, and prints the costs. --guard N adds
        a strategy that changes nothing, run with [guard] every = N and with the guard off: what
        the quality guard costs (docs/reliability.md)."""


def arguments(o) -> None:
    o.add_argument("config")
    o.add_argument("--repeats", type=int, default=10, help="interleaved rounds, one run of each entry (default 10)")
    o.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    o.add_argument("--batch", type=int, help="override [model] batch")
    o.add_argument("--steps", type=int, help="override [model] steps (shorter runs; the costs measured are per step)")
    o.add_argument("--guard", type=int, default=0, metavar="N",
                   help="also time a pass-through strategy with [guard] every = N against the same with the guard off")


def run(args) -> int:
    from ..tools import overhead

    return overhead(args)


def register(commands) -> None:
    commands.add("overhead", help=HELP, arguments=arguments, precheck=outputs.precheck, run=run, examples=EXAMPLES)
