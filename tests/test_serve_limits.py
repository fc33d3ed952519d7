"""``diffaccel serve``'s per-request limits against a real server on 127.0.0.1: body size (413, by
its declared length and by the bytes of a chunked body), ``n`` and the prompt (400), open streams
per client (429 + Retry-After), a stalled sender (408) and ``--request-timeout`` (504, the batch
stopped); after all of them the server answers as before. Small limits, a handful of requests."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest

from diffaccel.serve.launch import start_server
from diffaccel.serve.loadtest import offline_payloads
from diffaccel.serve.metrics import parse

MODEL = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 32\nsteps = 16\nblock_size = 8\n'
LIMITS = ["--max-batch", "4", "--max-n", "2", "--max-body-bytes", "2048", "--max-prompt-bytes", "200",
          "--max-prompt-tokens", "5", "--max-streams-per-client", "1", "--request-timeout", "3", "--batch-window-ms", "50"]
SLOW = {"prompt": "a dog", "seed": 5, "diffaccel": {"steps": 20000}}  # far longer than the 3 s timeout


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("limits") / "blocks.toml"
    path.write_text(MODEL)
    return str(path)


@pytest.fixture(scope="module")
def server(config):
    with start_server(config, *LIMITS, env={"OMP_NUM_THREADS": "1"}) as s:
        yield s


def _raw(server, head: str, body: bytes = b"", wait: float = 30.0) -> tuple[int, float]:
    """A request written by hand (the body possibly partial); its status and seconds."""
    host, port = server.url.removeprefix("http://").split(":")
    t0 = time.perf_counter()
    with socket.create_connection((host, int(port)), timeout=wait) as sock:
        sock.sendall(head.encode() + body)
        status = sock.makefile("rb").readline().split()[1]
    return int(status), time.perf_counter() - t0


HEAD = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def test_bodies_over_the_limit_get_413_before_they_are_read(server):
    status, _ = _raw(server, HEAD + "Content-Length: 5000000\r\n\r\n", b"{")  # refused on its headers alone
    assert status == 413
    chunk = b"x" * 1000
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(3))  # 3000 bytes, no length declared
    assert _raw(server, HEAD + "Transfer-Encoding: chunked\r\n\r\n", chunks)[0] == 413
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "a", "seed": 1, "n": 1, "model": "x" * 2100}, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert "2048 bytes (--max-body-bytes)" in r.json()["error"]["message"]


def test_n_and_the_prompt_are_limited_naming_the_field(server):
    post = lambda body: httpx.post(f"{server.url}/v1/completions", json=body, timeout=30)  # noqa: E731
    r = post({"prompt": "a dog", "n": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n" and "--max-n" in r.json()["error"]["message"]
    r = post({"prompt": "é" * 101})  # 202 bytes of UTF-8, 101 characters
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert r.json()["error"]["message"].startswith("prompt: 202 bytes exceed the server's limit of 200")
    r = post({"prompt": "a dog is a cat and a bird"})  # few bytes, more than 5 tokens
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt" and "tokens" in r.json()["error"]["message"]
    assert post({"prompt": "a dog", "n": 2, "seed": 1}).status_code == 200


def test_a_stalled_sender_gets_408_at_the_timeout(server):
    body = json.dumps({"prompt": "a dog"}).encode()
    status, seconds = _raw(server, HEAD + f"Content-Length: {len(body)}\r\n\r\n", body[:5])
    assert status == 408 and 2.5 < seconds < 8


def test_a_second_stream_is_429_and_a_request_past_the_timeout_504_while_others_go_on(server, config):
    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            first = asyncio.ensure_future(c.post("/v1/completions", json={**SLOW, "stream": True}))
            await asyncio.sleep(1.0)  # queued, then running: its stream slot is taken
            second = await c.post("/v1/completions", json={"prompt": "a dog", "stream": True})
            t0 = time.perf_counter()
            return await first, second, time.perf_counter() - t0

    before = parse(httpx.get(f"{server.url}/metrics", timeout=30).text)
    first, second, waited = asyncio.run(scenario())
    assert second.status_code == 429 and second.json()["error"]["code"] == "too_many_streams"
    assert int(second.headers["retry-after"]) >= 1
    assert first.status_code == 504 and waited < 6  # the 3 s timeout, counted from its arrival
    err = first.json()["error"]
    assert err["type"] == "timeout_error" and err["code"] == "request_timeout" and "still running" in err["message"]
    after = parse(httpx.get(f"{server.url}/metrics", timeout=30).text)
    assert after["diffaccel_timed_out_requests_total"] - before["diffaccel_timed_out_requests_total"] == 1
    # nobody else waited on its batch: it stopped at its next step instead of running 20000 steps
    assert after["diffaccel_stopped_batches_total"] - before["diffaccel_stopped_batches_total"] == 1
    assert after["diffaccel_rows_in_flight"] == 0
    # its stream slot is free again, and the server answers as generate does
    body = {"prompt": "a dog", "seed": 9}
    r = httpx.post(f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=60)
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    plain = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
    assert [c["text"] for c in plain["choices"]] == offline_payloads(config, "text", [{**body, "n": 1}])[0]
