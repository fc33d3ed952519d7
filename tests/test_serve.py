"""``diffaccel serve`` against a real uvicorn server (a child process on 127.0.0.1, a free port)
and a real client (httpx): the endpoints' contract, batching that equals single runs, bad
requests and the metrics. The shipped 4-layer wordnet-masked model, 32 tokens, 16 steps, with
swd (a strategy that skips work per row) as the default preset."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from diffaccel.serve.launch import start_server
from diffaccel.serve.loadtest import offline_payloads
from diffaccel.serve.metrics import parse

MODEL = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 32\nsteps = 16\n'
CONFIG = MODEL + '[[strategy]]\nuse = "swd"\n'
WINDOW_MS = 400  # long enough that a burst of requests sent together lands in one batch


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve") / "text.toml"
    path.write_text(CONFIG)
    return str(path)


@pytest.fixture(scope="module")
def server(config):
    with start_server(config, "--max-batch", "8", "--batch-window-ms", str(WINDOW_MS), "--queue", "16") as s:
        yield s


def _post(server, body, path="/v1/completions", **kw):
    return httpx.post(f"{server.url}{path}", json=body, timeout=60, **kw)


async def _burst(server, bodies):
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
        return await asyncio.gather(*[c.post("/v1/completions", json=b) for b in bodies])


def test_health_models_and_a_completion_equal_to_generate(server, config):
    h = httpx.get(f"{server.url}/health", timeout=10)
    assert h.status_code == 200 and h.json()["status"] == "ok" and h.json()["kind"] == "text"
    models = httpx.get(f"{server.url}/v1/models", timeout=10).json()
    (m,) = models["data"]
    assert m["id"] == "wordnet-masked" and m["diffaccel"]["presets"] == ["default", "none"]
    assert m["diffaccel"]["batch_invariant"] and m["diffaccel"]["requests_share_batches"]
    body = {"model": "wordnet-masked", "prompt": "a dog", "n": 2, "seed": 7}
    r = _post(server, body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "text_completion" and out["model"] == "wordnet-masked"
    assert [c["index"] for c in out["choices"]] == [0, 1]
    assert out["diffaccel"]["seeds"] == [7, 8] and out["diffaccel"]["preset"] == "default"
    assert out["diffaccel"]["fraction_computed"] < 1.0  # swd skipped positions
    (offline,) = offline_payloads(config, "text", [body])
    assert [c["text"] for c in out["choices"]] == offline
    assert offline[0] != offline[1]


def diffaccel_tokenizer(config: str):
    """The served model's tokenizer, loaded here as generate loads it."""
    import diffaccel
    from diffaccel.runtime.adapters_registry import get_adapter

    return get_adapter("text").load(diffaccel.load_config(config)).tokenizer


def test_usage_counts_the_prompt_and_the_generated_tokens(server, config):
    prompt_tokens = len(diffaccel_tokenizer(config).encode("a dog is"))
    assert prompt_tokens > 0
    for body, prompt in (({"prompt": "a dog is", "n": 3, "seed": 1, "max_tokens": 24}, prompt_tokens),
                         ({"prompt": "", "n": 1, "seed": 1}, 0)):
        r = _post(server, body)
        assert r.status_code == 200, r.text
        generated = body["n"] * (body.get("max_tokens", 32) - prompt)  # max_tokens counts the prompt
        assert r.json()["usage"] == {"prompt_tokens": prompt, "completion_tokens": generated,
                                     "total_tokens": prompt + generated}


def test_requests_batched_together_equal_their_single_runs(server, config):
    bodies = [{"prompt": "", "n": 1, "seed": 3}, {"prompt": "a dog", "n": 2, "seed": 100},
              {"prompt": "", "n": 1, "seed": 3}, {"prompt": "the cat is", "n": 3, "seed": 9},
              {"prompt": "", "n": 2, "seed": 3, "diffaccel": {"preset": "none"}}]
    responses = asyncio.run(_burst(server, bodies))
    assert [r.status_code for r in responses] == [200] * 5, [r.text for r in responses]
    out = [r.json() for r in responses]
    # the four default-preset requests shared one batch of 7 rows; the other preset ran apart
    assert [o["diffaccel"]["batch_rows"] for o in out] == [7, 7, 7, 7, 2]
    texts = [[c["text"] for c in o["choices"]] for o in out]
    offline = offline_payloads(config, "text", bodies[:4])
    assert texts[:4] == offline
    assert texts[0] == texts[2]  # the same seed alone and next to others
    (plain,) = offline_payloads(str(_write(config, MODEL)), "text", [bodies[4]])
    assert texts[4] == plain  # preset none: the model without strategies
    solo = [_post(server, b).json() for b in bodies[1:2]]
    assert solo[0]["diffaccel"]["batch_rows"] == 2 and [c["text"] for c in solo[0]["choices"]] == texts[1]


def _write(config, text):
    from pathlib import Path

    p = Path(config).with_name("plain.toml")
    p.write_text(text)
    return p


BAD = [
    ({"prompt": "", "nonsense": 1}, "nonsense", "unknown field"),
    ({"n": 0}, "n", "greater than or equal to 1"),
    ({"n": 9}, "n", "limit of 8 (--max-n)"),  # --max-n defaults to --max-batch
    ({"n": "2"}, "n", "valid integer"),
    ({"seed": -1}, "seed", "greater than or equal to 0"),
    ({"temperature": -0.5}, "temperature", "greater than or equal to 0"),
    ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ({"max_tokens": 100000}, "max_tokens", "exceeds the model's"),
    ({"prompt": 5}, "prompt", "valid string"),
    ({"stream": True}, "stream", "not supported"),
    ({"diffaccel": {"preset": "turbo"}}, "diffaccel.preset", "allowed: default, none"),
    ({"diffaccel": {"steps": 0}}, "diffaccel.steps", "greater than or equal to 1"),
    ({"diffaccel": {"stepz": 3}}, "diffaccel.stepz", "unknown field"),
]


@pytest.mark.parametrize("body,param,words", BAD, ids=[b[1] for b in BAD])
def test_bad_requests_are_400_naming_the_field(server, body, param, words):
    r = _post(server, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert words in err["message"] and err["message"].startswith(param)


def test_malformed_bodies_unknown_models_and_paths(server):
    r = httpx.post(f"{server.url}/v1/completions", content=b'{"prompt": "a",', timeout=10,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("malformed JSON body")
    r = httpx.post(f"{server.url}/v1/completions", content=b"[1, 2]", timeout=10, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = _post(server, {"model": "gpt-4"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found" and r.json()["error"]["param"] == "model"
    r = _post(server, {"prompt": "x"}, path="/v1/images/generations")
    assert r.status_code == 400 and "/v1/completions" in r.json()["error"]["message"]
    r = httpx.get(f"{server.url}/v1/nothing", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    # a prompt that fills the sample is refused by the adapter: 400 for it alone, in a batch too
    long, fine = {"prompt": "a dog is an animal", "max_tokens": 3}, {"prompt": "", "seed": 5}
    bad, good = asyncio.run(_burst(server, [long, fine]))
    prompt_tokens = len(diffaccel_tokenizer(server.config).encode(long["prompt"]))
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
    assert bad.json()["error"]["message"] == (f"max_tokens: a prompt fills all 3 positions (it is {prompt_tokens} tokens); "
                                              f"use a length of at least {prompt_tokens + 1}")
    assert good.status_code == 200 and good.json()["choices"][0]["text"] == _post(server, fine).json()["choices"][0]["text"]


def test_metrics_parse_and_count_what_happened(server):
    before = parse(httpx.get(f"{server.url}/metrics", timeout=10).text)
    asyncio.run(_burst(server, [{"seed": s} for s in range(3)] + [{"seed": 1, "diffaccel": {"preset": "none"}}, {"n": 0}]))
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    after = parse(text)
    ok = 'diffaccel_requests_total{endpoint="/v1/completions",status="200"}'
    bad = 'diffaccel_requests_total{endpoint="/v1/completions",status="400"}'
    assert after[ok] - before.get(ok, 0) == 4 and after[bad] - before.get(bad, 0) == 1
    assert after["diffaccel_batch_rows_count"] - before["diffaccel_batch_rows_count"] == 2  # 3 rows + 1 row
    assert after["diffaccel_batch_rows_sum"] - before["diffaccel_batch_rows_sum"] == 4
    assert after['diffaccel_skipped_compute_fraction{preset="default"}'] > 0.2
    assert after['diffaccel_skipped_compute_fraction{preset="none"}'] == 0.0
    assert after["diffaccel_queue_depth"] == 0 and after['diffaccel_errors_total{type="invalid_request_error"}'] >= 1
    latency = 'diffaccel_request_latency_seconds_count{endpoint="/v1/completions"}'
    assert after[latency] - before[latency] == 5
    assert after['diffaccel_request_latency_seconds_bucket{endpoint="/v1/completions",le="+Inf"}'] == after[latency]
    for line in text.splitlines():  # every family has its HELP and TYPE before its samples
        if line.startswith("# TYPE"):
            assert line.split()[3] in ("counter", "gauge", "histogram")
    assert json.loads(httpx.get(f"{server.url}/health", timeout=10).text)["queue_depth"] == 0


def test_stream_is_refused_for_a_model_without_blocks(server):
    """The official client's ``stream=True`` on a masked model without blocks (all its tokens
    finish together): one 400 naming ``stream``, before anything is queued."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="wordnet-masked", prompt="a dog", stream=True)
    assert e.value.status_code == 400 and e.value.body["param"] == "stream"
    assert "finish all tokens together" in e.value.body["message"]
