"""``diffaccel time-anchor-calibrate`` and ``diffaccel time-anchor-clusters``: this plugin's commands
(its ``diffaccel_register_commands``), fitting from recorded trajectories the files the strategy's
``gate`` and ``clusters`` keys point to.

``python -m diffaccel_time_anchor calibrate|clusters`` and the ``diffaccel-time-anchor`` script,
the plugin's own command line before 0.2, still work until diffaccel 0.3 (``main``): they print
the ``diffaccel`` command to use and run it.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from diffaccel.contract.errors import ConfigError, ConfigValueError, DiffaccelError

CALIBRATE_EXAMPLES = """
examples:
  diffaccel time-anchor-calibrate configs/text-default.toml --out runs/ta/gate-text.json --seeds 3
  diffaccel time-anchor-calibrate configs/digits.toml --out runs/ta/gate-digits.json --seeds 1
Runs the config's [model] without its strategies on --seeds seeds, recording the relative change of
every (layer, step, position or row), and fits per layer a gate (logistic regression on the time
embedding) to the share of states below --threshold at each step: the file for the strategy's gate key.
"""
CLUSTERS_EXAMPLES = """
examples:
  diffaccel time-anchor-clusters configs/text-default.toml --out runs/ta/clusters.json --k 16 --seeds 3
Records as time-anchor-calibrate does (text models), then runs k-means over each position's mean log
change rate per layer: the file for the strategy's clusters key (entries keyed by layer and cluster).
"""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="a config whose [model] to record (its strategies are not applied)")
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--seeds", type=int, default=3, help="generations to record (seeds from [model] seed)")


def calibrate_arguments(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--threshold", type=float, default=None,
                   help="a state is 'settled' below this relative change per step (default: the config's time-anchor threshold, else 0.02)")


def clusters_arguments(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--k", type=int, default=8, help="number of clusters")


def _refuse(key: str, message: str) -> None:
    raise ConfigError(str(ConfigValueError(key, message)))


def check_calibrate(args: argparse.Namespace) -> None:
    """The options, before torch records anything."""
    if args.seeds <= 0:
        _refuse("seeds", f"must be positive, got {args.seeds}")
    if args.threshold is not None and not 0 < args.threshold < 1:
        _refuse("threshold", f"must be in (0, 1), got {args.threshold}")


def check_clusters(args: argparse.Namespace) -> None:
    if args.seeds <= 0:
        _refuse("seeds", f"must be positive, got {args.seeds}")
    if args.k <= 0:
        _refuse("k", f"must be positive, got {args.k}")


def calibrate(args: argparse.Namespace) -> int:
    from .calibrate import config_threshold, gate_from_rates, record

    rec, cfg = record(args.config, args.seeds)
    gate = gate_from_rates(rec.runs, args.threshold or config_threshold(cfg))
    gate.meta["source"] = args.config
    gate.save(args.out)
    probs = gate.probs(rec.runs[0]["num_steps"]).mean(1)
    print(f"wrote {args.out}: {gate.n_layers} layer gates; mean gate per layer "
          + ", ".join(f"{n} {p:.2f}" for n, p in zip(gate.layers, probs.tolist())))
    return 0


def clusters(args: argparse.Namespace) -> int:
    from .calibrate import clusters_from_rates, record, write_json

    rec, cfg = record(args.config, args.seeds)
    if cfg.model.adapter != "text":
        _refuse("adapter", "position clusters apply to text models")
    data = clusters_from_rates(rec.runs, args.k)
    data["source"] = args.config
    write_json(data, args.out)
    print(f"wrote {args.out}: {data['n_clusters']} clusters over {data['length']} positions")
    return 0


COMMANDS = {
    "calibrate": ("fit time-anchor's per-layer gates from recorded trajectories (the gate key's file)",
                  calibrate_arguments, check_calibrate, calibrate, CALIBRATE_EXAMPLES),
    "clusters": ("fit time-anchor's position clusters (text) from recorded trajectories (the clusters key's file)",
                 clusters_arguments, check_clusters, clusters, CLUSTERS_EXAMPLES),
}
"""``diffaccel time-anchor-NAME``: help, options, precheck, run, examples."""


def register(commands) -> None:
    """This plugin's commands (``diffaccel_register_commands``)."""
    for name, (help, arguments, precheck, run, examples) in COMMANDS.items():
        commands.add(f"time-anchor-{name}", help=help, arguments=arguments, precheck=precheck, run=run, examples=examples)


def main(argv: list[str] | None = None) -> int:
    """Deprecated (until diffaccel 0.3): ``python -m diffaccel_time_anchor calibrate|clusters ...``
    runs ``diffaccel time-anchor-calibrate|clusters ...``, after one line naming it."""
    p = argparse.ArgumentParser(prog="python -m diffaccel_time_anchor",
                                description="deprecated: use 'diffaccel time-anchor-calibrate' and 'diffaccel time-anchor-clusters'")
    sub = p.add_subparsers(dest="command", required=True)
    for name, (help, arguments, *_rest) in COMMANDS.items():
        arguments(sub.add_parser(name, help=help))
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    rest = argv[argv.index(args.command) + 1:]
    print(f"python -m diffaccel_time_anchor is deprecated (removed in diffaccel 0.3): run "
          f"'{shlex.join(['diffaccel', 'time-anchor-' + args.command, *rest])}'", file=sys.stderr)
    _help, _arguments, precheck, run, _examples = COMMANDS[args.command]
    try:
        precheck(args)  # a bad argument is refused before torch and the adapters load
        return run(args)
    except DiffaccelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
