"""The adapters' tools as registered commands (issue 45 item 3): each is declared in the package's
metadata, answers --help, and refuses a bad input with one line and exit 2. (``python -m`` of their
old modules is gone in 0.2: issue 58.)"""

from __future__ import annotations

import importlib.metadata as md

import pytest

from diffaccel.cli.entry import main

COMMANDS = [["train", "smollm2-dlm"], ["smollm2-dlm-export"], ["dlm-eval"], ["cond-check"], ["gguf-convert"],
            ["diffusion-gemma-build"], ["text-corpus"], ["train", "dit-digits"], ["dit-digits-accuracy"],
            ["digits-accuracy"]]


def test_every_command_is_declared_in_the_metadata():
    declared = {ep.name for ep in md.entry_points(group="diffaccel.commands")}
    assert {".".join(c) for c in COMMANDS} <= declared


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and f"usage: diffaccel {' '.join(command)}" in out and "examples:" in out


BAD = {
    "gguf-convert": (["gguf-convert", "--gguf", "{tmp}/missing.gguf", "{tmp}/out", "--mask-token-id", "0"],
                     "missing.gguf: no such GGUF file"),
    "smollm2-dlm-export": (["smollm2-dlm-export", "{tmp}/no-run", "{tmp}/delta"], "not a smollm2-dlm run"),
    "dlm-eval": (["dlm-eval", "{tmp}/no-delta"], "no-delta"),
    "digits-accuracy": (["digits-accuracy", "--checkpoint", "{tmp}/no-model"], "no-model"),
    "dit-digits-accuracy": (["dit-digits-accuracy", "--checkpoint", "{tmp}/no-model"], "no-model"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_input_is_one_line_and_exit_2(name, tmp_path, capsys):
    argv, expected = BAD[name]
    code = main([a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("diffaccel: error: ") and err.count("\n") == 1 and expected in err, err


def test_diffusion_gemma_build_offers_every_size():
    from diffaccel.adapters.text.families.diffusion_gemma import commands
    from diffaccel.adapters.text.families.diffusion_gemma.build import SIZES

    import argparse

    p = argparse.ArgumentParser()
    commands._arguments(p)
    assert sorted(next(a for a in p._actions if a.dest == "size").choices) == sorted(SIZES)


def test_dit_digits_training_defaults_are_the_configs():
    import argparse

    import attrs

    from diffaccel_models.dit import commands
    from diffaccel_models.dit.digits import TrainDiTConfig

    p = argparse.ArgumentParser()
    commands._train_arguments(p)
    args = p.parse_args([])
    fields = attrs.fields_dict(TrainDiTConfig)
    assert args.lr == fields["lr"].default and args.batch == fields["batch"].default

