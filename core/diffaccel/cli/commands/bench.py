"""``diffaccel bench``: compare configs with the baseline, speedup and quality side by side
(the work is ``diffaccel.bench``'s; this module is the command line's side)."""

from __future__ import annotations

from ...contract.errors import ConfigError
from .. import outputs

HELP = "compare configs with the baseline: speedup and quality side by side"
EXAMPLES = """
        examples:
          diffaccel bench configs/text-default.toml
          diffaccel bench configs/text-swd.toml configs/text-swd-time-anchor.toml --seeds 4 --json out/bench.json
          diffaccel bench configs/text-default.toml configs/text-time-anchor.toml --seeds 6 --batch 8
          diffaccel bench configs/digits-dct.toml --seeds 2 --report report/digits
          diffaccel bench configs/dit-digits-time-anchor.toml configs/dit-digits-dct.toml --quality-only --seeds 10
          diffaccel bench configs/text-swd.toml --grid tau=0.005,0.01,0.02 --seeds 4
          diffaccel bench configs/digits-dct.toml --grid threshold=0.01,0.02 --grid band=2,4 --quality-only --seeds 10
        All configs must share one [model] table. The baseline is that model with no strategy;
        every entry runs on the same seeds, interleaved. Speedup = baseline wall time / entry
        wall time. Quality columns compare each entry with the baseline of the same seed.
        --batch N generates N rows per call in every entry (rows use seeds seed .. seed+N-1):
        on a CPU a step's weights are then read once for N rows, and what skipping positions
        saves grows (see 'diffaccel partial'). --report DIR writes DIR/index.md and DIR/index.html
        (opens offline): the table, speedup against quality, the images or samples of each entry
        beside the baseline's, the strategies' plots, the command, versions and machine.
        --quality-only runs each entry once per seed with no warm-up and no clock: quality over
        more seeds than a timed bench affords, on a busy machine too (speedup shows "-").
        --grid KEY=V1,V2 runs each config's strategy once per value (several --grid: every
        combination), as entries named config[KEY=V]; each point is validated as a config file
        with that value would be, before the model loads. STRATEGY.KEY picks the strategy
        when several have KEY. Values are TOML: 0.05, 3, true, "text".
        With 2 seeds or more every figure has a 95% bootstrap interval [lo, hi], resampling
        seeds paired with the baseline's; a metric pooled over all samples (distinct-n, gen_ppl)
        is computed again on each resample (JSON: speedup_ci, quality_ci, quality_ratio_ci; the
        judge's nll and tokens seed by seed: judge_per_seed)."""


def arguments(b) -> None:
    b.add_argument("configs", nargs="+", help="TOML configs sharing one [model]")
    b.add_argument("--seeds", type=int, default=3, help="seeds (batches) per entry (default 3)")
    b.add_argument("--repeats", type=int, default=1, help="timed passes over all seeds (default 1)")
    b.add_argument("--batch", type=int, help="override [model] batch: rows generated per call (e.g. 8, as a server batches requests)")
    b.add_argument("--json", dest="json_path", help="write the results as JSON")
    b.add_argument("--plots", dest="plot_dir", help="folder for the strategies' plots")
    b.add_argument("--report", dest="report_dir", metavar="DIR",
                   help="write DIR/index.md and DIR/index.html: table, Pareto plot, image grid or samples, plots, versions")
    b.add_argument("--no-noise-floor", action="store_true", help="skip the perturbed reference runs (and gen_ppl_noise's seeds)")
    b.add_argument("--seed", type=int, help="override [model] seed: the first seed (e.g. seeds kept for tuning)")
    b.add_argument("--judge", default="default", metavar="NAME_OR_PATH",
                   help="language model scoring text samples (gen_ppl): smollm2 (default), none, a causal LM folder or hub id, a .gguf file")
    b.add_argument("--quality-only", action="store_true",
                   help="no timing, no warm-up: each entry once per seed, quality only (more seeds; no quiet machine needed)")
    b.add_argument("--solver-line", action="store_true",
                   help="image models: add the same model at fewer steps (steps-N) and under DPM-Solver++ (dpm++2m-N), "
                        "the line every strategy must sit above")
    b.add_argument("--grid", action="append", default=[], metavar="[STRATEGY.]KEY=V1,V2",
                   help="run each config's strategy at each value (repeat for a product grid); entries named by their values")
    b.add_argument("--no-progress", action="store_true")
    b.add_argument("--prompts", metavar="FILE", help="one item per line instead of --seeds; shared by the processes of 'accelerate launch'")


def precheck(args) -> None:
    """Counts and output paths (--json, --plots, --report), the grid's form, then the configs."""
    from ...bench.grid import parse_grid

    outputs.check_bench_args(args)
    parse_grid(args.grid)
    outputs.precheck(args)


def run(args) -> int:
    outputs.check_bench_args(args)  # before any config or model loads
    if args.prompts is not None:
        from ...bench.prompt_bench import main_bench

        for option, given in (("--report", args.report_dir), ("--plots", args.plot_dir), ("--quality-only", args.quality_only or None),
                              ("--grid", args.grid or None), ("--solver-line", args.solver_line or None)):
            if given is not None:
                raise ConfigError(f"{option}: not available with --prompts (the sharded bench writes --json only)")
        return main_bench(args)
    from ...bench.grid import parse_grid
    from ...bench.options import BenchOptions
    from ...bench.runner import format_table, run_bench

    if args.quality_only and args.report_dir:
        raise ConfigError("--report: not available with --quality-only (a report plots speedup against quality)")
    kept: dict | None = {} if args.report_dir else None
    plot_dir = args.plot_dir or (f"{args.report_dir}/plots" if args.report_dir else None)
    result = run_bench(args.configs, BenchOptions(
        seeds=args.seeds, repeats=args.repeats, json_path=args.json_path, noise_floor=not args.no_noise_floor,
        progress=not args.no_progress, plot_dir=plot_dir, batch=args.batch, seed=args.seed, judge=args.judge,
        timed=not args.quality_only, grid=parse_grid(args.grid), solver_line=args.solver_line), keep_outputs=kept)
    print(format_table(result))
    if args.json_path:
        print(f"wrote {args.json_path}")
    if args.report_dir:
        from ...bench.report import write_report

        print(f"wrote {write_report(args.report_dir, result, kept, command=args.command_line, plot_dir=plot_dir)}")
    return 0


def register(commands) -> None:
    commands.add("bench", help=HELP, arguments=arguments, precheck=precheck, run=run, examples=EXAMPLES)
