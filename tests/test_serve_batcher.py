"""The batcher alone, with an engine that only records its batches: when a batch forms."""

from __future__ import annotations

import asyncio
import threading
import time
import types

from diffaccel.serve.batcher import Batcher
from diffaccel.serve.engine import Work
from diffaccel.serve.metrics import Metrics

WORK = Work(kind="text", preset="default")


class _Engine:
    """Runs a batch in ``run_s`` seconds and records its rows."""

    warmup_s, cross_batch = 0.1, True

    def __init__(self, run_s: float):
        self.run_s, self.batches = run_s, []

    def run(self, batch, stop: threading.Event):
        self.batches.append(len(batch.seeds))
        time.sleep(self.run_s)
        return types.SimpleNamespace(texts=[f"row {s}" for s in batch.seeds], report={})


def test_clients_answered_by_a_batch_join_the_requests_queued_while_it_ran():
    """Closed loop: 8 clients send again as soon as they are answered, while 8 others queued
    during the batch. Counting the window from the worker's free time puts both in the next batch
    (16 rows); counted from the oldest request's arrival, the queued 8 would go alone and the two
    cohorts would alternate in batches of 8 for good."""

    async def scenario() -> list[int]:
        engine = _Engine(run_s=0.4)
        batcher = Batcher(engine, Metrics(16), max_batch=16, window_s=0.1, queue=64)
        batcher.start()

        async def client(seed: int, again: bool) -> None:
            await batcher.submit(WORK, ["p"], [seed]).future
            if again:  # the answered client's next request, a moment later
                await asyncio.sleep(0.005)
                await batcher.submit(WORK, ["p"], [seed + 100]).future

        first = [asyncio.create_task(client(s, True)) for s in range(8)]
        await asyncio.sleep(0.25)  # the first batch (8 rows) formed after the window and is running
        queued = [asyncio.create_task(client(s, False)) for s in range(8, 16)]
        await asyncio.gather(*first, *queued)
        await batcher.stop()
        return engine.batches

    assert asyncio.run(scenario()) == [8, 16]


def test_a_request_past_its_deadline_in_the_queue_gets_504_and_is_never_run():
    async def scenario():
        engine = _Engine(run_s=0.6)
        metrics = Metrics(4)
        batcher = Batcher(engine, metrics, max_batch=1, window_s=0.0, queue=8, timeout_s=0.3)
        batcher.start()
        busy = batcher.submit(WORK, ["p"], [1], deadline=time.monotonic() + 60)  # runs 0.6 s
        waiting = batcher.submit(WORK, ["p"], [2, 3])  # default deadline: 0.3 s, still queued then
        outcomes = await asyncio.gather(busy.future, waiting.future, return_exceptions=True)
        await batcher.stop()
        return engine, metrics, outcomes, batcher

    engine, metrics, (busy, waiting), batcher = asyncio.run(scenario())
    assert busy.texts() == ["row 1"]
    assert waiting.status == 504 and waiting.code == "request_timeout" and "waiting for a batch" in waiting.message
    assert engine.batches == [1]  # the expired request's two rows were never computed
    assert metrics.timed_out_requests == 1 and metrics.dropped_rows == 2 and not batcher.pending


def test_a_request_that_times_out_mid_batch_leaves_the_others_rows_as_they_would_be_alone(tmp_path):
    """The real text model: two requests share a batch; one is expired while the batch runs; the
    other's text equals the offline run of its seed, and the batch was not stopped."""
    from diffaccel.serve.engine import Engine
    from diffaccel.serve.loadtest import offline_payloads

    config = tmp_path / "text.toml"
    config.write_text('[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 32\nsteps = 96\n')
    engine = Engine(str(config), max_batch=2)

    async def scenario():
        metrics = Metrics(2)
        batcher = Batcher(engine, metrics, max_batch=2, window_s=0.05, queue=8)
        batcher.start()
        late, kept = batcher.submit(WORK, ["a dog"], [11]), batcher.submit(WORK, ["a dog"], [12])
        while not batcher.running:  # the batch of both has started
            await asyncio.sleep(0.005)
        batcher.expire(late)
        outcomes = await asyncio.gather(late.future, kept.future, return_exceptions=True)
        await batcher.stop()
        return outcomes, metrics

    (late, kept), metrics = asyncio.run(scenario())
    assert late.status == 504 and "still running" in late.message
    assert kept.texts() == offline_payloads(str(config), "text", [{"prompt": "a dog", "n": 1, "seed": 12}])[0]
    assert metrics.stopped_batches == 0 and metrics.timed_out_requests == 1
