"""API keys for ``diffaccel serve``: ``--api-key KEY`` (repeatable) and ``DIFFACCEL_API_KEY``
(comma-separated), as vLLM and SGLang take them.

With a key, every route but ``/health`` (and ``/metrics`` with ``--public-metrics``) needs
``Authorization: Bearer KEY``; a missing or wrong key is answered 401 in OpenAI's shape (``code:
invalid_api_key``) before the body is read. The comparison is in constant time: the SHA-256 of the
key sent against the SHA-256 of every key (equal lengths, ``hmac.compare_digest``, no early exit),
so neither a key's bytes nor which key matched shows in the time. Keys are never logged or echoed.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Iterable

from .engine import RequestError
from .limits import answer

ENV = "DIFFACCEL_API_KEY"
KEY = re.compile(r"^[\x21-\x7e]+$")
"""A key as a bearer token can carry it: printable ASCII, no spaces."""
OPEN = ("/health",)
"""Routes that never need the key (a load balancer's probe)."""


def keys_from(flags: Iterable[str] | None, environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """The keys of ``--api-key`` and ``DIFFACCEL_API_KEY``, checked (``ConfigError`` naming where
    the bad one came from, never printing a key)."""
    from ..contract.errors import ConfigError

    environ = os.environ if environ is None else environ
    found: list[str] = []
    for i, key in enumerate(flags or [], 1):
        if not KEY.match(key):
            raise ConfigError(f"--api-key (number {i}): {_why(key)}")
        found.append(key)
    if ENV in environ:
        for i, key in enumerate(environ[ENV].split(","), 1):
            if not KEY.match(key):
                raise ConfigError(f"{ENV} (key {i} of its comma-separated list): {_why(key)}")
            found.append(key)
    return tuple(dict.fromkeys(found))


def _why(key: str) -> str:
    if not key:
        return "an empty key; give a non-empty key"
    return "a key must be printable ASCII without spaces (a bearer token carries it)"


class Keys:
    """The accepted keys, kept as SHA-256 digests."""

    def __init__(self, keys: Iterable[str]):
        self.digests = [hashlib.sha256(k.encode()).digest() for k in keys]

    def accepts(self, key: str) -> bool:
        sent = hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
        match = False
        for digest in self.digests:  # every key compared: the time does not say which one matched
            match |= hmac.compare_digest(sent, digest)
        return match


def bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The token of the ``Authorization: Bearer TOKEN`` header, or None."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


class RequireKey:
    """ASGI middleware: 401 for a request to a guarded route without an accepted key."""

    def __init__(self, app, keys: Keys, public_metrics: bool = False):
        self.app, self.keys = app, keys
        self.open = OPEN + (("/metrics",) if public_metrics else ())

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in self.open:
            token = bearer(scope["headers"])
            if token is None or not self.keys.accepts(token):
                said = "no API key was sent" if token is None else "the API key sent is not accepted"
                error = RequestError(401, f"{said}: send 'Authorization: Bearer KEY' with a key the server was started with "
                                     f"(--api-key or {ENV})", "invalid_request_error", code="invalid_api_key",
                                     headers={"WWW-Authenticate": "Bearer"})
                return await answer(scope, receive, send, error)
        await self.app(scope, receive, send)
