"""The load tests' clients (``loadtest``, ``faults``): well-behaved requests driven from
concurrent httpx clients, the server's RSS, and the offline run a response must equal."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any


def request_bodies(kind: str, prompts: list[str], seed: int, count: int) -> list[dict[str, Any]]:
    prompts = prompts or [""]
    return [{"prompt": prompts[i % len(prompts)], "n": 1, "seed": seed + i} for i in range(count)]


async def drive(url: str, path: str, bodies: list[dict[str, Any]], clients: int, time_limit: float,
                headers: dict[str, str] | None = None) -> dict[str, Any]:
    """Post every body from ``clients`` concurrent clients; per request: status, latency, payload."""
    import httpx

    results: list[dict[str, Any] | None] = [None] * len(bodies)
    next_index = iter(range(len(bodies)))
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client(http: httpx.AsyncClient) -> None:
        for i in next_index:
            t0 = time.perf_counter()
            try:
                r = await http.post(path, json=bodies[i])
                body = r.json()
                kind = body["error"]["type"] if r.status_code >= 400 and isinstance(body, dict) and "error" in body else None
                results[i] = {"status": r.status_code, "seconds": time.perf_counter() - t0, "error": kind,
                              "payload": _payload(body) if r.status_code == 200 else None,
                              "batch_rows": body.get("diffaccel", {}).get("batch_rows") if r.status_code == 200 else None}
            except (httpx.HTTPError, ValueError) as exc:
                results[i] = {"status": None, "seconds": time.perf_counter() - t0, "error": type(exc).__name__, "payload": None}

    async with httpx.AsyncClient(base_url=url, timeout=time_limit, limits=limits, headers=headers) as http:
        t0 = time.perf_counter()
        tasks = [asyncio.ensure_future(client(http)) for _ in range(clients)]
        done, pending = await asyncio.wait(tasks, timeout=time_limit)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        wall = time.perf_counter() - t0
    return {"wall_s": wall, "results": [r or {"status": None, "seconds": None, "error": "timeout", "payload": None} for r in results]}


def _payload(body: dict[str, Any]) -> Any:
    if "choices" in body:
        return [c["text"] for c in body["choices"]]
    return [d["b64_json"] for d in body["data"]]


def rss_mb(pid: int) -> float:
    """Resident memory of a process (Linux /proc), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def offline_payloads(config: str, kind: str, bodies: list[dict[str, Any]]) -> list[Any]:
    """What ``diffaccel generate --seed SEED`` gives for each body (batch 1, the config's strategies)."""
    import attrs

    from ..runtime.runs import Run
    from .app import png_bytes

    import base64

    run = Run(config)
    cfg = run.config
    out = []
    for b in bodies:
        c = attrs.evolve(cfg, model=attrs.evolve(cfg.model, batch=b["n"], seed=b["seed"]),
                         options=attrs.evolve(cfg.options, prompts=[b["prompt"]]))
        o = run.generate(b["seed"], config=c)
        out.append(list(o.texts) if kind == "text" else [base64.b64encode(png_bytes(img)).decode("ascii") for img in o.images])
    return out
