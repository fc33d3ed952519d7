"""``diffaccel serve``: a config over HTTP, OpenAI-compatible, batching requests (the server is
``diffaccel.serve``'s; FastAPI and uvicorn load only for this command)."""

from __future__ import annotations

HELP = "serve a config over HTTP (OpenAI-compatible), batching requests"
EXAMPLES = """
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
        each --preset NAME=CONFIG (same [model]); a request picks one with {"diffaccel": {"preset": NAME}}."""


def arguments(se) -> None:
    se.add_argument("config", help="TOML config: the model and its strategies (preset 'default')")
    se.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    se.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    se.add_argument("--max-batch", type=int, default=8, help="rows generated together at most (default 8; 1: no batching)")
    se.add_argument("--batch-window-ms", type=float, default=10.0, help="wait this long after a request for others to batch with (default 10)")
    se.add_argument("--queue", type=int, default=64, help="requests waiting at most; past it 503 + Retry-After (default 64)")
    se.add_argument("--preset", action="append", metavar="NAME=CONFIG", help="another strategy preset: a config with the same [model]")
    se.add_argument("--batch-inexact", action="store_true",
                    help="batch requests together even where a row differs alone and in a batch by float rounding (checked at start)")
    se.add_argument("--shutdown-timeout", type=float, default=60.0, help="seconds SIGTERM waits for the running batch (default 60)")
    se.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"], help="uvicorn's log level (default warning)")


def run(args) -> int:
    from ...serve import main as serve

    return serve(args)


def register(commands) -> None:
    commands.add("serve", help=HELP, arguments=arguments, run=run, examples=EXAMPLES)
