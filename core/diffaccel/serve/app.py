"""The HTTP side of ``diffaccel serve``: OpenAI-shaped endpoints on FastAPI.

* ``POST /v1/completions`` (text models): ``prompt`` (a string; empty: unconditional), ``n``,
  ``seed``, ``max_tokens`` (the sample's ``length``, prompt included, as ``generate`` counts it),
  ``temperature``; diffaccel's own knobs in one extra object ``diffaccel: {"steps": N,
  "preset": "name"}``. Each choice's ``text`` is the row's whole text, prompt included, exactly as
  ``diffaccel generate`` prints it; ``usage`` counts the prompt's tokens and the positions generated
  past it (all choices). ``stream: true`` (``stream.py``): each committed block as a chunk, for
  models that commit their text block by block; other models refuse it (400, ``param: stream``).
* ``POST /v1/images/generations`` (image models): ``prompt``, ``n``, ``seed``, ``response_format``
  (``b64_json``: a PNG), ``size`` (only the served size), ``diffaccel`` as above.
* ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text format).

A request's rows use seeds ``seed .. seed+n-1`` (default: the config's ``[model] seed``): the
response is what ``diffaccel generate --seed SEED`` gives with ``batch = n`` and the request's
keys. Errors are OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: 400 for
bad input (naming the field), 503 with ``Retry-After`` when the queue is full or the server is
shutting down, 500 for a batch whose strategy raised (``strategy_error``, ``code``: the
strategy) or whose output was not finite (``non_finite_output``). With API keys (``auth``) every
route but ``/health`` needs one (401); the per-request limits (``limits``) answer 413, 400, 429,
408 and 504 before any work starts, or when the request's time is up.
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, Literal

import attrs
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from . import stream
from .auth import Keys, RequireKey
from .batcher import Batcher, Job
from .limits import BodyLimit, Limits, StreamSlots, check_n, check_prompt
from .engine import FIELDS, NO_STRATEGIES, Engine, RequestError, Work
from .metrics import Metrics

MAX_SEED = 2**63 - 1


class Knobs(BaseModel):
    """The ``diffaccel`` field of a request."""

    model_config = ConfigDict(extra="forbid", strict=True)
    steps: int | None = Field(None, ge=1, le=100_000)
    preset: str | None = None


class StreamOptions(BaseModel):
    """OpenAI's ``stream_options``: ``include_usage`` sends a last chunk with the ``usage``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    prompt: str = ""
    max_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    temperature: float | None = Field(None, ge=0.0, le=100.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    diffaccel: Knobs | None = None


class ImageRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    prompt: str = ""
    n: int = Field(1, ge=1)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    response_format: Literal["b64_json"] = "b64_json"
    size: str | None = None
    diffaccel: Knobs | None = None


def create_app(engine: Engine, *, max_batch: int, window_s: float, queue: int, limits: Limits | None = None,
               keys: tuple[str, ...] = (), public_metrics: bool = False) -> FastAPI:
    """The app; ``keys``: the accepted API keys (none: open to whoever reaches the port)."""
    limits = limits or Limits(max_n=max_batch)
    limits = attrs.evolve(limits, max_n=min(limits.max_n, max_batch))  # a request's rows run in one batch
    metrics = Metrics(max_batch)
    state: dict[str, Batcher] = {}
    slots = StreamSlots(limits.max_streams_per_client)
    tokenizer = engine.info.get("tokenizer") if hasattr(engine.info.get("tokenizer"), "encode") else None

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher = Batcher(engine, metrics, max_batch=max_batch, window_s=window_s, queue=queue, timeout_s=limits.request_timeout_s)
        batcher.start()
        state["batcher"] = app.state.batcher = batcher
        yield
        await batcher.stop()

    app = FastAPI(title="diffaccel serve", lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.state.metrics = metrics
    app.add_middleware(BodyLimit, limits=limits)  # innermost: an unauthenticated body is never read
    if keys:
        app.add_middleware(RequireKey, keys=Keys(keys), public_metrics=public_metrics)
    app.add_middleware(_Observe, metrics=metrics)  # outermost: it counts every answer, refusals included
    _add_error_handlers(app)
    _add_info_routes(app, engine, state, metrics, max_batch)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        _check_common(engine, "text", body.model, body.n, limits, "/v1/completions")
        check_prompt(limits, body.prompt, tokenizer)
        options = _completion_options(engine, body)
        if body.stream:
            return await _stream(request, state["batcher"], engine, body, options, slots)
        if body.stream_options is not None:
            raise RequestError(400, "stream_options: allowed only with stream: true", "invalid_request_error",
                               param="stream_options")
        job, seconds = await _submit(request, state["batcher"], engine, "text", body.prompt, body.n, body.seed, body.diffaccel, options)
        rows = job.future.result()
        choices = [{"index": i, "text": t, "logprobs": None, "finish_reason": "length"} for i, t in enumerate(rows.texts())]
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": engine.model_id, "choices": choices, "usage": _usage(rows.token_counts()),
                "diffaccel": _extra(job, rows.report, seconds)}

    @app.post("/v1/images/generations")
    async def images(body: ImageRequest, request: Request):
        _check_common(engine, "image", body.model, body.n, limits, "/v1/images/generations")
        check_prompt(limits, body.prompt, None)
        if body.size is not None:
            served = f"{engine.image_shape[2]}x{engine.image_shape[1]}"
            if body.size != served:
                raise RequestError(400, f"size: '{body.size}' is not served; allowed: {served} (the config's size)",
                                   "invalid_request_error", param="size")
        job, seconds = await _submit(request, state["batcher"], engine, "image", body.prompt, body.n, body.seed, body.diffaccel, {})
        rows = job.future.result()
        data = [{"b64_json": base64.b64encode(png_bytes(img)).decode("ascii")} for img in rows.images()]
        return {"created": int(time.time()), "data": data, "diffaccel": _extra(job, rows.report, seconds)}

    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Errors in OpenAI's shape."""

    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError):
        request.state.error_type = exc.type
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        return await request_error(request, _validation_error(exc.errors()))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return await request_error(request, RequestError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind))


def _add_info_routes(app: FastAPI, engine: Engine, state: dict[str, Batcher], metrics: Metrics, max_batch: int) -> None:
    """``/health``, ``/metrics`` and ``/v1/models``."""

    @app.get("/health")
    async def health():
        batcher = state["batcher"]
        body = {"status": "draining" if batcher.draining else "ok", "model": engine.model_id, "kind": engine.kind,
                "queue_depth": len(batcher.pending), "max_batch": max_batch}
        return JSONResponse(body, status_code=503 if batcher.draining else 200)

    @app.get("/metrics")
    async def metrics_text():
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": engine.model_id, "object": "model", "created": 0, "owned_by": "diffaccel",
            "diffaccel": {"adapter": engine.adapter.name, "kind": engine.kind, "presets": sorted(engine.presets),
                          "max_batch": max_batch, "per_row_seeds": engine.row_seeds,
                          "batch_invariant": engine.batch_invariant, "requests_share_batches": engine.cross_batch}}]}


def _completion_options(engine: Engine, body: CompletionRequest) -> dict[str, Any]:
    """The adapter options a completion request sets (``max_tokens``, ``temperature``)."""
    options: dict[str, Any] = {}
    if body.max_tokens is not None:
        limit = engine.info.get("max_len")
        _option(engine, "length", "max_tokens")
        if isinstance(limit, int) and body.max_tokens > limit:
            raise RequestError(400, f"max_tokens: {body.max_tokens} exceeds the model's {limit} positions; allowed: 1 to {limit}",
                               "invalid_request_error", param="max_tokens")
        options["length"] = body.max_tokens
    if body.temperature is not None:
        _option(engine, "temperature", "temperature")
        options["temperature"] = body.temperature
    return options


async def _stream(request: Request, batcher: Batcher, engine: Engine, body: CompletionRequest,
                  options: dict[str, Any], slots: StreamSlots) -> StreamingResponse:
    """A streamed completion: refused (400, ``stream``) unless the run commits blocks in order,
    and (429) past the client's open streams. Waits for the first committed block (or the end)
    before answering, so that a request refused or failed before then gets its error status, as
    without ``stream``."""
    try:
        engine.check_keys({}, options)
    except ValueError:
        block = 0  # a bad option: ``_enqueue`` names its field, as without stream
    else:
        block = engine.block_length(options)
    if block is None:
        raise RequestError(400, f"stream: not supported for this model ('{engine.model_id}'): its runs finish all "
                           "tokens together; streaming needs a model that commits its text block by block "
                           "(DiffusionGemma, or a masked sampler with block_size below the length; docs/serve.md)",
                           "invalid_request_error", param="stream")
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    queue: asyncio.Queue = asyncio.Queue()
    client = request.client.host if request.client else "?"
    slots.take(client, batcher.retry_after())
    try:
        job, t0 = _enqueue(request, batcher, engine, "text", body.prompt, body.n, body.seed, body.diffaccel, options, stream=queue)
    except BaseException:
        slots.give(client)
        raise
    slots.hold_until_done(client, job.future)
    first = asyncio.ensure_future(queue.get())
    try:
        await _await(request, batcher, job, first)
    finally:
        if not first.done():
            first.cancel()
    item = first.result() if first.done() and not first.cancelled() else None

    def finish(rows) -> tuple[dict[str, int] | None, dict[str, Any]]:
        return _usage(rows.token_counts()), _extra(job, rows.report, time.perf_counter() - t0)

    return stream.response(stream.events(request, batcher, job, item, stream.Chunks(engine.model_id, include_usage),
                                         finish, include_usage))


def _check_common(engine: Engine, kind: str, model: str | None, n: int, limits: Limits, path: str) -> None:
    if engine.kind != kind:
        other = "/v1/completions" if engine.kind == "text" else "/v1/images/generations"
        raise RequestError(400, f"{path}: this server serves the {engine.kind} model '{engine.model_id}'; use {other}",
                           "invalid_request_error")
    if model is not None and model != engine.model_id:
        raise RequestError(404, f"model: '{model}' is not served; allowed: '{engine.model_id}'", "invalid_request_error",
                           param="model", code="model_not_found")
    check_n(limits, n)


def _option(engine: Engine, key: str, field: str) -> None:
    if key not in engine.option_names:
        raise RequestError(400, f"{field}: not supported by the '{engine.adapter.name}' adapter (it has no '{key}' option)",
                           "invalid_request_error", param=field)


def _enqueue(request: Request, batcher: Batcher, engine: Engine, kind: str, prompt: str, n: int, seed: int | None,
             knobs: Knobs | None, options: dict[str, Any], stream: asyncio.Queue | None = None) -> tuple[Job, float]:
    """The request checked (preset, keys, seeds) and queued, due at its deadline (``BodyLimit``
    set it from its arrival); the job and when it was queued."""
    preset = (knobs.preset if knobs else None) or "default"
    if preset not in engine.presets:
        raise RequestError(400, f"diffaccel.preset: unknown preset '{preset}'; allowed: {', '.join(sorted(engine.presets))}",
                           "invalid_request_error", param="diffaccel.preset")
    model = {"steps": knobs.steps} if knobs and knobs.steps is not None else {}
    try:  # the adapter's own validators, before the request is queued
        engine.check_keys(model, options)
    except ValueError as exc:
        key = getattr(exc, "key", None)
        field = FIELDS.get(key, key)
        raise RequestError(400, f"{field}: {getattr(exc, 'message', exc)}", "invalid_request_error", param=field) from None
    seed = engine.config.model.seed if seed is None else seed
    if seed + n - 1 > MAX_SEED:
        raise RequestError(400, f"seed: {seed} + n - 1 exceeds {MAX_SEED}", "invalid_request_error", param="seed")
    work = Work(kind, preset, tuple(sorted(model.items())), tuple(sorted(options.items())))
    t0 = time.perf_counter()
    deadline = getattr(request.state, "deadline", None)
    return batcher.submit(work, [prompt] * n, [seed + i for i in range(n)], stream=stream, deadline=deadline), t0


async def _await(request: Request, batcher: Batcher, job: Job, first: asyncio.Future | None = None) -> None:
    """Waits for the job's result (or, streamed, its first block); raises its error, or 499 when
    the client went away first (its rows then leave the queue)."""
    gone = asyncio.ensure_future(stream.disconnected(request))
    try:
        await asyncio.wait({job.future, gone} | ({first} if first is not None else set()), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not job.future.done() and not (first is not None and first.done()):  # the client went away
        batcher.cancel(job)
        raise RequestError(499, "the client closed the connection", "client_disconnected")
    if job.future.cancelled():
        raise RequestError(499, "the client closed the connection", "client_disconnected")
    exc = job.future.exception() if job.future.done() else None
    if exc is not None:
        raise exc


async def _submit(request: Request, batcher: Batcher, engine: Engine, kind: str, prompt: str, n: int, seed: int | None,
                  knobs: Knobs | None, options: dict[str, Any]) -> tuple[Job, float]:
    job, t0 = _enqueue(request, batcher, engine, kind, prompt, n, seed, knobs, options)
    await _await(request, batcher, job)
    return job, time.perf_counter() - t0


def _usage(counts: tuple[int, int] | None) -> dict[str, int] | None:
    """OpenAI's ``usage``: the prompt's tokens (once, as OpenAI counts them for ``n`` choices) and
    the tokens generated over all choices (docs/serve.md says what they cost a diffusion model)."""
    if counts is None:
        return None
    prompt, generated = counts
    return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}


def _extra(job: Job, report: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The response's ``diffaccel`` field: the rows' seeds, the batch, and what the strategies did."""
    extra = {"preset": job.work.preset, "seeds": list(job.seeds), "batch_rows": job.rows_in_batch,
             "seconds": round(seconds, 4), "steps_run": report.get("steps_run"),
             "fraction_computed": report.get("counters", {}).get("fraction_computed")}
    disabled = (report.get("reliability") or {}).get("disabled")
    if disabled:  # strategies with on_error = "disable" that failed: the batch completed without them
        extra["strategies_disabled"] = disabled
    return extra


def png_bytes(image) -> bytes:
    """One (C, H, W) image in [0, 1] as PNG bytes, 8 bits per channel as ``generate`` writes it."""
    import torch
    from PIL import Image

    arr = (image.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    buf = io.BytesIO()
    Image.fromarray(arr[..., 0] if image.shape[0] == 1 else arr[..., :3]).save(buf, format="PNG")
    return buf.getvalue()


def _validation_error(errors: list[dict[str, Any]]) -> RequestError:
    """FastAPI's validation errors as one OpenAI error naming the first field."""
    e = errors[0] if errors else {"type": "", "loc": (), "msg": "invalid request"}
    loc = [str(p) for p in e.get("loc", ())][1:]  # drop "body"
    field = ".".join(loc) or None
    if e.get("type") == "json_invalid":
        return RequestError(400, f"malformed JSON body: {e.get('ctx', {}).get('error', e.get('msg'))}", "invalid_request_error")
    if e.get("type") == "extra_forbidden":
        return RequestError(400, f"{field}: unknown field", "invalid_request_error", param=field)
    if e.get("type") == "missing" and not loc:
        return RequestError(400, "the request needs a JSON object body", "invalid_request_error")
    return RequestError(400, f"{field or 'body'}: {e.get('msg')}", "invalid_request_error", param=field)


class _Observe:
    """ASGI middleware: every response's status and latency into the metrics (a pure ASGI class,
    not BaseHTTPMiddleware, so that the endpoints see the client's disconnect)."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), [500]

        async def observe(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observe)
        finally:
            path = scope.get("path", "")
            endpoint = path if path in ENDPOINTS else "other"
            error = scope.get("state", {}).get("error_type") if status[0] >= 400 else None
            self.metrics.request_done(endpoint, status[0], time.perf_counter() - t0, error or (f"http_{status[0]}" if status[0] >= 400 else None))


ENDPOINTS = ("/v1/completions", "/v1/images/generations", "/v1/models", "/health", "/metrics")
