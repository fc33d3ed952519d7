"""``diffaccel tune``: the fastest strategy settings within a quality budget, proven on held-out
seeds (the work is ``diffaccel.tuning``'s; this module is the command line's side)."""

from __future__ import annotations

from .. import outputs
from ..console import say

HELP = "find the fastest strategy settings within a quality budget, proven on held-out seeds"
EXAMPLES = """
        examples:
          diffaccel tune configs/digits-dct.toml --budget "psnr>=30" --budget "acc>=-0.02" --out digits-tuned.toml
          diffaccel tune configs/text-swd-time-anchor.toml --budget "gen_ppl<=+5%" --budget "distinct2>=-5%" \\
              --heldout 128 --out text-tuned.toml
        Searches the config's strategies (their plugins declare what is tunable; each strategy may
        also be switched off) with optuna on the tuning seeds, each trial timed beside the baseline
        on the same seeds; then re-measures the best few, and the config as given, with the
        ordinary bench on held-out seeds at batch 1 and at the configured batch. The fastest point
        whose held-out quality meets every budget is written to --out, a config 'diffaccel check'
        accepts, with its figures and the command reproducing them in its header; the study and the
        report (trials against budget, front, chosen point) go to OUT.tune/. Budgets: a signed
        percentage is relative to the baseline (gen_ppl<=+5%), a signed number a difference from it
        (acc>=-0.02), a plain number absolute (psnr>=30). Ctrl-C keeps the finished trials: run the
        same command again to resume. If no point passes, nothing is written and the exit code is 1."""


def arguments(tu) -> None:
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


def run(args) -> int:
    from ...tuning.model_space import parse_model_space
    from ...tuning.options import TuneOptions
    from ...tuning.tuner import tune

    model_space = parse_model_space(args.model_space)  # before anything loads
    try:
        result = tune(args.config, args.budget, args.out, TuneOptions(
            trials=args.trials, tune_seeds=args.tune_seeds, heldout=args.heldout, heldout_seed=args.heldout_seed,
            batch=args.batch, judge=args.judge, candidates=args.candidates, report=args.report,
            progress=not args.no_progress, model_space=model_space))
    except KeyboardInterrupt:
        say("diffaccel: tune interrupted; the finished trials are kept: run the same command again to resume")
        return 130
    say(f"diffaccel: {result.message}")
    return 0 if result.path is not None else 1


def register(commands) -> None:
    commands.add("tune", help=HELP, arguments=arguments, precheck=outputs.precheck, run=run, examples=EXAMPLES)
