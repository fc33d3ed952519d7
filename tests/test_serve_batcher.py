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
