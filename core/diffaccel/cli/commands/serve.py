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
        each --preset NAME=CONFIG (same [model]); a request picks one with {"diffaccel": {"preset": NAME}}.
        With --api-key (or DIFFACCEL_API_KEY, comma-separated) every route but /health needs
        'Authorization: Bearer KEY' (401 otherwise). Limits, answered before any work: body size
        (413), n (400), prompt bytes and tokens (400), open streams per client (429); a request
        not answered within --request-timeout seconds gets 504."""


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
    se.add_argument("--api-key", action="append", metavar="KEY",
                    help="require 'Authorization: Bearer KEY' on every route but /health (repeatable; also DIFFACCEL_API_KEY, comma-separated)")
    se.add_argument("--public-metrics", action="store_true", help="serve /metrics without the API key")
    se.add_argument("--max-body-bytes", type=int, default=1 << 20, help="request body size at most, else 413 (default 1048576)")
    se.add_argument("--max-n", type=int, default=None, help="rows (n) per request at most, else 400 (default: --max-batch)")
    se.add_argument("--max-prompt-bytes", type=int, default=65536, help="prompt size in UTF-8 bytes at most, else 400 (default 65536)")
    se.add_argument("--max-prompt-tokens", type=int, default=4096, help="prompt tokens at most (models with a tokenizer), else 400 (default 4096)")
    se.add_argument("--max-streams-per-client", type=int, default=4,
                    help="open streamed requests per client address at most, else 429 + Retry-After (default 4)")
    se.add_argument("--request-timeout", type=float, default=600.0,
                    help="seconds from a request's arrival to its answer at most, else 504 and its rows leave the batch (default 600)")


def run(args) -> int:
    from ...serve import main as serve

    return serve(args)


def register(commands) -> None:
    commands.add("serve", help=HELP, arguments=arguments, run=run, examples=EXAMPLES)
