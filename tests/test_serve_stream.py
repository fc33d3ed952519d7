"""``stream: true`` on ``diffaccel serve``: block-wise text models send each committed block as an
OpenAI ``text_completion`` chunk (server-sent events). Checked with the official ``openai`` client
against real servers on 127.0.0.1: the shipped wordnet-masked model with the masked sampler in
blocks of 8 (swd as the default preset), and a tiny random DiffusionGemma (blocks of 16); the
engine's observer in-process; a client that leaves mid-stream."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time

import httpx
import openai
import pytest

from diffaccel.serve.launch import start_server
from diffaccel.serve.metrics import parse
from diffaccel.serve.stream import Chunks, TextDeltas, events

MASKED = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 32\nsteps = 16\nblock_size = 8\n'
ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def masked_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("stream") / "blocks.toml"
    path.write_text(MASKED + '[[strategy]]\nuse = "swd"\n')
    return str(path)


@pytest.fixture(scope="module")
def server(masked_config):
    s = start_server(masked_config, "--max-batch", "4", "--batch-window-ms", "50", env=ENV)
    yield s
    # SIGTERM drains and ends it (uvicorn re-raises the signal after its shutdown: -15); a worker or
    # task left waiting would hold it until stop() kills it (-9)
    assert s.stop() in (0, -signal.SIGTERM), s.log()[-2000:]
    assert "Traceback" not in s.log() and "Task was destroyed" not in s.log(), s.log()[-3000:]


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _by_row(chunks) -> dict[int, list]:
    rows: dict[int, list] = {}
    for c in chunks:
        for choice in c.choices:
            rows.setdefault(choice.index, []).append(choice)
    return rows


def test_streamed_blocks_join_to_the_completion_with_usage_last(server):
    client = _client(server)
    kw = {"model": "wordnet-masked", "prompt": "a dog", "n": 2, "seed": 7}
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    plain = client.completions.create(**kw)
    assert {c.id for c in chunks} == {chunks[0].id} and {c.object for c in chunks} == {"text_completion"}
    rows = _by_row(chunks)
    assert sorted(rows) == [0, 1]
    for i, choices in rows.items():
        assert "".join(c.text for c in choices) == plain.choices[i].text  # the same seed, the same text
        assert [c.finish_reason for c in choices] == [None] * (len(choices) - 1) + ["length"]
        assert sum(1 for c in choices[:-1] if c.text) >= 2  # blocks arrived before the last one
    assert chunks[-1].choices == [] and chunks[-1].usage == plain.usage  # OpenAI's usage chunk
    assert all(c.usage is None for c in chunks[:-1])


def test_without_include_usage_no_usage_chunk(server):
    chunks = list(_client(server).completions.create(model="wordnet-masked", prompt="", seed=1, stream=True))
    assert chunks and all(c.choices for c in chunks) and chunks[-1].choices[0].finish_reason == "length"


def test_the_first_block_arrives_while_the_batch_runs(server):
    """Over the wire, not only in-process: after the first chunk the batch is still generating
    (a long run: 400 steps, 100 per block)."""
    body = {"prompt": "a dog", "seed": 3, "stream": True, "diffaccel": {"steps": 400}}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        in_flight = parse(httpx.get(f"{server.url}/metrics", timeout=10).text)["diffaccel_rows_in_flight"]
        rest = [line for line in lines if line.startswith("data: ")]
    assert '"finish_reason":null' in first and in_flight == 1
    assert rest[-1] == "data: [DONE]"


def test_a_client_that_leaves_mid_stream_stops_its_batch_and_the_server_goes_on(server):
    before = parse(httpx.get(f"{server.url}/metrics", timeout=10).text)["diffaccel_stopped_batches_total"]
    body = {"prompt": "a cat", "seed": 5, "stream": True, "diffaccel": {"steps": 400}}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as r:
        next(line for line in r.iter_lines() if line.startswith("data: "))
    deadline = time.monotonic() + 60  # the 400-step batch stops at its next step instead
    while time.monotonic() < deadline:
        m = parse(httpx.get(f"{server.url}/metrics", timeout=10).text)
        if m["diffaccel_stopped_batches_total"] > before and m["diffaccel_rows_in_flight"] == 0:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the batch of the client that left did not stop")
    after = _client(server).completions.create(model="wordnet-masked", prompt="a cat", seed=5)
    assert after.choices[0].text.startswith("a cat")


def test_one_block_runs_and_bad_stream_options_are_refused(server):
    client = _client(server)
    with pytest.raises(openai.BadRequestError) as e:  # max_tokens within one block: nothing to stream early
        client.completions.create(model="wordnet-masked", prompt="", max_tokens=8, stream=True)
    assert e.value.body["param"] == "stream" and "block by block" in e.value.body["message"]
    r = httpx.post(f"{server.url}/v1/completions", json={"stream_options": {"include_usage": True}}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"
    r = httpx.post(f"{server.url}/v1/completions", json={"stream": True, "temperature": -1.0}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"  # the field at fault, not stream


@pytest.mark.parametrize("steps", [16, 2])  # 2 steps over 4 blocks: two blocks get none (finalize fills them)
def test_the_engine_hears_each_block_as_it_commits(masked_config, tmp_path, steps):
    from diffaccel.serve.engine import Batch, Engine, StreamCommits, Work

    path = tmp_path / "e.toml"
    path.write_text(MASKED.replace("steps = 16", f"steps = {steps}"))
    engine = Engine(str(path), max_batch=2)
    assert engine.block_length({}) == 8 and engine.block_length({"length": 8}) is None
    heard: list[dict[int, str]] = []
    batch = Batch(Work("text", "default"), ["a dog", ""], [3, 4])
    out = engine.run(batch, threading.Event(), StreamCommits(heard.append, {1}))
    assert out.texts == engine.run(batch, threading.Event()).texts  # observing changes nothing (serve runs have a stop)
    texts = [h[1] for h in heard]
    assert all(set(h) == {1} for h in heard)  # only the rows asked for
    if steps == 16:
        assert len(texts) == 3  # blocks 0, 1, 2 during the run; the last one is the output
    else:
        assert len(texts) == 1  # blocks 0 and 1; the blocks given no steps wait for finalize
    assert all(b.startswith(a) and b != a for a, b in zip(texts, texts[1:]))
    assert all(out.texts[1].startswith(t) for t in texts)


def test_text_deltas_hold_back_the_word_at_a_block_edge():
    d = TextDeltas(1)
    assert d.delta(0, "the dog '") == "the dog"  # "'" may join the next block's "s"
    assert d.delta(0, "the dog's bo") == "'s"
    assert d.delta(0, "the dog's bone \ufffd") == " bone"
    assert d.rest(0, "the dog's bone\u00e9 ok") == "\u00e9 ok"
    e = TextDeltas(1)
    e.delta(0, "a b c")
    assert e.sent[0] == "a b" and e.rest(0, "a b c d") == " c d"
    f = TextDeltas(1)
    f.delta(0, "x y")
    assert f.rest(0, "x'y") == "'y"  # an edge decoded otherwise in context: the rest after the common start


def test_a_batch_that_fails_after_a_block_was_sent_ends_with_an_error_event():
    """The status line is gone by then: OpenAI's error event, which the client raises."""
    from diffaccel.serve.batcher import Job
    from diffaccel.serve.engine import RequestError, Work

    class Client:  # a client that stays
        async def receive(self):
            await asyncio.Event().wait()

    class Batcher:
        cancelled: list = []

        def cancel(self, job):
            self.cancelled.append(job)

    async def scenario() -> list[str]:
        job = Job(Work("text", "default"), ["p"], [1], asyncio.get_running_loop().create_future(), stream=asyncio.Queue())
        job.stream.put_nowait((0, "a dog is a"))
        job.future.set_exception(RequestError(500, "boom at step 9", "strategy_error", code="bad"))
        return [e async for e in events(Client(), Batcher(), job, None, Chunks("m", False), lambda rows: (None, {}), False)]

    block, error = (json.loads(e[len("data: "):]) for e in asyncio.run(scenario()))
    assert block["choices"] == [{"index": 0, "text": "a dog is", "logprobs": None, "finish_reason": None}]
    assert error == {"error": {"message": "boom at step 9", "type": "strategy_error", "param": None, "code": "bad"}}
    assert Batcher.cancelled == []  # its batch had ended: nothing to cancel


@pytest.fixture(scope="module")
def gemma_server(tmp_path_factory):
    from diffaccel.adapters.text.families.diffusion_gemma.build import build

    root = tmp_path_factory.mktemp("dg-stream")
    ckpt = build(root / "tiny", "tiny", seed=0)
    config = root / "dg.toml"
    config.write_text(f'[model]\nadapter = "text"\ncheckpoint = "{ckpt}"\nsampler = "block"\nlength = 48\nsteps = 4\n')
    s = start_server(config, "--max-batch", "2", env=ENV)
    yield s
    assert s.stop() in (0, -signal.SIGTERM), s.log()[-2000:]


def test_diffusion_gemma_streams_its_canvases(gemma_server):
    client = _client(gemma_server)
    model = client.models.list().data[0].id
    chunks = list(client.completions.create(model=model, prompt="a dog", seed=3, stream=True,
                                            stream_options={"include_usage": True}))
    plain = client.completions.create(model=model, prompt="a dog", seed=3)
    (choices,) = _by_row(chunks).values()
    assert "".join(c.text for c in choices) == plain.choices[0].text
    assert sum(1 for c in choices[:-1] if c.text) >= 1  # blocks 1 and 2 of 3 before the end
    assert chunks[-1].usage == plain.usage
