"""The core commands' epilogs (``diffaccel COMMAND --help``): example command lines, then what the
command does. Kept apart from the parser (``cli``), which reads them by command name."""

EXAMPLES = {
    "generate": """
        examples:
          diffaccel generate configs/text-default.toml
          diffaccel generate configs/text-default.toml --seed 3 --out sample.txt
        The config's [model] table picks the model; its [[strategy]] tables, in order, the
        strategies. A run summary (layers computed and skipped) goes to stderr.
        --prompts FILE --out DIR: one item per line (results.jsonl, images NNNNN.png), resumable;
        under 'accelerate launch' the items are shared by the processes (docs/scale-out.md).""",
    "bench": """
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
        judge's nll and tokens seed by seed: judge_per_seed).""",
    "overhead": """
        examples:
          diffaccel overhead configs/text-default.toml
          diffaccel overhead configs/digits.toml --threads 1 --batch 8 --guard 8
        Times the untouched sampler against the same sampler routed through diffaccel's hooks with
        every installed plugin loaded but no strategy active, with the non-finite check of each
        step's output on (the default) and off, interleaved, and prints the costs. --guard N adds
        a strategy that changes nothing, run with [guard] every = N and with the guard off: what
        the quality guard costs (docs/reliability.md).""",
    "partial": """
        example:
          diffaccel partial configs/text-default.toml
          diffaccel partial configs/text-default.toml --threads 1 --batch 8
        Times one denoiser step computing 100%, 50%, 25%, 15%, 10% and 5% of the positions, and
        one position per row (the others served from the per-layer key/value cache), at the
        config's batch size, interleaved, and prints the ratios. The last row is the floor: no
        strategy that skips positions can make a step cheaper than that.""",
    "plugins": """
        example:
          diffaccel plugins
          DIFFACCEL_BLOCK_PLUGINS=swd diffaccel plugins
        Lists each adapter installed through the 'diffaccel.adapters' entry-point group (with the
        capabilities it declares) and each strategy installed through the 'diffaccel' group (with
        the capabilities it requires). --check also builds every strategy with its defaults and
        verifies its hooks against the contract (diffaccel.contract.hookspecs): misspelled or unmarked
        hooks and methods the core no longer calls are reported, exit code 2.""",
    "check": """
        example:
          diffaccel check configs/*.toml
        Validates configs: every table and key, then each strategy's setup against the model's
        facts (vocabulary size, layers...) read from its config files, without loading weights;
        prints 'ok' per file. What 'generate' would refuse, 'check' refuses with the same line.""",
    "train": """
        examples:
          diffaccel train text --kind masked --out runs/text-masked
          diffaccel train digits --out runs/digits --max-minutes 27
        The models come from the installed adapters (their diffaccel_register_commands hook,
        declared as train.MODEL in the diffaccel.commands entry points);
        'diffaccel train MODEL --help' shows a model's options.""",
    "scale-bench": """
        examples:
          diffaccel scale-bench configs/digits.toml --prompts configs/prompts/digits-64.txt
          diffaccel scale-bench configs/text-scale.toml --prompts configs/prompts/text-64.txt --processes 2
        Runs 'generate --prompts' as one process and under 'accelerate launch --multi_gpu' as N (on the CPU), one
        thread each, alternating, and prints the throughput ratio and whether the outputs are
        byte-identical (docs/scale-out.md).""",
    "fluency": """
        example:
          diffaccel fluency configs/text-default.toml --seeds 4
        Prints the n-gram perplexity and distinct-n of the model's samples beside real held-out
        text, random tokens and a unigram sampler (the figures in the README).""",
    "serve": """
        examples:
          diffaccel serve configs/text-default.toml
          diffaccel serve configs/text-default.toml --preset swd=configs/text-swd.toml --max-batch 16
          curl -s 127.0.0.1:8000/v1/completions -H 'content-type: application/json' -d '{"prompt": "", "n": 2, "seed": 7}'
        An OpenAI-compatible server (docs/serve.md): POST /v1/completions (text models),
        POST /v1/images/generations (image models), GET /v1/models, /health, /metrics. Requests
        arriving within --batch-window-ms are generated as one batch of at most --max-batch rows,
        each row with its own seed: a response equals 'diffaccel generate' for the same seed.
        Past --queue waiting requests: 503 with Retry-After. SIGTERM: queued requests get 503,
        the running batch finishes. Presets: 'default' (the config's strategies), 'none', and
        each --preset NAME=CONFIG (same [model]); a request picks one with {"diffaccel": {"preset": NAME}}.""",
    "tune": """
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
        same command again to resume. If no point passes, nothing is written and the exit code is 1.""",
}
