"""The load test with faults: ``diffaccel serve-loadtest CONFIG --faults`` (docs/serve.md).

One batching server on 127.0.0.1 (``--max-batch``, ``--batch-window-ms``), started with a random
API key (``DIFFACCEL_API_KEY``), the load test's ``--request-timeout`` and small body, ``n`` and
prompt limits (``server_options``). Half of ``--requests`` are well-behaved (one row each, seeds
``--seed ..``, the config's prompts cycled, from ``--clients`` concurrent httpx clients); they run
twice: alone, then alongside the other half, faulty requests (``KINDS``) from ``--fault-clients``
concurrent raw connections: clients that close while their request waits or runs and mid-stream,
slow and stalled senders, malformed JSON, bodies over the limit, a wrong or no API key, too many
rows, a prompt over the limit. The config must stream (a block-wise text model:
configs/serve-text-short-blocks.toml).

Every connection goes to 127.0.0.1 and every loop ends by itself: a fixed list of requests, a
timeout on every connect and read, ``--time-limit`` per pass. Checks: every faulty request gets
its kind's status; the server's count of answered requests equals the requests sent (none lost);
no answer later than the timeout plus ``SLACK_S`` (none hung); every well-behaved response the
same with and without the faulty clients, and ``--offline K`` of them equal to the offline run of
their seed; the server idle at the end; its RSS growth over the mixed pass within
``--rss-limit-mb``. Reported: p50/p99 of the well-behaved requests in both passes, each kind's
statuses, and the RSS before and after the mixed requests.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import secrets
import statistics
import time
from typing import Any

import attrs

from .launch import HOST, start_server
from .loadclients import drive, offline_payloads, request_bodies, rss_mb
from .metrics import parse

SLACK_S = 5.0
"""Seconds past ``--request-timeout`` an answer may take before it counts as hung."""
BODY_LIMIT, PROMPT_LIMIT, MAX_N = 16384, 4096, 4
"""The fault server's ``--max-body-bytes``, ``--max-prompt-bytes`` and ``--max-n`` (at most ``--max-batch``)."""
KINDS: dict[str, tuple[float, frozenset, str]] = {
    "disconnect_waiting": (0.20, frozenset({None, 200}), "valid; closes 0.05-1.5 s after sending, waiting or mid-batch"),
    "disconnect_stream": (0.12, frozenset({200}), "stream: true; closes after the first chunk"),
    "slow_body": (0.08, frozenset({200}), "valid body sent in 8 pieces over 1.4 s"),
    "stalled_body": (0.04, frozenset({408}), "half its body, then nothing"),
    "malformed": (0.12, frozenset({400}), "truncated JSON"),
    "oversized": (0.12, frozenset({413}), "body over --max-body-bytes (declared, or chunked)"),
    "wrong_key": (0.12, frozenset({401}), "a wrong API key"),
    "no_key": (0.08, frozenset({401}), "no API key"),
    "too_many_rows": (0.06, frozenset({400}), "n above --max-n"),
    "long_prompt": (0.06, frozenset({400}), "prompt above --max-prompt-bytes"),
}
"""Per faulty kind: its share of the faulty requests, the statuses it may get (None: it left
before its answer), what it does."""


@attrs.frozen
class Ctx:
    """What the faulty clients need to know of the server."""

    port: int
    key: str
    wait_s: float
    """How long a faulty client waits for a status: the timeout plus ``SLACK_S``."""
    seed: int
    max_n: int


def server_options(a, max_n: int) -> list[str]:
    return ["--max-batch", str(a.max_batch), "--batch-window-ms", str(a.batch_window_ms),
            "--queue", str(max(64, 2 * (a.clients + a.fault_clients))), "--request-timeout", str(a.request_timeout),
            "--max-body-bytes", str(BODY_LIMIT), "--max-n", str(max_n), "--max-prompt-bytes", str(PROMPT_LIMIT),
            "--max-streams-per-client", str(a.fault_clients + 1)]


def fault_kinds(count: int, seed: int) -> list[str]:
    """``count`` kinds in the shares of ``KINDS`` (each at least once when ``count`` allows), in
    a shuffled (seeded) order."""
    least = 1 if count >= 2 * len(KINDS) else 0
    kinds = [k for k, (share, _, _) in KINDS.items() for _ in range(max(least, int(share * count)))][:count]
    kinds += [next(iter(KINDS))] * (count - len(kinds))
    random.Random(seed).shuffle(kinds)
    return kinds


def _body(c: Ctx, i: int, **fields: Any) -> bytes:
    return json.dumps({"prompt": "a dog", "n": 1, "seed": c.seed + i, **fields}).encode()


def _head(key: str | None, length: int | None, chunked: bool = False) -> bytes:
    lines = ["POST /v1/completions HTTP/1.1", f"Host: {HOST}", "Content-Type: application/json", "Connection: close",
             "Transfer-Encoding: chunked" if chunked else f"Content-Length: {length}"]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _connect(c: Ctx):
    return await asyncio.wait_for(asyncio.open_connection(HOST, c.port), 10.0)


async def _status(reader, wait_s: float) -> int | None:
    line = await asyncio.wait_for(reader.readline(), wait_s)
    parts = line.split()
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None


async def _send(c: Ctx, data: bytes, key: str | None = "", wait_s: float | None = None) -> int | None:
    """A whole request (headers and ``data``) and its status."""
    reader, writer = await _connect(c)
    try:
        writer.write(_head(c.key if key == "" else key, len(data)) + data)
        await writer.drain()
        return await _status(reader, c.wait_s if wait_s is None else wait_s)
    finally:
        writer.close()


async def disconnect_waiting(c: Ctx, i: int) -> int | None:
    try:  # answered before it left (a fast batch), or None: it closed while waiting or mid-batch
        return await _send(c, _body(c, i), wait_s=random.Random(c.seed + i).uniform(0.05, 1.5))
    except TimeoutError:
        return None


async def disconnect_stream(c: Ctx, i: int) -> int | None:
    reader, writer = await _connect(c)
    try:
        data = _body(c, i, stream=True)
        writer.write(_head(c.key, len(data)) + data)
        await writer.drain()
        status = await _status(reader, c.wait_s)
        for _ in range(100):  # the headers, then the first chunk: then it leaves
            line = await asyncio.wait_for(reader.readline(), c.wait_s)
            if not line or line.startswith(b"data:"):
                break
        return status
    finally:
        writer.close()


async def _partial(c: Ctx, head: bytes, pieces: list[bytes], pause_s: float, wait_s: float) -> int | None:
    reader, writer = await _connect(c)
    try:
        writer.write(head)
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(pause_s)
        return await _status(reader, wait_s)
    finally:
        writer.close()


async def slow_body(c: Ctx, i: int) -> int | None:
    data = _body(c, i)
    step = -(-len(data) // 8)
    return await _partial(c, _head(c.key, len(data)), [data[k:k + step] for k in range(0, len(data), step)], 0.2, c.wait_s)


async def stalled_body(c: Ctx, i: int) -> int | None:
    data = _body(c, i)
    return await _partial(c, _head(c.key, len(data)), [data[:len(data) // 2]], 0.0, c.wait_s)


async def oversized(c: Ctx, i: int) -> int | None:
    if i % 2 == 0:  # declared: refused on its headers, after 1 KiB of the body
        return await _partial(c, _head(c.key, 4 * BODY_LIMIT), [b" " * 1024], 0.0, c.wait_s)
    chunk = b" " * 4096  # chunked, no length said: refused once the bytes pass the limit
    pieces = [b"%x\r\n%s\r\n" % (len(chunk), chunk)] * (BODY_LIMIT // len(chunk) + 1)
    return await _partial(c, _head(c.key, None, chunked=True), pieces, 0.0, c.wait_s)


FAULTS = {
    "disconnect_waiting": disconnect_waiting, "disconnect_stream": disconnect_stream, "slow_body": slow_body,
    "stalled_body": stalled_body, "oversized": oversized,
    "malformed": lambda c, i: _send(c, b'{"prompt": "a dog", "n": '),
    "wrong_key": lambda c, i: _send(c, _body(c, i), key="wrong-" + c.key[:4]),
    "no_key": lambda c, i: _send(c, _body(c, i), key=None),
    "too_many_rows": lambda c, i: _send(c, _body(c, i, n=c.max_n + 1)),
    "long_prompt": lambda c, i: _send(c, _body(c, i, prompt="a " * (PROMPT_LIMIT // 2 + 8))),
}


async def _one(c: Ctx, kind: str, i: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        status, error = await FAULTS[kind](c, i), None
    except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:  # no status: a refused or hung connection
        status, error = None, type(exc).__name__
    return {"kind": kind, "status": status, "error": error, "seconds": time.perf_counter() - t0}


async def faulty(c: Ctx, kinds: list[str], clients: int, time_limit: float) -> list[dict[str, Any]]:
    """Every faulty request, from ``clients`` concurrent connections, within ``time_limit``."""
    results: list[dict[str, Any] | None] = [None] * len(kinds)
    order = iter(range(len(kinds)))

    async def client() -> None:
        for i in order:
            results[i] = await _one(c, kinds[i], i)

    tasks = [asyncio.ensure_future(client()) for _ in range(clients)]
    _, pending = await asyncio.wait(tasks, timeout=time_limit)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return [r or {"kind": kinds[i], "status": None, "error": "time_limit", "seconds": None} for i, r in enumerate(results)]


def _answered(url: str, headers: dict[str, str]) -> dict[str, float]:
    """The server's ``/v1/completions`` answers so far, by status."""
    import httpx

    samples = parse(httpx.get(f"{url}/metrics", headers=headers, timeout=30).text)
    prefix = 'diffaccel_requests_total{endpoint="/v1/completions",status="'
    out = {k[len(prefix):-2]: v for k, v in samples.items() if k.startswith(prefix)}
    out["_idle"] = float(samples["diffaccel_queue_depth"] == 0 and samples["diffaccel_rows_in_flight"] == 0)
    return out


def _settle(url: str, headers: dict[str, str], before: dict[str, float], sent: int, wait_s: float) -> dict[str, float]:
    """The answers counted since ``before``, once they reach ``sent`` (a closed client's request is
    counted when its handler ends) or after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        now = _answered(url, headers)
        delta = {k: v - before.get(k, 0.0) for k, v in now.items() if k != "_idle" and v - before.get(k, 0.0)}
        if (sum(delta.values()) >= sent and now["_idle"]) or time.monotonic() > deadline:
            return {**delta, "_idle": now["_idle"]}
        time.sleep(0.5)


def good_summary(run: dict[str, Any]) -> dict[str, Any]:
    ok = [r["seconds"] for r in run["results"] if r["status"] == 200]
    q = statistics.quantiles(ok, n=100, method="inclusive") if len(ok) >= 2 else [ok[0] if ok else float("nan")] * 99
    return {"ok": len(ok), "p50_s": q[49], "p99_s": q[98], "max_s": max(ok, default=float("nan")), "wall_s": run["wall_s"],
            "not_ok": len(run["results"]) - len(ok)}


def run(a) -> dict[str, Any]:
    import httpx

    from ..runtime.config import load_config

    key, max_n = secrets.token_urlsafe(24), min(MAX_N, a.max_batch)
    good_n = a.requests // 2
    env = {"DIFFACCEL_API_KEY": key, **({"OMP_NUM_THREADS": str(a.threads)} if a.threads else {})}
    server = start_server(a.config, *server_options(a, max_n), env=env, timeout=900)  # a loaded machine starts slowly
    headers = {"Authorization": f"Bearer {key}"}
    try:
        url, pid = server.url, server.process.pid
        assert url.startswith(f"http://{HOST}:"), url  # faulty traffic goes to this machine only
        bodies = request_bodies("text", list(getattr(load_config(a.config).options, "prompts", []) or []), a.seed, good_n)
        asyncio.run(drive(url, "/v1/completions", request_bodies("text", [], a.seed + good_n, a.clients), a.clients,
                          a.time_limit, headers))  # the first requests' one-off costs, before RSS is read
        rss = {"after_warmup": rss_mb(pid)}
        clean = asyncio.run(drive(url, "/v1/completions", bodies, a.clients, a.time_limit, headers))
        rss["before_mixed"] = rss_mb(pid)
        before = _answered(url, headers)
        ctx = Ctx(int(url.rsplit(":", 1)[1]), key, a.request_timeout + SLACK_S, a.seed + 10 * a.requests, max_n)
        kinds = fault_kinds(a.requests - good_n, a.seed)

        async def mixed():
            return await asyncio.gather(drive(url, "/v1/completions", bodies, a.clients, a.time_limit, headers),
                                        faulty(ctx, kinds, a.fault_clients, a.time_limit))

        good, bad = asyncio.run(mixed())
        answered = _settle(url, headers, before, a.requests, a.request_timeout + 2 * SLACK_S)
        rss["after_mixed"] = rss_mb(pid)
    finally:
        server.stop()
    report = {"config": a.config, "requests": a.requests, "good": good_n, "faulty": len(kinds), "clients": a.clients,
              "fault_clients": a.fault_clients, "max_batch": a.max_batch, "batch_window_ms": a.batch_window_ms,
              "request_timeout_s": a.request_timeout, "limits": {"max_body_bytes": BODY_LIMIT, "max_n": max_n,
                                                                  "max_prompt_bytes": PROMPT_LIMIT},
              "machine": {"cpus": os.cpu_count(), "omp_threads": a.threads or os.environ.get("OMP_NUM_THREADS"),
                          "python": platform.python_version(), "note": a.note},
              "clean": good_summary(clean), "mixed": good_summary(good), "rss_mb": rss,
              "server_answers": {k: int(v) for k, v in answered.items() if k != "_idle"}}
    report["kinds"] = tally(bad)
    return check(a, report, bodies, clean, good, bad, bool(answered["_idle"]))


def tally(bad: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind: requests sent, statuses got (``closed`` where the client left first, the error's
    name where it got none), the slowest, and how many got a status it should not."""
    kinds: dict[str, Any] = {}
    for r in bad:
        k = kinds.setdefault(r["kind"], {"sent": 0, "statuses": {}, "max_s": 0.0, "unexpected": 0})
        k["sent"] += 1
        got = str(r["status"]) if r["status"] is not None else (r["error"] or "closed")
        k["statuses"][got] = k["statuses"].get(got, 0) + 1
        k["max_s"] = max(k["max_s"], r["seconds"] or float("inf"))
        k["unexpected"] += int(r["status"] not in KINDS[r["kind"]][1] or r["error"] is not None)
    return kinds


def check(a, report: dict[str, Any], bodies, clean, good, bad, idle: bool) -> dict[str, Any]:
    same = sum(1 for x, y in zip(clean["results"], good["results"]) if x["payload"] is not None and x["payload"] == y["payload"])
    k = min(a.offline, len(bodies))
    picks = sorted({round(i * (len(bodies) - 1) / max(1, k - 1)) for i in range(k)}) if k else []
    offline = offline_payloads(a.config, "text", [bodies[i] for i in picks]) if picks else []
    slowest = max([r["seconds"] or float("inf") for r in good["results"] + clean["results"] + bad])
    c = {"good_answered": report["clean"]["ok"] == report["mixed"]["ok"] == len(bodies),
         "same_with_faults": same, "offline_checked": len(picks),
         "offline_equal": sum(1 for i, o in zip(picks, offline) if good["results"][i]["payload"] == o),
         "faults_as_expected": sum(k["unexpected"] for k in report["kinds"].values()) == 0,
         "none_lost": sum(report["server_answers"].values()) == a.requests, "slowest_s": slowest,
         "none_hung": slowest <= a.request_timeout + SLACK_S, "idle_after": idle,
         "rss_growth_ok": report["rss_mb"]["after_mixed"] - report["rss_mb"]["before_mixed"] <= a.rss_limit_mb}
    c["passed"] = bool(c["good_answered"] and same == len(bodies) and c["offline_equal"] == len(picks)
                       and c["faults_as_expected"] and c["none_lost"] and c["none_hung"] and idle and c["rss_growth_ok"])
    report["checks"] = c
    return report


def markdown(report: dict[str, Any], command: str) -> str:
    """The figures as a Markdown section of docs/serve.md (generated, never typed)."""
    m, c, rss = report["machine"], report["checks"], report["rss_mb"]
    lines = [f"Command: `{command}`", "",
             f"{report['requests']} requests to one server (max batch {report['max_batch']}, window "
             f"{report['batch_window_ms']:g} ms, --request-timeout {report['request_timeout_s']:g} s, an API key, "
             f"--max-body-bytes {report['limits']['max_body_bytes']}, --max-n {report['limits']['max_n']}, --max-prompt-bytes "
             f"{report['limits']['max_prompt_bytes']}): {report['good']} well-behaved (one row each) from {report['clients']} "
             f"clients, run alone and then alongside {report['faulty']} faulty ones from {report['fault_clients']} "
             f"connections; {m['cpus']} CPUs, OMP_NUM_THREADS={m['omp_threads']}" + (f"; {m['note']}" if m["note"] else "") + ".",
             "", "| well-behaved requests | answered 200 | p50 (s) | p99 (s) | slowest (s) | wall (s) |", "|---|---:|---:|---:|---:|---:|"]
    for name, s in (("alone", report["clean"]), ("with the faulty clients", report["mixed"])):
        lines.append(f"| {name} | {s['ok']} of {report['good']} | {s['p50_s']:.2f} | {s['p99_s']:.2f} | {s['max_s']:.2f} | {s['wall_s']:.1f} |")
    lines += ["", "| faulty request | what it does | sent | expected | got | slowest (s) |", "|---|---|---:|---|---|---:|"]
    for kind, k in report["kinds"].items():
        expected = ", ".join(sorted("closed" if s is None else str(s) for s in KINDS[kind][1]))
        got = ", ".join(f"{s}: {n}" for s, n in sorted(k["statuses"].items()))
        lines.append(f"| {kind} | {KINDS[kind][2]} | {k['sent']} | {expected} | {got} | {k['max_s']:.2f} |")
    answers = ", ".join(f"{s}: {n}" for s, n in sorted(report["server_answers"].items()))
    lines += ["", f"The server answered {sum(report['server_answers'].values())} of the {report['requests']} mixed requests "
              f"({answers}; 499: the client had left): none lost: {'yes' if c['none_lost'] else 'NO'}. Slowest answer "
              f"{c['slowest_s']:.2f} s against the {report['request_timeout_s']:g} s timeout: none hung: "
              f"{'yes' if c['none_hung'] else 'NO'}.",
              f"{c['same_with_faults']} of {report['good']} well-behaved responses are the same with and without the faulty "
              f"clients; {c['offline_equal']} of {c['offline_checked']} checked equal the offline run of their seed.",
              f"Server RSS: {rss['after_warmup']:.1f} MB after warm-up, {rss['before_mixed']:.1f} MB before the mixed "
              f"requests, {rss['after_mixed']:.1f} MB after ({rss['after_mixed'] - rss['before_mixed']:+.1f} MB). "
              f"All checks {'passed' if c['passed'] else 'FAILED'}."]
    return "\n".join(lines) + "\n"
