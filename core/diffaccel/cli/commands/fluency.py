"""``diffaccel fluency``: a model's samples beside reference texts (the measurement is
``diffaccel.cli.tools.fluency``)."""

from __future__ import annotations

from .. import outputs

HELP = "fluency of a model's samples beside reference texts"
EXAMPLES = """
        example:
          diffaccel fluency configs/text-default.toml --seeds 4
        Prints the n-gram perplexity and distinct-n of the model's samples beside real held-out
        text, random tokens and a unigram sampler (the figures in the README)."""


def arguments(f) -> None:
    f.add_argument("config")
    f.add_argument("--seeds", type=int, default=4)
    f.add_argument("--judge", default="default", metavar="NAME_OR_PATH", help="as bench's --judge: gen_ppl's language model, or none")


def run(args) -> int:
    from ..tools import fluency

    return fluency(args)


def register(commands) -> None:
    commands.add("fluency", help=HELP, arguments=arguments, precheck=outputs.precheck, run=run, examples=EXAMPLES)
