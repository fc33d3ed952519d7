"""``diffaccel serve`` holding load (a real server on 127.0.0.1): a full queue answers 503 with
Retry-After, a client that goes away has its rows dropped before they are computed, and SIGTERM
lets the running batch answer and refuses the queued requests with 503, never half a response."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest

from diffaccel.serve.launch import start_server
from diffaccel.serve.metrics import parse

CONFIG = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 32\nsteps = 16\n'


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve-load") / "text.toml"
    path.write_text(CONFIG)
    return str(path)


def _metrics(server) -> dict[str, float]:
    return parse(httpx.get(f"{server.url}/metrics", timeout=10).text)


def _wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def slow_window(config):
    """Requests wait 3 s for company before their batch starts: a window in which to go away or
    to fill the queue (2 requests)."""
    with start_server(config, "--max-batch", "8", "--batch-window-ms", "3000", "--queue", "2") as s:
        yield s


def test_a_client_that_goes_away_has_its_rows_dropped(slow_window):
    before = _metrics(slow_window)
    with pytest.raises(httpx.ReadTimeout):  # the client gives up long before the window ends
        httpx.post(f"{slow_window.url}/v1/completions", json={"n": 3, "seed": 1}, timeout=0.5)
    assert _wait_for(lambda: _metrics(slow_window)["diffaccel_dropped_rows_total"] == 3, timeout=5)
    time.sleep(3.5)  # past the window: a batch would have run by now
    after = _metrics(slow_window)
    assert after["diffaccel_batch_rows_count"] == before["diffaccel_batch_rows_count"]  # nothing was computed
    assert after["diffaccel_queue_depth"] == 0
    assert after['diffaccel_requests_total{endpoint="/v1/completions",status="499"}'] == 1
    r = httpx.post(f"{slow_window.url}/v1/completions", json={"seed": 1}, timeout=30)
    assert r.status_code == 200  # and the server goes on


def test_past_the_queue_503_with_retry_after(slow_window):
    async def go():
        async with httpx.AsyncClient(base_url=slow_window.url, timeout=60) as c:
            waiting = [asyncio.ensure_future(c.post("/v1/completions", json={"seed": s})) for s in (1, 2)]
            while _metrics(slow_window)["diffaccel_queue_depth"] < 2:
                await asyncio.sleep(0.05)
            refused = await c.post("/v1/completions", json={"seed": 3})
            return refused, await asyncio.gather(*waiting)

    refused, waited = asyncio.run(go())
    assert refused.status_code == 503
    assert int(refused.headers["retry-after"]) >= 1
    err = refused.json()["error"]
    assert err["type"] == "server_overloaded" and err["code"] == "queue_full"
    assert [r.status_code for r in waited] == [200, 200]
    assert [r.json()["diffaccel"]["batch_rows"] for r in waited] == [2, 2]
    assert _metrics(slow_window)['diffaccel_errors_total{type="server_overloaded"}'] == 1


def test_sigterm_finishes_the_running_batch_and_refuses_the_queued(config):
    # one request per batch, 128 steps: the first batch is still running when SIGTERM comes
    server = start_server(config, "--max-batch", "1", "--batch-window-ms", "0", "--queue", "8")
    body = {"max_tokens": 64, "diffaccel": {"steps": 128}}

    async def go():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            sent = [asyncio.ensure_future(c.post("/v1/completions", json={**body, "seed": s})) for s in range(4)]
            while _metrics(server)["diffaccel_rows_in_flight"] < 1 or _metrics(server)["diffaccel_queue_depth"] < 3:
                await asyncio.sleep(0.02)
            server.process.send_signal(signal.SIGTERM)
            return await asyncio.gather(*sent, return_exceptions=True)

    try:
        responses = asyncio.run(go())
        code = server.process.wait(60)
    finally:
        server.stop()
    assert all(isinstance(r, httpx.Response) for r in responses), responses  # no connection cut mid-answer
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200, 503, 503, 503], [r.text for r in responses]
    done = next(r for r in responses if r.status_code == 200).json()
    assert len(done["choices"]) == 1 and done["diffaccel"]["steps_run"] == 128
    for r in responses:
        if r.status_code == 503:
            assert r.json()["error"]["type"] == "server_shutting_down"
    assert code in (0, -signal.SIGTERM)
    assert "Traceback" not in server.log()
