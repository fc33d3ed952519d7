"""What one request may ask of ``diffaccel serve``, checked before any work starts (docs/serve.md).

* the body: at most ``max_body_bytes`` (413), read whole by ``BodyLimit`` before the endpoint
  parses it, and within the request's time limit (a client that stops sending gets 408);
* ``n``: at most ``max_n`` rows (400, ``param: n``);
* the prompt: at most ``max_prompt_bytes`` bytes of UTF-8 and ``max_prompt_tokens`` tokens of the
  served model's tokenizer, where the adapter exposes one (400, ``param: prompt``);
* open streams per client address: at most ``max_streams_per_client`` (429 with ``Retry-After``);
* time: a request still waiting or running ``request_timeout_s`` seconds after it arrived is
  answered 504 (the batcher's timer) and its rows leave the batch (``Batcher.cancel``).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from typing import Any

import attrs

from .engine import RequestError


@attrs.frozen(kw_only=True)
class Limits:
    """The server's per-request limits (``diffaccel serve``'s flags of the same names)."""

    max_body_bytes: int = 1 << 20
    """``--max-body-bytes``: a request body's bytes at most (a completion's JSON is a few hundred)."""
    max_n: int = 8
    """``--max-n``: rows (``n``) one request may ask for; at most ``--max-batch`` (a request is never split)."""
    max_prompt_bytes: int = 65536
    """``--max-prompt-bytes``: the prompt's UTF-8 bytes at most, checked before tokenizing it."""
    max_prompt_tokens: int = 4096
    """``--max-prompt-tokens``: the prompt's tokens at most (models with a tokenizer)."""
    max_streams_per_client: int = 4
    """``--max-streams-per-client``: streamed requests one client address may have open at once."""
    request_timeout_s: float = 600.0
    """``--request-timeout``: seconds from a request's arrival to its answer at most (504 past it)."""


FLAGS = {"max_body_bytes": 1, "max_n": 1, "max_prompt_bytes": 0, "max_prompt_tokens": 0, "max_streams_per_client": 1}
"""The integer flags and their smallest allowed value."""


def from_args(args: Any) -> Limits:
    """The limits of the command's options, checked (``ConfigError`` naming the flag)."""
    from ..contract.errors import ConfigError

    for name, low in FLAGS.items():
        value = getattr(args, name)
        if value is not None and value < low:
            raise ConfigError(f"--{name.replace('_', '-')}: must be {low} or more, got {value}")
    if not args.request_timeout > 0:
        raise ConfigError(f"--request-timeout: must be more than 0 seconds, got {args.request_timeout:g}")
    max_n = args.max_batch if args.max_n is None else args.max_n
    if max_n > args.max_batch:
        raise ConfigError(f"--max-n: {max_n} exceeds --max-batch {args.max_batch} (a request's rows run in one batch); "
                          f"allowed: 1 to {args.max_batch}")
    return Limits(max_body_bytes=args.max_body_bytes, max_n=max_n, max_prompt_bytes=args.max_prompt_bytes,
                  max_prompt_tokens=args.max_prompt_tokens, max_streams_per_client=args.max_streams_per_client,
                  request_timeout_s=args.request_timeout)


def check_n(limits: Limits, n: int) -> None:
    if n > limits.max_n:
        raise RequestError(400, f"n: {n} rows exceed the server's limit of {limits.max_n} (--max-n); allowed: 1 to "
                           f"{limits.max_n}", "invalid_request_error", param="n")


def check_prompt(limits: Limits, prompt: str, tokenizer: Any) -> None:
    """Bytes first (cheap, and bounds what the tokenizer is given), then tokens."""
    size = len(prompt.encode("utf-8"))
    if size > limits.max_prompt_bytes:
        raise RequestError(400, f"prompt: {size} bytes exceed the server's limit of {limits.max_prompt_bytes} "
                           "(--max-prompt-bytes)", "invalid_request_error", param="prompt")
    if tokenizer is not None and prompt:
        tokens = len(tokenizer.encode(prompt))
        if tokens > limits.max_prompt_tokens:
            raise RequestError(400, f"prompt: {tokens} tokens exceed the server's limit of {limits.max_prompt_tokens} "
                               "(--max-prompt-tokens)", "invalid_request_error", param="prompt")


class StreamSlots:
    """Open streamed requests per client address. A slot is taken before the request is queued
    and given back when its job ends (answered, failed, timed out or cancelled): the job's future
    says so even when the response body never starts (a client gone before it)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.open: dict[str, int] = defaultdict(int)

    def take(self, client: str, retry_after: int) -> None:
        if self.open[client] >= self.limit:
            raise RequestError(429, f"too many open streams from this client ({self.open[client]}; limit "
                               f"{self.limit}, --max-streams-per-client); retry after the Retry-After seconds",
                               "rate_limit_exceeded", code="too_many_streams", headers={"Retry-After": str(retry_after)})
        self.open[client] += 1

    def give(self, client: str) -> None:
        self.open[client] -= 1
        if self.open[client] <= 0:
            del self.open[client]

    def hold_until_done(self, client: str, future: asyncio.Future) -> None:
        future.add_done_callback(lambda _: self.give(client))


async def answer(scope, receive, send, error: RequestError) -> None:
    """Send ``error`` as the response (from a middleware, before the endpoint runs). The
    connection closes after it: the body it did not read is not worth reading."""
    from fastapi.responses import JSONResponse

    scope.setdefault("state", {})["error_type"] = error.type  # the metrics middleware reads it
    await JSONResponse(error.body(), status_code=error.status, headers={**error.headers, "Connection": "close"})(scope, receive, send)


class BodyLimit:
    """ASGI middleware: a request's body read whole before the endpoint, refused past
    ``max_bytes`` (413, as soon as ``Content-Length`` says so or the bytes arrive) or when it is not
    complete within the request's time limit (408: a slow or stalled sender holds a connection,
    never the batcher). Sets the request's ``deadline`` (``time.monotonic()``) in its state."""

    def __init__(self, app, limits: Limits):
        self.app, self.limits = app, limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        deadline = time.monotonic() + self.limits.request_timeout_s
        scope.setdefault("state", {})["deadline"] = deadline
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limits.max_body_bytes:
            return await answer(scope, receive, send, self._too_large(int(declared)))
        body, error = await self._read(receive, deadline)
        if error is not None:
            return await answer(scope, receive, send, error)
        if body is None:  # the client went away while sending: nothing to answer
            return await answer(scope, receive, send, RequestError(499, "the client closed the connection", "client_disconnected"))
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive, deadline: float) -> tuple[bytes | None, RequestError | None]:
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return None, RequestError(408, f"the request body did not arrive within --request-timeout "
                                          f"{self.limits.request_timeout_s:g} s", "invalid_request_error", code="request_timeout")
            if message["type"] == "http.disconnect":
                return None, None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limits.max_body_bytes:
                return None, self._too_large(size, at_least=True)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None

    def _too_large(self, size: int, at_least: bool = False) -> RequestError:
        return RequestError(413, f"the request body ({'at least ' if at_least else ''}{size} bytes) exceeds the server's "
                            f"limit of {self.limits.max_body_bytes} bytes (--max-body-bytes)", "invalid_request_error",
                            code="request_too_large")


def _replay(body: bytes, receive):
    """A ``receive`` that gives the body read, then the client's next messages (its disconnect)."""
    sent = False

    async def again():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again
