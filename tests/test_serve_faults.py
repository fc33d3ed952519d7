"""``diffaccel serve`` under faults, and its image endpoint (real servers on 127.0.0.1).

A strategy that raises fails only its batch (500 ``strategy_error`` naming it) and the server
keeps serving; with ``on_error = "disable"`` the batch completes without it and the response says
so; a non-finite image is an error response. The boom strategy is tests/boom_plugin (installed
into a throwaway folder, on the servers' PYTHONPATH only), as in tests/test_faults.py."""

from __future__ import annotations

import asyncio
import base64
import io
from pathlib import Path

import httpx
import pytest

from diffaccel.serve.launch import start_server
from diffaccel.serve.loadtest import offline_payloads

BOOM = Path(__file__).resolve().parent / "boom_plugin"
TEXT = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 32\nsteps = 16\n'
RAISES = '[[strategy]]\nuse = "boom"\nhook = "layer_output"\nstep = 2\n'
IMAGE = '[model]\nadapter = "unet"\ncheckpoint = "digits"\nsteps = 5\nguidance_scale = 2.0\nprompts = ["digit 3"]\n'
NAN = '[[strategy]]\nuse = "boom"\nhook = "layer_output"\nstep = 2\nfail = "nan"\n[guard]\nfinite = false\n'


@pytest.fixture(scope="module")
def site(install_distribution):
    return install_distribution(BOOM)


def _write(folder: Path, name: str, text: str) -> str:
    (folder / name).write_text(text)
    return str(folder / name)


@pytest.fixture(scope="module")
def text_server(site, tmp_path_factory):
    d = tmp_path_factory.mktemp("serve-faults")
    config = _write(d, "boom.toml", TEXT + RAISES)
    soft = _write(d, "soft.toml", TEXT + RAISES + 'on_error = "disable"\n')
    with start_server(config, "--preset", f"soft={soft}", "--batch-window-ms", "300", env={"PYTHONPATH": str(site)}) as s:
        yield s


async def _burst(server, path, bodies):
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
        return await asyncio.gather(*[c.post(path, json=b) for b in bodies])


def test_a_raising_strategy_fails_its_batch_only_and_the_server_goes_on(text_server):
    bodies = [{"seed": 1}, {"seed": 2}, {"seed": 1, "diffaccel": {"preset": "none"}}]
    a, b, plain = asyncio.run(_burst(text_server, "/v1/completions", bodies))
    for r in (a, b):  # the two default-preset requests shared the failing batch
        assert r.status_code == 500
        err = r.json()["error"]
        assert err["type"] == "strategy_error" and err["code"] == "boom"
        assert err["message"].startswith("strategy 'boom' (diffaccel-boom 0.1.0) raised RuntimeError in layer_output at step 2")
    assert plain.status_code == 200 and plain.json()["diffaccel"]["batch_rows"] == 1
    again = httpx.post(f"{text_server.url}/v1/completions", json={"seed": 1, "diffaccel": {"preset": "none"}}, timeout=60)
    assert again.status_code == 200 and again.json()["choices"] == plain.json()["choices"]
    assert httpx.get(f"{text_server.url}/health", timeout=10).json()["status"] == "ok"


def test_on_error_disable_completes_without_the_strategy_and_says_so(text_server):
    soft, plain = asyncio.run(_burst(text_server, "/v1/completions",
                                     [{"seed": 4, "diffaccel": {"preset": "soft"}}, {"seed": 4, "diffaccel": {"preset": "none"}}]))
    assert soft.status_code == 200, soft.text
    (disabled,) = soft.json()["diffaccel"]["strategies_disabled"]
    assert disabled["strategy"] == "boom" and disabled["hook"] == "layer_output" and disabled["step"] == 2
    assert "strategies_disabled" not in plain.json()["diffaccel"]
    # boom changes nothing before it fails: without it the run is the plain run
    assert soft.json()["choices"] == plain.json()["choices"]


@pytest.fixture(scope="module")
def image_server(site, tmp_path_factory):
    d = tmp_path_factory.mktemp("serve-images")
    config = _write(d, "digits.toml", IMAGE)
    nan = _write(d, "nan.toml", IMAGE + NAN)
    # one thread, as this process runs (conftest): the offline images the test compares with are made
    # here, and the UNet's rounding in a batch depends on the thread count (two threads split a batch
    # of 2 differently from one), so a server on the machine's default threads gave other bytes in CI
    env = {"PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    with start_server(config, "--preset", f"nan={nan}", "--batch-window-ms", "300", env=env) as s:
        yield s


def test_images_equal_generate_and_are_batched_as_the_measured_invariance_allows(image_server):
    from PIL import Image

    (m,) = httpx.get(f"{image_server.url}/v1/models", timeout=10).json()["data"]
    # whether the UNet's rows are the same alone and in a batch depends on the CPU's kernels (one
    # machine's rounding differed between batch sizes, another's did not): the server measures it
    # at start; requests share batches exactly when it found the rows invariant
    assert m["diffaccel"]["kind"] == "image" and isinstance(m["diffaccel"]["batch_invariant"], bool)
    shared = m["diffaccel"]["batch_invariant"]
    assert m["diffaccel"]["requests_share_batches"] is shared
    bodies = [{"prompt": "digit 7", "n": 2, "seed": 3, "response_format": "b64_json", "size": "32x32"},
              {"prompt": "digit 1", "n": 1, "seed": 11}]
    responses = asyncio.run(_burst(image_server, "/v1/images/generations", bodies))
    assert [r.status_code for r in responses] == [200, 200], [r.text for r in responses]
    out = [r.json() for r in responses]
    # both arrive within the 300 ms window: one batch of 3 rows when shared, else one batch each
    assert [o["diffaccel"]["batch_rows"] for o in out] == ([3, 3] if shared else [2, 1])
    pngs = [[d["b64_json"] for d in o["data"]] for o in out]
    assert pngs == offline_payloads(image_server.config, "image", bodies)
    pic = Image.open(io.BytesIO(base64.b64decode(pngs[0][0])))
    assert pic.size == (32, 32) and pic.mode == "L"
    assert pngs[0][0] != pngs[0][1]


def test_image_request_errors(image_server):
    url = f"{image_server.url}/v1/images/generations"
    r = httpx.post(url, json={"prompt": "digit 2", "size": "64x64"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "size" and "32x32" in r.json()["error"]["message"]
    r = httpx.post(url, json={"prompt": "digit 2", "response_format": "url"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    r = httpx.post(url, json={"prompt": "digit 2", "stream": True}, timeout=30)  # an image is not streamed
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
    r = httpx.post(f"{image_server.url}/v1/completions", json={"prompt": "x"}, timeout=30)
    assert r.status_code == 400 and "/v1/images/generations" in r.json()["error"]["message"]
    # NaN from a strategy, with the finite guard off: an error response, never an image
    r = httpx.post(url, json={"prompt": "digit 2", "diffaccel": {"preset": "nan"}}, timeout=60)
    assert r.status_code == 500 and r.json()["error"]["type"] == "non_finite_output"
    assert "data" not in r.json()
    r = httpx.post(url, json={"prompt": "digit 2"}, timeout=60)
    assert r.status_code == 200 and len(r.json()["data"]) == 1
