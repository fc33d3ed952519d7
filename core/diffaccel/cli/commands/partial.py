"""``diffaccel partial``: a denoiser step computing fewer positions, timed (the measurement is
``diffaccel.cli.tools.partial``)."""

from __future__ import annotations

from .. import outputs

HELP = "benchmark partial computation: a step at 100%% down to one position per row"
EXAMPLES = """
        example:
          diffaccel partial configs/text-default.toml
          diffaccel partial configs/text-default.toml --threads 1 --batch 8
        Times one denoiser step computing 100%, 50%, 25%, 15%, 10% and 5% of the positions, and
        one position per row (the others served from the per-layer key/value cache), at the
        config's batch size, interleaved, and prints the ratios. The last row is the floor: no
        strategy that skips positions can make a step cheaper than that."""


def arguments(pa) -> None:
    pa.add_argument("config")
    pa.add_argument("--repeats", type=int, default=30)
    pa.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    pa.add_argument("--batch", type=int, help="override [model] batch")


def run(args) -> int:
    from ..tools import partial

    return partial(args)


def register(commands) -> None:
    commands.add("partial", help=HELP, arguments=arguments, precheck=outputs.precheck, run=run, examples=EXAMPLES)
