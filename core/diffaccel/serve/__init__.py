"""``diffaccel serve CONFIG``: an OpenAI-compatible HTTP server that batches requests (docs/serve.md).

The model and the config's strategies load once; requests that arrive within ``--batch-window-ms``
are generated together, up to ``--max-batch`` rows, each row with its own seed and strategy state
(``engine``), behind a bounded queue (``batcher``), on FastAPI and uvicorn (``app``), behind API
keys (``auth``) and per-request limits (``limits``). Needs the ``serve`` extra: ``pip install
diffaccel[serve]``. The load test is ``diffaccel serve-loadtest`` (``--faults``: with
misbehaving clients, ``faults``).
"""

from __future__ import annotations

import errno
import ipaddress
import re
import sys
from typing import Any

from ..contract.errors import ConfigError, DiffaccelError

PRESET = re.compile(r"^([A-Za-z0-9_.-]+)=(.+)$")


def check_args(args: Any) -> dict[str, str]:
    """The options, checked before the model loads (one line each); returns the presets. The
    limits and keys are checked here too (``limits.from_args``, ``auth.keys_from``)."""
    for option, value, low in (("--max-batch", args.max_batch, 1), ("--queue", args.queue, 1), ("--port", args.port, 0),
                               ("--batch-window-ms", args.batch_window_ms, 0), ("--shutdown-timeout", args.shutdown_timeout, 0)):
        if value < low:
            raise ConfigError(f"{option}: must be {low} or more, got {value}")
    if args.port > 65535:
        raise ConfigError(f"--port: must be at most 65535, got {args.port}")
    presets: dict[str, str] = {}
    for spec in args.preset or []:
        m = PRESET.match(spec)
        if not m:
            raise ConfigError(f"--preset {spec}: write NAME=CONFIG.toml (NAME: letters, digits, '_', '.', '-')")
        if m.group(1) in presets:
            raise ConfigError(f"--preset {spec}: preset '{m.group(1)}' given twice")
        presets[m.group(1)] = m.group(2)
    check_address(args.host, args.port)
    from . import auth, limits

    limits.from_args(args)
    auth.keys_from(args.api_key)
    return presets


def check_address(host: str, port: int) -> None:
    """``ConfigError`` if the server could not listen on ``host:port``: found by binding a socket
    the way uvicorn will (``SO_REUSEADDR``), before the model loads (uvicorn would find it only
    after, and exit 3 with its own message). Port 0 (any free port) is always possible."""
    import socket

    if port == 0:
        return
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise ConfigError(f"--host {host}: not an address this machine can listen on ({exc.strerror})") from None
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            why = "already in use (another server is listening there)" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise ConfigError(f"--port {port}: cannot listen on {host}:{port}: {why}; choose another --port") from None


def _missing_extra() -> str | None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        return f"diffaccel serve needs FastAPI and uvicorn ({exc.name} is not installed): pip install 'diffaccel[serve]'"
    return None


def main(args: Any) -> int:
    """The ``serve`` command: load, then serve until SIGTERM or Ctrl-C."""
    presets = check_args(args)
    problem = _missing_extra()
    if problem:
        raise DiffaccelError(problem)
    import uvicorn

    from .app import create_app
    from .auth import ENV, keys_from
    from .engine import Engine
    from .limits import from_args

    keys, limits = keys_from(args.api_key), from_args(args)
    if not keys and not _loopback(args.host):  # said before minutes of loading
        _say(f"diffaccel: warning: serving on {args.host} without an API key: whoever reaches this port can generate "
             f"(--api-key KEY or {ENV})")
    engine = Engine(args.config, presets, batch_inexact=args.batch_inexact, max_batch=args.max_batch)
    app = create_app(engine, max_batch=args.max_batch, window_s=args.batch_window_ms / 1000, queue=args.queue,
                     limits=limits, keys=keys, public_metrics=args.public_metrics)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, access_log=args.log_level == "debug",
                            timeout_graceful_shutdown=args.shutdown_timeout, lifespan="on")
    server = _server(config, app)
    _say(f"diffaccel: serving {engine.model_id} ({engine.kind}; presets: {', '.join(sorted(engine.presets))}) on "
         f"http://{args.host}:{args.port} (max batch {args.max_batch}, window {args.batch_window_ms:g} ms, queue {args.queue}, "
         f"timeout {limits.request_timeout_s:g} s; {f'{len(keys)} API key(s)' if keys else 'no API key'}"
         f"{'' if engine.cross_batch else '; one request per batch: ' + _why_alone(engine)})")
    server.run()
    return 0


def _server(config, app):
    """uvicorn's server, whose SIGTERM / SIGINT also drains the batcher at once: queued requests
    are refused with 503, the running batch finishes and answers, then uvicorn closes."""
    import asyncio

    import uvicorn

    class Server(uvicorn.Server):
        loop = None

        def handle_exit(self, sig, frame):
            super().handle_exit(sig, frame)
            batcher = getattr(app.state, "batcher", None)
            if batcher is not None and self.loop is not None:  # a signal handler: drain on the loop's thread
                self.loop.call_soon_threadsafe(batcher.drain)

        async def serve(self, sockets=None):
            self.loop = asyncio.get_running_loop()
            await super().serve(sockets)

    return Server(config)


def _why_alone(engine) -> str:
    if not engine.row_seeds:
        return "the adapter's run takes no per-row seeds"
    return "a row alone and in a batch differ in float rounding on this model (--batch-inexact batches anyway)"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
