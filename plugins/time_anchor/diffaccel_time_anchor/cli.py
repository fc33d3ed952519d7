"""``python -m diffaccel_time_anchor calibrate|clusters CONFIG --out FILE``."""

from __future__ import annotations

import argparse
import sys

from diffaccel.contract.errors import ConfigValueError, DiffaccelError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m diffaccel_time_anchor", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    cal = sub.add_parser("calibrate", help="fit per-layer anchor gates from recorded trajectories")
    clu = sub.add_parser("clusters", help="fit semantic position clusters (text) from recorded trajectories")
    for q in (cal, clu):
        q.add_argument("config", help="a config whose [model] to record (its strategies are not applied)")
        q.add_argument("--out", required=True, help="JSON file to write")
        q.add_argument("--seeds", type=int, default=3, help="generations to record (seeds from [model] seed)")
    cal.add_argument("--threshold", type=float, default=None,
                     help="a state is 'settled' below this relative change per step (default: the config's time-anchor threshold, else 0.02)")
    clu.add_argument("--k", type=int, default=8, help="number of clusters")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # after parsing: a bad argument is refused before torch and the adapters load
    from .calibrate import clusters_from_rates, config_threshold, gate_from_rates, record, write_json

    try:
        if args.seeds <= 0:
            raise ConfigValueError("seeds", f"must be positive, got {args.seeds}")
        if args.command == "clusters" and args.k <= 0:
            raise ConfigValueError("k", f"must be positive, got {args.k}")
        if args.command == "calibrate" and args.threshold is not None and not 0 < args.threshold < 1:
            raise ConfigValueError("threshold", f"must be in (0, 1), got {args.threshold}")
        rec, cfg = record(args.config, args.seeds)
        if args.command == "calibrate":
            gate = gate_from_rates(rec.runs, args.threshold or config_threshold(cfg))
            gate.meta["source"] = args.config
            gate.save(args.out)
            probs = gate.probs(rec.runs[0]["num_steps"]).mean(1)
            print(f"wrote {args.out}: {gate.n_layers} layer gates; mean gate per layer "
                  + ", ".join(f"{n} {p:.2f}" for n, p in zip(gate.layers, probs.tolist())))
        else:
            if cfg.model.adapter != "text":
                raise ConfigValueError("adapter", "position clusters apply to text models")
            data = clusters_from_rates(rec.runs, args.k)
            data["source"] = args.config
            write_json(data, args.out)
            print(f"wrote {args.out}: {data['n_clusters']} clusters over {data['length']} positions")
    except (DiffaccelError, ConfigValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
