"""The server's counters, rendered in the Prometheus text exposition format (``GET /metrics``).

Hand-written rather than prometheus_client: a handful of counters, one gauge and two histograms
in a format of a few lines each (https://prometheus.io/docs/instrumenting/exposition_formats/),
not worth a dependency. Every value is updated on the event loop's thread, so no lock is needed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""Seconds from a request's arrival to its response."""


class Histogram:
    def __init__(self, buckets: Iterable[float]):
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, b in enumerate(self.buckets):
            if value <= b:
                self.counts[i] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        sep = "," if labels else ""
        out = [f'{name}_bucket{{{labels}{sep}le="{_num(b)}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        tail = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{tail} {_num(self.sum)}", f"{name}_count{tail} {self.count}"]
        return out


class Metrics:
    """What ``/metrics`` reports; the engine and the app update it."""

    def __init__(self, max_batch: int):
        self.requests: dict[tuple[str, int], int] = defaultdict(int)  # (endpoint, status) -> count
        self.errors: dict[str, int] = defaultdict(int)  # error type -> count
        self.queue_depth = 0
        self.rows_in_flight = 0
        self.batch_rows = Histogram(range(1, max_batch + 1))
        self.latency: dict[str, Histogram] = {}
        # per preset: layer calls and positions, computed and in all (RunState counters)
        self.compute: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.dropped_rows = 0
        self.stopped_batches = 0
        self.timed_out_requests = 0

    def request_done(self, endpoint: str, status: int, seconds: float, error_type: str | None = None) -> None:
        self.requests[(endpoint, status)] += 1
        if error_type is not None:
            self.errors[error_type] += 1
        self.latency.setdefault(endpoint, Histogram(LATENCY_BUCKETS)).observe(seconds)

    def batch_done(self, preset: str, rows: int, counters: dict[str, float] | None) -> None:
        self.batch_rows.observe(rows)
        if counters:
            c = self.compute[preset]
            for key in ("layers_computed", "layers_skipped", "positions_computed", "positions_total"):
                c[key] += int(counters.get(key, 0))

    def render(self) -> str:
        out: list[str] = []

        def family(name: str, kind: str, help: str) -> None:
            out.extend((f"# HELP {name} {help}", f"# TYPE {name} {kind}"))

        family("diffaccel_requests_total", "counter", "HTTP requests answered, by endpoint and status code")
        for (endpoint, status), n in sorted(self.requests.items()):
            out.append(f'diffaccel_requests_total{{endpoint="{endpoint}",status="{status}"}} {n}')
        family("diffaccel_errors_total", "counter", "Error responses by OpenAI error type")
        for kind, n in sorted(self.errors.items()):
            out.append(f'diffaccel_errors_total{{type="{kind}"}} {n}')
        family("diffaccel_queue_depth", "gauge", "Requests waiting for a batch")
        out.append(f"diffaccel_queue_depth {self.queue_depth}")
        family("diffaccel_rows_in_flight", "gauge", "Rows of the batch being generated")
        out.append(f"diffaccel_rows_in_flight {self.rows_in_flight}")
        family("diffaccel_dropped_rows_total", "counter",
               "Rows dropped before or during generation: their client disconnected or their request timed out")
        out.append(f"diffaccel_dropped_rows_total {self.dropped_rows}")
        family("diffaccel_stopped_batches_total", "counter",
               "Batches stopped part-way: every request of the batch was gone (disconnected or timed out)")
        out.append(f"diffaccel_stopped_batches_total {self.stopped_batches}")
        family("diffaccel_timed_out_requests_total", "counter",
               "Requests answered 504: still waiting or running after --request-timeout seconds")
        out.append(f"diffaccel_timed_out_requests_total {self.timed_out_requests}")
        family("diffaccel_batch_rows", "histogram", "Rows per generated batch")
        out.extend(self.batch_rows.lines("diffaccel_batch_rows"))
        family("diffaccel_request_latency_seconds", "histogram", "Seconds from a request's arrival to its response")
        for endpoint, h in sorted(self.latency.items()):
            out.extend(h.lines("diffaccel_request_latency_seconds", f'endpoint="{endpoint}"'))
        family("diffaccel_layer_calls_total", "counter", "Layer calls of generated batches, computed or skipped, by strategy preset")
        family("diffaccel_skipped_compute_fraction", "gauge",
               "Share of layer positions (text) or rows (images) strategies served without computing, by preset")
        calls, fractions = [], []
        for preset, c in sorted(self.compute.items()):
            calls.append(f'diffaccel_layer_calls_total{{preset="{preset}",result="computed"}} {c["layers_computed"]}')
            calls.append(f'diffaccel_layer_calls_total{{preset="{preset}",result="skipped"}} {c["layers_skipped"]}')
            total = c["positions_total"]
            skipped = 1.0 - c["positions_computed"] / total if total else 0.0
            fractions.append(f'diffaccel_skipped_compute_fraction{{preset="{preset}"}} {_num(skipped)}')
        # a family's samples must follow its own header: put each after its HELP/TYPE lines
        i = out.index("# TYPE diffaccel_layer_calls_total counter") + 1
        out[i:i] = calls
        out.extend(fractions)
        return "\n".join(out) + "\n"


def _num(x: float) -> str:
    x = float(x)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def parse(text: str) -> dict[str, float]:
    """``{'name{labels}': value}`` of a text exposition (comments skipped); the tests and the load
    test read ``/metrics`` with it. Raises ValueError on a line that is not ``name[{...}] value``."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if not key or (("{" in key) != key.endswith("}")):
            raise ValueError(f"not a sample line: {line!r}")
        samples[key] = float(value)
    return samples
