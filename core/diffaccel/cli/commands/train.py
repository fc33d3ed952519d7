"""``diffaccel train MODEL``: the models come from installed distributions (diffaccel-models, ``models/``,
for the shipped ones; a plugin's or adapter's ``diffaccel_register_commands`` adds ``group="train"``
commands, declared as ``train.MODEL`` entry points)."""

from __future__ import annotations

HELP = "train a model an installed distribution offers (diffaccel-models): diffaccel train MODEL --help"
EXAMPLES = """
        examples:
          diffaccel train text --kind masked --out runs/text-masked
          diffaccel train digits --out runs/digits --max-minutes 27
        The models come from the installed distributions (diffaccel-models for the shipped
        ones; a diffaccel_register_commands hook, declared as train.MODEL in the
        diffaccel.commands entry points);
        'diffaccel train MODEL --help' shows a model's options."""


def run(args) -> int:  # not reached: MODEL is required, and each model's command runs instead
    raise SystemExit(2)


def register(commands) -> None:
    commands.add("train", help=HELP, run=run, examples=EXAMPLES, subcommands="MODEL")
