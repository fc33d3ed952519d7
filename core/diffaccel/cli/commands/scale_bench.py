"""``diffaccel scale-bench``: throughput of ``generate --prompts`` on N processes against one
(the work is ``diffaccel.bench.scale_bench``'s)."""

from __future__ import annotations

from .. import outputs

HELP = "throughput of generate --prompts on N processes against one"
EXAMPLES = """
        examples:
          diffaccel scale-bench configs/digits.toml --prompts configs/prompts/digits-64.txt
          diffaccel scale-bench configs/text-scale.toml --prompts configs/prompts/text-64.txt --processes 2
        Runs 'generate --prompts' as one process and under 'accelerate launch --multi_gpu' as N (on the CPU), one
        thread each, alternating, and prints the throughput ratio and whether the outputs are
        byte-identical (docs/scale-out.md)."""


def arguments(sb) -> None:
    sb.add_argument("config")
    sb.add_argument("--prompts", required=True, metavar="FILE", help="the items (one per line)")
    sb.add_argument("--processes", type=int, default=2, help="processes of the scaled run (default 2)")
    sb.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    sb.add_argument("--repeats", type=int, default=1, help="pairs of runs, alternating which goes first (default 1)")


def run(args) -> int:
    from ...bench.scale_bench import scale_bench

    return scale_bench(args)


def register(commands) -> None:
    commands.add("scale-bench", help=HELP, arguments=arguments, precheck=outputs.precheck, run=run, examples=EXAMPLES)
