"""Load test of ``diffaccel serve``: ``diffaccel serve-loadtest CONFIG``.

Starts the server twice on 127.0.0.1, with batching (``--max-batch N``) and one request at a
time (``--max-batch 1``), and drives each with the same requests (one row each, seeds
``--seed .. --seed+R-1``, the config's prompts cycled) from ``--clients`` concurrent httpx
clients, alternating which goes first over ``--rounds``. Reports throughput, p50/p95/p99 latency,
errors by kind, batch sizes and the servers' RSS, and checks:

* no 5xx response (and no transport error) under this nominal load;
* every response equal to the offline run of its seed: the two servers' responses agree for every
  request, and ``--offline K`` of them (spread evenly) equal a ``diffaccel generate``-style run in
  this process (the config's strategies, ``batch = 1``, the request's seed);
* the batching server's RSS grows by at most ``--rss-limit-mb`` from after its first requests to
  the end.

The options are the command's (``diffaccel.cli.commands.serve_loadtest``). ``--faults`` runs the load test with misbehaving clients instead (``faults``: one server with an API
key and limits, well-behaved requests with and without faulty ones alongside).

The exit code is 0 when every check passes, 1 otherwise. ``--json`` writes the figures,
``--markdown FILE`` a section of FILE (between its markers, ``markers``) generated from them. Bounded: a fixed number of
requests, ``--time-limit`` seconds per pass (requests not done by then count as ``timeout``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

from .launch import start_server
from .loadclients import drive, offline_payloads, request_bodies, rss_mb  # noqa: F401 - the tests import offline_payloads here
from .metrics import parse


def summarize(run: dict[str, Any], rss: tuple[float, float], metrics: dict[str, float]) -> dict[str, Any]:
    res = run["results"]
    ok = [r["seconds"] for r in res if r["status"] == 200]
    errors: dict[str, int] = {}
    for r in res:
        if r["status"] != 200:
            errors[r["error"] or f"http_{r['status']}"] = errors.get(r["error"] or f"http_{r['status']}", 0) + 1
    q = statistics.quantiles(ok, n=100, method="inclusive") if len(ok) >= 2 else [ok[0]] * 99 if ok else [float("nan")] * 99
    rows = metrics.get("diffaccel_batch_rows_sum", 0.0)
    batches = metrics.get("diffaccel_batch_rows_count", 0.0)
    return {"wall_s": run["wall_s"], "ok": len(ok), "throughput_rps": len(ok) / run["wall_s"],
            "p50_s": q[49], "p95_s": q[94], "p99_s": q[98], "errors": errors,
            "status_5xx": sum(1 for r in res if r["status"] is not None and r["status"] >= 500),
            "mean_batch_rows": rows / batches if batches else None,
            "rss_mb_after_warmup": rss[0], "rss_mb_end": rss[1], "rss_growth_mb": rss[1] - rss[0]}


def run(a: argparse.Namespace) -> dict[str, Any]:
    import httpx

    env = {"OMP_NUM_THREADS": str(a.threads)} if a.threads else {}
    modes = {"batched": ["--max-batch", str(a.max_batch), "--batch-window-ms", str(a.batch_window_ms)]}
    if not a.no_single:
        modes["single"] = ["--max-batch", "1", "--batch-window-ms", "0"]
    servers = {}
    try:
        for mode, options in modes.items():  # a queue long enough for every client's request: nominal load
            servers[mode] = start_server(a.config, *options, "--queue", str(max(64, a.clients * 2)), env=env)
        first = httpx.get(f"{servers['batched'].url}/v1/models").json()["data"][0]
        kind = first["diffaccel"]["kind"]
        path = "/v1/completions" if kind == "text" else "/v1/images/generations"
        from ..runtime.config import load_config

        prompts = list(getattr(load_config(a.config).options, "prompts", []) or [])
        bodies = request_bodies(kind, prompts, a.seed, a.requests)
        warm = request_bodies(kind, prompts, a.seed + a.requests, a.clients)
        rss_start, metrics_start = {}, {}
        for mode, s in servers.items():  # the first requests of each: one-off costs before RSS is read
            asyncio.run(drive(s.url, path, warm, a.clients, a.time_limit))
            rss_start[mode] = rss_mb(s.process.pid)
            metrics_start[mode] = parse(httpx.get(f"{s.url}/metrics").text)
        passes: dict[str, list[dict[str, Any]]] = {m: [] for m in servers}
        order = list(servers)
        for r in range(a.rounds):
            for mode in (order if r % 2 == 0 else order[::-1]):
                passes[mode].append(asyncio.run(drive(servers[mode].url, path, bodies, a.clients, a.time_limit)))
        report: dict[str, Any] = {"config": a.config, "kind": kind, "requests": a.requests, "clients": a.clients,
                                  "rounds": a.rounds, "max_batch": a.max_batch, "batch_window_ms": a.batch_window_ms,
                                  "machine": {"cpus": os.cpu_count(), "omp_threads": a.threads or os.environ.get("OMP_NUM_THREADS"),
                                              "python": platform.python_version(), "note": a.note}, "modes": {}}
        for mode, s in servers.items():
            end = parse(httpx.get(f"{s.url}/metrics").text)
            metrics = {k: v - metrics_start[mode].get(k, 0.0) for k, v in end.items()}  # the measured passes only
            last = passes[mode][-1]
            combined = {"wall_s": sum(p["wall_s"] for p in passes[mode]), "results": [x for p in passes[mode] for x in p["results"]]}
            report["modes"][mode] = summarize(combined, (rss_start[mode], rss_mb(s.process.pid)), metrics)
            report["modes"][mode]["payloads"] = [x["payload"] for x in last["results"]]
    finally:
        for s in servers.values():
            s.stop()
    return finish(a, report, bodies, kind)


def finish(a, report: dict[str, Any], bodies: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    modes = report["modes"]
    batched = modes["batched"]["payloads"]
    checks: dict[str, Any] = {"no_5xx": all(m["status_5xx"] == 0 and not m["errors"] for m in modes.values())}
    if "single" in modes:
        single = modes["single"]["payloads"]
        checks["batched_equals_single"] = sum(1 for x, y in zip(batched, single) if x is not None and x == y)
        report["speedup_batched_over_single"] = modes["batched"]["throughput_rps"] / modes["single"]["throughput_rps"]
    k = min(a.offline, len(bodies))
    picks = sorted({round(i * (len(bodies) - 1) / max(1, k - 1)) for i in range(k)}) if k else []
    offline = offline_payloads(a.config, kind, [bodies[i] for i in picks]) if picks else []
    checks["offline_checked"] = len(picks)
    checks["offline_equal"] = sum(1 for i, o in zip(picks, offline) if batched[i] == o)
    checks["rss_growth_ok"] = modes["batched"]["rss_growth_mb"] <= a.rss_limit_mb
    n = a.requests
    checks["passed"] = bool(checks["no_5xx"] and checks["offline_equal"] == len(picks) and checks["rss_growth_ok"]
                            and checks.get("batched_equals_single", n) == n)
    report["checks"] = checks
    for m in modes.values():
        m.pop("payloads")
    return report


def markdown(report: dict[str, Any], command: str) -> str:
    """The figures as a Markdown section (docs/serve.md is generated from the JSON, never typed)."""
    m = report["machine"]
    lines = [f"Command: `{command}`", "",
             f"{report['requests']} {report['kind']} requests (one row each) from {report['clients']} concurrent clients, "
             f"{report['rounds']} pass(es) per server; {m['cpus']} CPUs, OMP_NUM_THREADS={m['omp_threads']}"
             + (f"; {m['note']}" if m["note"] else "") + ".", "",
             "| server | throughput (req/s) | p50 (s) | p95 (s) | p99 (s) | mean batch rows | errors | RSS growth (MB) |",
             "|---|---:|---:|---:|---:|---:|---|---:|"]
    for mode, s in report["modes"].items():
        name = f"batching (max batch {report['max_batch']}, window {report['batch_window_ms']:g} ms)" if mode == "batched" else "one at a time"
        rows = f"{s['mean_batch_rows']:.1f}" if s["mean_batch_rows"] else "-"
        errors = ", ".join(f"{k}: {v}" for k, v in s["errors"].items()) or "none"
        lines.append(f"| {name} | {s['throughput_rps']:.2f} | {s['p50_s']:.2f} | {s['p95_s']:.2f} | {s['p99_s']:.2f} | {rows} | "
                     f"{errors} | {s['rss_growth_mb']:.1f} |")
    c = report["checks"]
    lines.append("")
    if "speedup_batched_over_single" in report:
        lines.append(f"Batching raises throughput {report['speedup_batched_over_single']:.2f}x over one request at a time; "
                     f"{c['batched_equals_single']} of {report['requests']} responses are the same from both servers.")
    lines.append(f"{c['offline_equal']} of {c['offline_checked']} responses checked equal the offline run of their seed; "
                 f"no 5xx: {'yes' if c['no_5xx'] else 'NO'}; all checks {'passed' if c['passed'] else 'FAILED'}.")
    return "\n".join(lines) + "\n"


def markers(name: str) -> tuple[str, str]:
    """The lines between which ``--markdown`` writes section ``name`` (default: the config's stem)."""
    return (f"<!-- loadtest:{name}:begin (generated by diffaccel serve-loadtest --markdown) -->",
            f"<!-- loadtest:{name}:end -->")


def write_section(path: Path, name: str, section: str) -> None:
    """Replace the text between section ``name``'s markers in ``path`` (kept elsewhere as written)."""
    begin, end = markers(name)
    text = path.read_text(encoding="utf-8")
    if begin not in text or end not in text:
        raise SystemExit(f"{path}: no load test markers for section '{name}' ({begin} ... {end}) to write the figures between")
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    path.write_text(f"{head}{begin}\n{section}{end}{tail}", encoding="utf-8")


def execute(a: argparse.Namespace, command: str) -> int:
    """Run the load test the parsed options ``a`` describe; ``command`` is recorded with the figures."""
    if a.faults:
        from . import faults

        report = {"command": command, **faults.run(a)}
    else:
        report = {"command": command, **run(a)}
    text = json.dumps(report, indent=2)
    if a.json_path:
        Path(a.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json_path).write_text(text + "\n", encoding="utf-8")
    if a.markdown:
        from . import faults

        write = faults.markdown if a.faults else markdown
        write_section(Path(a.markdown), a.section or Path(a.config).stem, write(report, command))
    print(text)
    return 0 if report["checks"]["passed"] else 1
