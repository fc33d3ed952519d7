"""The model side of ``diffaccel serve``: the pipeline and the strategy presets, loaded once, and
one batch of rows run exactly as ``diffaccel generate`` runs it.

A batch is one adapter ``run`` of several requests' rows. Each row keeps the seed it would have
alone (request seed ``s`` with ``n`` rows: ``s .. s+n-1``, as ``generate --seed s`` with
``batch = n``), passed to the adapter as ``seeds=[...]``; strategies keep their state per batch row
(``diffaccel.contract.state``) and start afresh at every run. So a response is the same whatever it was
batched with (tests/test_serve.py checks it bitwise).

That needs the model's numbers to be batch-invariant: a row computed the same whatever the batch
size. Matrix products over many rows are on the CPU (the text models: rows x positions), but not
every kernel is (the digits UNet's rows differ by ~1e-5 between a batch of 1 and of 2 on one CPU,
and between 1 and 3 but not 2 on another: the kernels' blocking follows the batch size and the CPU's
vector units). The warm-up checks it at every batch size the server can form: a row alone against
the same row last in a batch of 2, 3 .. ``max_batch`` rows, each a full run (a shorter run is no
proof: on the digits UNet one step gave equal images at every size, two steps did not). Where any
differs,
or where the adapter's ``run`` takes no ``seeds`` (its rows share one random stream), each
request is generated as its own batch (``generate`` with ``batch = n``), unless the server was
started with ``--batch-inexact`` (rows then differ from ``generate`` by float rounding).

The core knows no adapter by name: it talks to the adapter through ``diffaccel.contract.adapter.Adapter``
and reads outputs through two structural protocols (``TextRows``, ``ImageRows``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import attrs

from ..contract.adapter import StreamsBlocks
from ..contract.errors import ConfigError, DiffaccelError, ModelError, NonFiniteError, StrategyError
from ..contract.hookspecs import hookimpl
from ..runtime.runs import Run
from ..runtime.config import RunConfig, load_config
from ..runtime.registry import Registry

NO_STRATEGIES = "none"
"""The preset every server offers: the model with no strategy (the baseline)."""
DEFAULT_PRESET = "default"
"""The preset of the served config's own ``[[strategy]]`` tables."""
FIELDS = {"length": "max_tokens", "temperature": "temperature", "steps": "diffaccel.steps"}
"""A config key a request sets, by the request field that sets it (errors name the field)."""


@runtime_checkable
class TextRows(Protocol):
    """An output served by ``/v1/completions``: one decoded text per batch row."""

    texts: list[str]
    report: dict[str, Any]


@runtime_checkable
class ImageRows(Protocol):
    """An output served by ``/v1/images/generations``: a (rows, C, H, W) tensor in [0, 1]."""

    images: Any
    report: dict[str, Any]


class RequestError(Exception):
    """A request the server refuses or cannot finish: an OpenAI-style error response."""

    def __init__(self, status: int, message: str, type: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@attrs.frozen
class Work:
    """What one request asks for, besides its rows: requests with equal ``Work`` share a batch."""

    kind: str
    """``text`` or ``image``: the endpoint."""
    preset: str
    model: tuple[tuple[str, Any], ...] = ()
    """``[model]`` keys set by the request (``steps``)."""
    options: tuple[tuple[str, Any], ...] = ()
    """Adapter options set by the request (``length``, ``temperature``)."""


@attrs.define(eq=False)
class Batch:
    """One adapter run: the rows of several requests of equal ``Work``."""

    work: Work
    prompts: list[str]
    seeds: list[int]


@attrs.frozen
class Preset:
    name: str
    config: RunConfig
    strategies: list[Any]


class Engine:
    """The loaded model and presets; ``run`` generates one batch. Not thread-safe: the server
    calls it from one worker thread."""

    def __init__(self, config_path: str, presets: dict[str, str] | None = None, batch_inexact: bool = False,
                 max_batch: int = 2):
        self.registry = Registry()
        cfg = load_config(config_path, self.registry)
        configs = {DEFAULT_PRESET: cfg}
        for name, path in (presets or {}).items():
            if name in (DEFAULT_PRESET, NO_STRATEGIES):
                raise ConfigError(f"--preset {name}={path}: '{name}' is taken (the served config's strategies are "
                                  f"'{DEFAULT_PRESET}', no strategy is '{NO_STRATEGIES}'); choose another name")
            other = load_config(path, self.registry)
            if (other.model, other.options) != (cfg.model, cfg.options):
                raise ConfigError(f"{other.source}: [model] differs from {cfg.source}'s; a preset must serve the same model")
            configs[name] = other
        configs[NO_STRATEGIES] = attrs.evolve(cfg, strategies=[])
        self.config = cfg
        self.setup = Run(cfg, registry=self.registry)
        """The run setup: the model loaded once, every preset's strategies built against its facts."""
        self.adapter, self.pipe, self.info = self.setup.adapter, self.setup.pipe, self.setup.info
        self.presets = {name: Preset(name, c, self.setup.build(c)) for name, c in configs.items()}
        self.model_id = cfg.model.checkpoint
        self.option_names = {f.name for f in attrs.fields(type(cfg.options))} if attrs.has(type(cfg.options)) else set()
        self.row_seeds = True
        self.kind, self.image_shape, self.warmup_s, self.batch_invariant = self._warm_up(max_batch)
        """``warmup_s``: seconds of the last warm-up batch (the first guess of a batch's pace)."""
        self.cross_batch = self.row_seeds and (self.batch_invariant or batch_inexact)
        """Whether requests share batches (else each request is one batch of its own rows)."""

    def _warm_up(self, max_batch: int) -> tuple[str, tuple[int, ...] | None, float, bool]:
        """Before the server opens: pays the first run's one-off costs, and finds what the
        adapter's outputs are, whether its ``run`` takes per-row ``seeds`` and whether a row is
        the same alone and in a batch (the module's docstring)."""
        seed = self.config.model.seed
        prompt = self.config.options.prompts[0] if getattr(self.config.options, "prompts", None) else ""
        work = Work("?", NO_STRATEGIES)
        t0 = time.perf_counter()
        try:
            alone = self.run(Batch(work, [prompt], [seed]))
        except TypeError as exc:  # the adapter's pipeline has no ``seeds`` keyword: one request per batch
            if "seeds" not in str(exc):
                raise
            self.row_seeds = False
            alone = self.run(Batch(work, [prompt], [seed]))
        seconds = time.perf_counter() - t0
        if isinstance(alone, TextRows):
            kind, shape = "text", None
        elif isinstance(alone, ImageRows):
            kind, shape = "image", tuple(alone.images.shape[1:])
        else:
            raise DiffaccelError(f"{self.config.source}: the '{self.adapter.name}' adapter's outputs have neither 'texts' nor "
                                 "'images' (one per row); diffaccel serve cannot answer with them")
        invariant = False
        if self.row_seeds:
            t0 = time.perf_counter()
            pair = self.run(Batch(work, [prompt, prompt], [seed + 1, seed]))
            seconds = time.perf_counter() - t0  # a batch's pace, without the first run's imports
            invariant = _same_row(alone, pair, 1) and self._invariant_up_to(max_batch, alone, prompt, seed)
        return kind, shape, seconds, invariant

    def _invariant_up_to(self, max_batch: int, alone: Any, prompt: str, seed: int) -> bool:
        """Whether a row alone equals the same row last in batches of 3 .. ``max_batch`` rows."""
        if max_batch < 3:
            return True
        work = Work("?", NO_STRATEGIES)
        for rows in range(3, max_batch + 1):
            batch = self.run(Batch(work, [prompt] * rows, [*range(seed + 1, seed + rows), seed]))
            if not _same_row(alone, batch, rows - 1):
                return False
        return True

    def check_keys(self, model: dict[str, Any], options: dict[str, Any]) -> None:
        """A request's ``[model]`` keys and adapter options through the config's own validators:
        ``ConfigValueError`` (``key``, ``message``) before the request is queued."""
        attrs.evolve(self.config.model, **model)
        if options:
            attrs.evolve(self.config.options, **options)

    def batch_config(self, batch: Batch) -> RunConfig:
        """The config of one batch: the preset's, with the request's keys, one prompt per row."""
        base = self.presets[batch.work.preset].config
        model = attrs.evolve(base.model, batch=len(batch.seeds), seed=batch.seeds[0], **dict(batch.work.model))
        options = base.options
        if "prompts" in self.option_names:
            options = attrs.evolve(options, prompts=list(batch.prompts))
        if batch.work.options:
            options = attrs.evolve(options, **dict(batch.work.options))
        return attrs.evolve(base, model=model, options=options)

    def block_length(self, options: dict[str, Any]) -> int | None:
        """Positions per streamed block of a request with these adapter options, or None when its
        run finishes every position together (the adapter is no ``StreamsBlocks``, or says so)."""
        if not isinstance(self.adapter, StreamsBlocks):
            return None
        cfg = self.config
        if options:
            cfg = attrs.evolve(cfg, options=attrs.evolve(cfg.options, **options))
        return self.adapter.block_length(self.pipe, cfg)

    def run(self, batch: Batch, stop: threading.Event | None = None, stream: "StreamCommits | None" = None) -> Any:
        """Generate ``batch``; raises ``StrategyError``, ``NonFiniteError``, ``ValueError`` (the
        adapter refused a row's input) or whatever the model raised. Once ``stop`` is set (every
        client of the batch went away), the run ends at its next step through ``run.stop``, as a
        strategy would end it: the steps left are not computed and the output is discarded.
        ``stream`` hears of each block as it commits (streamed requests)."""
        preset = self.presets[batch.work.preset]
        cfg = self.batch_config(batch)
        extra = {"seeds": list(batch.seeds)} if self.row_seeds else {}
        strategies = [*preset.strategies, *([StopWhenSet(stop)] if stop is not None else []), *([stream] if stream else [])]
        out = self.setup.generate(batch.seeds[0], config=cfg, strategies=strategies, **extra)  # on_error, [guard]
        if isinstance(out, ImageRows) and not bool(out.images.isfinite().all()):
            raise NonFiniteError("the generated images hold NaN or inf values", step=-1)
        return out


def _same_row(alone: Any, batch: Any, row: int) -> bool:
    """Whether row 0 of ``alone`` and row ``row`` of ``batch`` are bitwise equal."""
    if isinstance(alone, TextRows):
        return alone.texts[0] == batch.texts[row]
    return bool(alone.images[0].equal(batch.images[row]))


class StopWhenSet:
    """Ends a run at its next step once ``event`` is set: the server's way to stop a batch whose
    clients all went away. Only ``pre_step``: it plans nothing, so outputs are unchanged until then."""

    name = "serve-stop"

    def __init__(self, event: threading.Event):
        self.event = event

    @hookimpl
    def diffaccel_pre_step(self, run) -> None:
        if self.event.is_set():
            run.stop = True


class StreamCommits:
    """Hands the text of newly committed blocks to ``sink`` (``{row: the row's final text so
    far}``, rows of ``rows`` only), read from the adapter's ``run.info.extra["committed"]``
    (``StreamsBlocks``) at each step, in the worker thread. Only ``pre_step``, planning nothing:
    outputs are unchanged; the last block arrives with the output itself."""

    name = "serve-stream"

    def __init__(self, sink: Callable[[dict[int, str]], None], rows: set[int]):
        self.sink, self.rows = sink, rows
        self.seen: dict[int, int] = {}

    @hookimpl
    def diffaccel_pre_step(self, run) -> None:
        committed = run.info.extra.get("committed")
        if committed is None:
            return
        grown = [r for r in self.rows if r < len(committed.counts) and committed.counts[r] > self.seen.get(r, 0)]
        if grown:
            self.seen.update((r, committed.counts[r]) for r in grown)
            self.sink({r: committed.text(r) for r in grown})


def error_of(exc: BaseException) -> RequestError:
    """The error response of a batch that raised."""
    first = (str(exc).strip().splitlines() or [""])[0]
    if isinstance(exc, StrategyError):
        return RequestError(500, first, "strategy_error", code=exc.strategy)
    if isinstance(exc, NonFiniteError):
        return RequestError(500, f"non-finite output: {first}", "non_finite_output")
    if isinstance(exc, ModelError):  # the model's own computation raised (an out-of-memory in a layer, say)
        return RequestError(500, first, "model_error")
    if isinstance(exc, ValueError):  # the adapter refused this request's input (e.g. a prompt longer than max_tokens)
        field = FIELDS.get(getattr(exc, "key", None) or "")  # the option it names, where it names one
        return RequestError(400, f"{field}: {first}" if field else first or type(exc).__name__, "invalid_request_error",
                            param=field)
    return RequestError(500, f"{type(exc).__name__}: {first}", "server_error")
