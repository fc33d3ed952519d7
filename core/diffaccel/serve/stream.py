"""Streamed completions (``stream: true``) for models that commit their text block by block.

A block-wise run (``diffaccel.contract.adapter.StreamsBlocks``: DiffusionGemma's canvases, the
masked sampler's semi-autoregressive blocks) never changes a block once it is committed, so each
committed block is sent as it lands, as OpenAI's server-sent events: ``data: {chunk}`` per
``text_completion`` chunk (one choice, its ``index`` the row), each row's last chunk with
``finish_reason``, the ``usage`` chunk when ``stream_options.include_usage`` asks, then
``data: [DONE]``. The worker thread puts ``(row, the row's final text so far)`` on the request's
queue (``batcher._stream``); the response reads it here on the event loop.

A chunk's text is what the row's final text gained since the last chunk, up to its last
whitespace: a tokenizer may join the word at a block's edge with the next block's first piece
(``dog '`` + ``s`` decodes ``dog's``), so that word waits for the next block. The last block and
whatever waited arrive with the output itself, so the chunks joined are the completion's text.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from .batcher import Batcher, Job
from .engine import RequestError, error_of

DONE = "data: [DONE]\n\n"


def sse(body: dict[str, Any]) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"


class TextDeltas:
    """Per row, the text sent so far, and what to send of a newer snapshot of its final text."""

    def __init__(self, rows: int):
        self.sent = [""] * rows

    def delta(self, row: int, text: str) -> str:
        """What ``text`` adds to what was sent, up to its last whitespace (the word there may
        still join the next block's text), without a trailing partial character."""
        sent = self.sent[row]
        if not text.startswith(sent):  # decoding the longer prefix changed the edge: wait for the end
            return ""
        new = text[len(sent):].rstrip("\ufffd")
        spaces = [i for i, ch in enumerate(new) if ch.isspace()]
        if spaces:
            cut = spaces[-1]
            while cut > 0 and new[cut - 1].isspace():
                cut -= 1
            new = new[:cut]
        self.sent[row] = sent + new
        return new

    def rest(self, row: int, final: str) -> str:
        """The rest of the row's final text. Should it not begin with what was sent (a tokenizer
        whose pieces decode differently in context), the text after the longest common start."""
        sent, self.sent[row] = self.sent[row], final
        return final[len(os.path.commonprefix([sent, final])):]


async def disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body has been read: the next message is that)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class Chunks:
    """The chunks of one streamed completion (their id, time and model are the request's)."""

    def __init__(self, model: str, usage_field: bool):
        self.base = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                     "model": model}
        self.usage_field = usage_field  # with include_usage, OpenAI's chunks carry "usage": null

    def text(self, row: int, text: str, finish: str | None = None, **extra: Any) -> str:
        choice = {"index": row, "text": text, "logprobs": None, "finish_reason": finish}
        return sse({**self.base, "choices": [choice], **({"usage": None} if self.usage_field else {}), **extra})

    def usage(self, usage: dict[str, int] | None) -> str:
        return sse({**self.base, "choices": [], "usage": usage})


async def _next(job: Job, gone: asyncio.Future) -> tuple[int, str] | None:
    """The job's next committed text, or None once its batch ended (or its client left)."""
    if not job.stream.empty():
        return job.stream.get_nowait()
    if job.future.done() or gone.done():
        return None
    get = asyncio.ensure_future(job.stream.get())
    try:
        await asyncio.wait({get, job.future, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not get.done():
            get.cancel()
    if get.done() and not get.cancelled():
        return get.result()
    # the batch ended: the blocks its last steps committed were put before its end (on the loop,
    # in order), and are still to be sent
    return job.stream.get_nowait() if job.future.done() and not job.stream.empty() else None


async def events(request: Request, batcher: Batcher, job: Job, first: tuple[int, str] | None, chunks: Chunks,
                 finish: Callable[[Any], tuple[dict[str, int] | None, dict[str, Any]]], include_usage: bool) -> AsyncIterator[str]:
    """The response body. Whatever ends it (its end, the client leaving, the server's shutdown
    cancelling it), a job still queued or running is cancelled: a batch whose every client left
    stops at its next step, and the worker never waits on this response."""
    deltas = TextDeltas(job.rows)
    gone = asyncio.ensure_future(disconnected(request))
    try:
        item = first if first is not None else await _next(job, gone)
        while item is not None:
            text = deltas.delta(*item)
            if text:
                yield chunks.text(item[0], text)
            item = await _next(job, gone)
        if not job.future.done() or job.future.cancelled():  # the client left
            return
        exc = job.future.exception()
        if exc is not None:  # the batch failed after the first block was sent: OpenAI's error event
            yield sse((exc if isinstance(exc, RequestError) else error_of(exc)).body())
            return
        rows = job.future.result()
        usage, extra = finish(rows)
        texts = rows.texts()
        for i, text in enumerate(texts):
            last = {"diffaccel": extra} if i == len(texts) - 1 else {}
            yield chunks.text(i, deltas.rest(i, text), "length", **last)
        if include_usage:
            yield chunks.usage(usage)
        yield DONE
    finally:
        gone.cancel()
        if not job.future.done():
            batcher.cancel(job)


def response(body: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
