"""``diffaccel serve-loadtest``: the load test of ``diffaccel serve`` (``diffaccel.serve.loadtest``;
httpx and the server load only when it runs)."""

from __future__ import annotations

import shlex
import sys

HELP = "load-test diffaccel serve: throughput, latency, equal outputs, memory (or faulty clients with --faults)"
EXAMPLES = """
        examples:
          diffaccel serve-loadtest configs/serve-text-short.toml --requests 400 --clients 16 --json runs/serve/load.json
          diffaccel serve-loadtest configs/serve-text-short.toml --faults --requests 1000 --markdown docs/serve.md
        Starts the server on 127.0.0.1 with batching and one request at a time, drives both with the
        same requests from concurrent clients and checks: no 5xx, every response equal to the offline
        run of its seed, bounded memory growth. --faults adds misbehaving clients (slow bodies, early
        disconnects, bad keys, oversize requests) beside well-behaved ones. Exit 0 when every check
        passes, 1 otherwise; --markdown writes the figures between the section's markers (docs/serve.md)."""


def arguments(p) -> None:
    p.add_argument("config", help="the served config")
    p.add_argument("--requests", type=int, default=400, help="requests per pass (default 400)")
    p.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    p.add_argument("--max-batch", type=int, default=16, help="the batching server's --max-batch (default 16)")
    p.add_argument("--batch-window-ms", type=float, default=10.0, help="the batching server's window (default 10)")
    p.add_argument("--rounds", type=int, default=1, help="passes per server, alternating which goes first (default 1)")
    p.add_argument("--seed", type=int, default=1000, help="seed of the first request (default 1000)")
    p.add_argument("--offline", type=int, default=16, help="responses checked against an offline run here (default 16)")
    p.add_argument("--time-limit", type=float, default=1800.0, help="seconds per pass at most (default 1800)")
    p.add_argument("--rss-limit-mb", type=float, default=200.0, help="allowed RSS growth of the batching server (default 200)")
    p.add_argument("--no-single", action="store_true", help="only the batching server (no one-at-a-time comparison)")
    p.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the servers (default: as set here)")
    p.add_argument("--json", dest="json_path", help="write the figures as JSON")
    p.add_argument("--markdown", help="write a Markdown section generated from the figures (docs/serve.md)")
    p.add_argument("--section", help="--markdown's section name (default: the config file's stem)")
    p.add_argument("--note", default="", help="recorded with the figures (e.g. that the machine was shared)")
    p.add_argument("--faults", action="store_true",
                   help="with faulty clients: half of --requests well-behaved, half faulty (docs/serve.md)")
    p.add_argument("--fault-clients", type=int, default=8, help="--faults: concurrent faulty connections (default 8)")
    p.add_argument("--request-timeout", type=float, default=30.0, help="--faults: the server's --request-timeout (default 30)")


def precheck(args) -> None:
    """The counts' bounds: one line, exit 2, before any server starts."""
    from ...contract.errors import ConfigError

    for name in ("requests", "clients", "max_batch", "rounds", "fault_clients"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}: must be 1 or more, got {getattr(args, name)}")
    if args.faults and (args.requests < 20 or args.request_timeout <= 0):
        raise ConfigError("--faults: needs --requests 20 or more and a --request-timeout above 0")


def run(args) -> int:
    from ...serve.loadtest import execute

    return execute(args, "diffaccel serve-loadtest " + shlex.join(sys.argv[2:]))


def register(commands) -> None:
    commands.add("serve-loadtest", help=HELP, arguments=arguments, precheck=precheck, run=run, examples=EXAMPLES)
