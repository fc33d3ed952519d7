"""Request batching for ``diffaccel serve``: a bounded queue on the event loop, one worker thread.

Requests wait in ``pending`` (at most ``queue`` of them: past it ``submit`` refuses with 503 and
``Retry-After``). The batching task takes the oldest request, waits until ``window`` seconds after
its arrival, or after the worker became free if that is later, for more requests of the same
``Work`` (or until ``max_batch`` rows are there), and hands their rows to the engine as one batch
in the worker thread; while a batch runs, new requests queue up. Counting the window from when the
worker is free lets the clients just answered, who send their next request within milliseconds,
join the requests that queued meanwhile: without it, 16 clients answered in turn settle into two
cohorts of 8 that never share a batch (measured: 8.2 rows per batch at 16 clients). Requests of other
``Work`` stay queued, in order, for later batches. A request is never split over batches.

A request whose client went away before its batch starts is dropped from the queue (its rows are
never computed). Once its batch runs, an adapter run cannot give back single rows: if every
request of the running batch has gone away, the batch stops at its next step (``run.stop``, the
steps left are never computed); if some remain, the gone requests' rows finish with the batch and
are discarded. A request still waiting or running at its deadline (``--request-timeout`` after it
arrived) is answered 504 and leaves the same way: dropped from the queue, or its rows discarded
from the running batch (the others' rows are computed as before: a row never depends on the
batch's other rows), and the batch stopped if nobody else waits on it. ``drain`` (SIGTERM) refuses
every queued request with 503 ``shutting_down`` and lets the running batch finish and answer.

A streamed request (``stream: true``, ``stream.py``) is batched like any other; its job carries a
queue, and the batch runs with an observer (``engine.StreamCommits``) that puts each of its rows'
committed text there as blocks commit, from the worker thread through the loop.
"""

from __future__ import annotations

import asyncio
import functools
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs

from .engine import Batch, Engine, RequestError, StreamCommits, Work, error_of
from .metrics import Metrics


@attrs.define(eq=False)
class Job:
    """One request's rows, waiting for (or in) a batch."""

    work: Work
    prompts: list[str]
    seeds: list[int]
    future: asyncio.Future
    arrived: float = attrs.Factory(time.monotonic)
    rows_in_batch: int = 0
    """Rows of the batch it ran in (the response reports it)."""
    stream: asyncio.Queue | None = None
    """A streamed request's queue: ``(row, the row's final text so far)`` as its blocks commit."""

    @property
    def rows(self) -> int:
        return len(self.seeds)


class Batcher:
    def __init__(self, engine: Engine, metrics: Metrics, *, max_batch: int, window_s: float, queue: int,
                 timeout_s: float | None = None):
        self.engine, self.metrics = engine, metrics
        self.max_batch, self.window_s, self.queue, self.timeout_s = max_batch, window_s, queue, timeout_s
        self.pending: list[Job] = []
        self.draining = False
        self.running: list[Job] = []
        self._stop = threading.Event()  # set when every client of the running batch went away
        self.last_batch_s = engine.warmup_s
        self.free_since = time.monotonic()  # when the worker last finished a batch
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diffaccel-serve")
        self._task: asyncio.Task | None = None

    # -- the event loop's side ------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="diffaccel-batcher")

    async def stop(self) -> None:
        """After the server stopped taking requests: wait for the running batch, end the task."""
        self.drain()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._executor.shutdown(wait=True)

    def submit(self, work: Work, prompts: list[str], seeds: list[int], stream: asyncio.Queue | None = None,
               deadline: float | None = None) -> Job:
        """Queue a request (503 past ``queue``). At ``deadline`` (``time.monotonic()``; default:
        ``timeout_s`` from now) a job not yet answered is answered 504 (``expire``)."""
        if self.draining:
            raise RequestError(503, "the server is shutting down; retry on another instance", "server_shutting_down",
                               code="shutting_down")
        if len(self.pending) >= self.queue:
            raise RequestError(503, f"the queue is full ({self.queue} requests waiting); retry after the Retry-After seconds",
                               "server_overloaded", code="queue_full", headers={"Retry-After": str(self.retry_after())})
        loop = asyncio.get_running_loop()
        job = Job(work, prompts, seeds, loop.create_future(), stream=stream)
        if deadline is None and self.timeout_s is not None:
            deadline = job.arrived + self.timeout_s
        if deadline is not None:  # one timer per request, cancelled when it is answered
            timer = loop.call_later(max(0.0, deadline - time.monotonic()), self.expire, job)
            job.future.add_done_callback(lambda _: timer.cancel())
        self.pending.append(job)
        self.metrics.queue_depth = len(self.pending)
        self._wake.set()
        return job

    def retry_after(self) -> int:
        """Seconds until the queue has likely moved: the batches ahead at the last batch's pace."""
        ahead = sum(j.rows for j in self.pending) / self.max_batch + 1
        return max(1, math.ceil(ahead * self.last_batch_s + self.window_s))

    def cancel(self, job: Job, error: RequestError | None = None) -> None:
        """The client went away (or, with ``error``, the job timed out and is answered with it):
        drop the job's rows if its batch has not started, discard them if it runs, and stop the
        batch at its next step if none of its jobs is still waiting."""
        if job in self.pending:
            self.pending.remove(job)
            self.metrics.queue_depth = len(self.pending)
            self.metrics.dropped_rows += job.rows
        if not job.future.done():
            if error is None:
                job.future.cancel()
            else:
                job.future.set_exception(error)
        if job in self.running and all(j.future.done() for j in self.running) and not self._stop.is_set():
            self._stop.set()
            self.metrics.stopped_batches += 1
            self.metrics.dropped_rows += sum(j.rows for j in self.running)

    def expire(self, job: Job) -> None:
        """The job's deadline passed before its answer: 504, and its rows leave (``cancel``)."""
        if job.future.done():
            return
        self.metrics.timed_out_requests += 1
        waited = time.monotonic() - job.arrived
        where = "running" if job in self.running else "waiting for a batch"
        limit = f" (--request-timeout {self.timeout_s:g} s)" if self.timeout_s is not None else ""
        self.cancel(job, RequestError(504, f"the request was still {where} after {waited:.1f} s{limit}; its rows were "
                                      "dropped", "timeout_error", code="request_timeout"))

    def drain(self) -> None:
        """Refuse every queued request and every new one; the running batch finishes."""
        self.draining = True
        for job in self.pending:
            if not job.future.done():
                job.future.set_exception(RequestError(
                    503, "the server is shutting down; this request was not started, retry on another instance",
                    "server_shutting_down", code="shutting_down"))
        self.pending.clear()
        self.metrics.queue_depth = 0
        self._wake.set()

    # -- batching -------------------------------------------------------------------------------
    def _take(self) -> list[Job]:
        """The oldest job and the next jobs of the same work, up to ``max_batch`` rows (one job
        when requests do not share batches: ``Engine.cross_batch``)."""
        first = self.pending[0]
        jobs, rows = [first], first.rows
        if self.engine.cross_batch:
            for job in self.pending[1:]:
                if job.work == first.work and rows + job.rows <= self.max_batch:
                    jobs.append(job)
                    rows += job.rows
        for job in jobs:
            self.pending.remove(job)
        self.metrics.queue_depth = len(self.pending)
        return jobs

    def _rows_ready(self) -> int:
        first = self.pending[0]
        return sum(j.rows for j in self.pending if j.work == first.work) if self.engine.cross_batch else self.max_batch

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self.pending:
                self._wake.clear()
                await self._wake.wait()
            deadline = max(self.pending[0].arrived, self.free_since) + self.window_s
            while self.pending and not self.draining and self._rows_ready() < self.max_batch:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), left)
                except TimeoutError:
                    break
            if not self.pending:  # every waiting client went away (or drain refused them)
                continue
            jobs = self._take()
            try:
                await self._run(loop, jobs)
            except Exception as exc:  # noqa: BLE001 - a fault here must not stop the batching: its requests get a 500
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(error_of(exc))
            self.free_since = time.monotonic()

    async def _run(self, loop, jobs: list[Job]) -> None:
        work = jobs[0].work
        batch = Batch(work, [p for j in jobs for p in j.prompts], [s for j in jobs for s in j.seeds])
        self.running = jobs
        self._stop = threading.Event()
        self.metrics.rows_in_flight = len(batch.seeds)
        t0 = time.perf_counter()
        try:
            stream = _stream(loop, jobs)  # passed only when some request streams
            run = functools.partial(self.engine.run, batch, self._stop, **({"stream": stream} if stream else {}))
            out = await loop.run_in_executor(self._executor, run)
        except Exception as exc:  # noqa: BLE001 - every failure becomes the batch's error responses
            out, error = None, exc
        else:
            error = None
        finally:
            if not self._stop.is_set():  # a stopped batch's time says nothing of a batch's pace
                self.last_batch_s = time.perf_counter() - t0
            self.metrics.rows_in_flight = 0
            self.running = []
        if error is not None and isinstance(error, ValueError) and len(jobs) > 1:
            # the adapter refused an input: find whose by running each request alone, so that one
            # bad request does not fail the others
            for job in jobs:
                if not job.future.done():  # a job that timed out (or whose client left) meanwhile is not rerun
                    await self._run(loop, [job])
            return
        if self._stop.is_set():  # stopped part-way: nobody is left to answer
            return
        report = getattr(out, "report", None) if out is not None else None
        self.metrics.batch_done(work.preset, len(batch.seeds), (report or {}).get("counters"))
        at = 0
        for job in jobs:
            job.rows_in_batch = len(batch.seeds)
            if job.future.done():  # its client went away while the batch ran
                at += job.rows
                continue
            if error is not None:
                job.future.set_exception(error_of(error))
            else:
                job.future.set_result(_Rows(out, at, job.rows))
            at += job.rows


def _stream(loop: asyncio.AbstractEventLoop, jobs: list[Job]) -> StreamCommits | None:
    """The observer that passes committed blocks to the batch's streamed jobs, or None. Its sink
    runs in the worker thread: it only schedules ``put_nowait`` on the loop (an unbounded queue,
    so a slow or gone client never blocks the batch)."""
    owners: dict[int, tuple[Job, int]] = {}  # batch row -> (its job, the row in the job)
    at = 0
    for job in jobs:
        if job.stream is not None:
            owners.update((at + i, (job, i)) for i in range(job.rows))
        at += job.rows
    if not owners:
        return None

    def sink(texts: dict[int, str]) -> None:
        for row, text in texts.items():
            job, i = owners[row]
            if not job.future.done():  # its client is still there (a stale read only costs a put)
                try:
                    loop.call_soon_threadsafe(job.stream.put_nowait, (i, text))
                except RuntimeError:  # the loop has closed (the server stopped): nobody reads it
                    return

    return StreamCommits(sink, set(owners))


@attrs.frozen
class _Rows:
    """A job's share of a batch's output: rows ``start .. start+count-1``."""

    output: Any
    start: int
    count: int

    def texts(self) -> list[str]:
        return list(self.output.texts[self.start:self.start + self.count])

    def images(self) -> Any:
        return self.output.images[self.start:self.start + self.count]

    def token_counts(self) -> tuple[int, int] | None:
        """(the prompt's tokens, the tokens generated over the job's rows): each row's positions
        past its prompt (``tokens`` holds the prompt too). None when the adapter's output has no
        ``tokens`` and ``prompt_lengths``."""
        tokens, prompts = getattr(self.output, "tokens", None), getattr(self.output, "prompt_lengths", None)
        if tokens is None or prompts is None:
            return None
        rows = range(self.start, self.start + self.count)
        return int(prompts[self.start]), sum(int(tokens.shape[1]) - int(prompts[r]) for r in rows)

    @property
    def report(self) -> dict[str, Any]:
        return self.output.report
