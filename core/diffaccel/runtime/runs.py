"""One run setup: a config's model loaded through its adapter, its strategies built against the
model's facts, applied for each generation. Every command, the bench, tune, serve and the plugins'
commands set up runs through ``Run``, so that there is one order of these steps::

    run = diffaccel.Run("configs/text-swd.toml")     # the config read and checked; nothing loaded
    out = run.generate(seed=0)                       # loads the model, builds and applies the strategies
    print(run.summary(out))                          # what the run did, in one line

The steps, in order, each done once (the model and the strategies are kept for later generations):

1. ``Run(config)``: the config (a path or a ``RunConfig``) read and validated, its adapter found
   (an entry point of the ``diffaccel.adapters`` group). Nothing heavy yet: a command checks its
   output paths here, before minutes of loading.
2. ``run.pipe``: the adapter loads the model (``adapter.load(config)``), unless a loaded pipeline
   was given (``Run(config, pipe=pipe)``).
3. ``run.strategies``: the config's ``[[strategy]]`` tables built in order with the model's facts
   (``adapter.info(pipe)``: each strategy's ``diffaccel_setup``). ``run.build(other)`` builds
   another config's strategies on the same model (bench entries, serve presets).
4. ``run.apply(...)`` / ``run.generate(...)``: the strategies attached for one generation
   (``diffaccel.apply``: the config's ``on_error`` keys and ``[guard]`` table apply), removed after.
5. ``out.report`` / ``run.last_report`` / ``run.summary(out)``: what the strategies did.

``run.load()`` does steps 2 and 3 at once (where a load must fail early, as under ``accelerate
launch``); ``run.check()`` does step 3 with the model's facts read from its config files, no
weights (``diffaccel check``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .accelerator import Applied, apply, build_strategies
from .adapters_registry import get_adapter
from .config import RunConfig, load_config
from .registry import Registry


class Run:
    """A config's model and strategies, set up once and run any number of times.

    ``config``: a path or a ``RunConfig``; ``registry``: the plugins (default: every installed
    one, ``Registry()``); ``pipe``: a pipeline already loaded for this config's ``[model]`` (it is
    then not loaded again). Errors are the usual one-line ``DiffaccelError``s: an unreadable config
    or unknown adapter here, a model that does not load at ``pipe``/``load()``, a strategy that
    refuses the model at ``strategies``/``load()``.
    """

    def __init__(self, config: str | RunConfig, *, registry: Registry | None = None, pipe: Any = None):
        self.registry = registry if registry is not None else Registry()
        self.config: RunConfig = config if isinstance(config, RunConfig) else load_config(config, self.registry)
        """The run's config: its ``[model]``, its strategies and their policies."""
        self.adapter = get_adapter(self.config.model.adapter)
        """The adapter driving the model (``diffaccel.contract.adapter.Adapter``)."""
        self.last_report: dict[str, Any] | None = None
        """The report of the last ``generate`` (the output's ``.report``), None before the first."""
        self._pipe = pipe
        self._info: dict[str, Any] | None = None
        self._strategies: list[Any] | None = None
        self._used: list[Any] | None = None

    @property
    def pipe(self) -> Any:
        """The model's pipeline, loaded by the adapter on first use."""
        if self._pipe is None:
            self._pipe = self.adapter.load(self.config)
        return self._pipe

    @property
    def info(self) -> dict[str, Any]:
        """The model's facts (``adapter.info(pipe)``: capabilities, vocabulary, layers...), which
        strategies are built against."""
        if self._info is None:
            self._info = self.adapter.info(self.pipe)
        return self._info

    @property
    def strategies(self) -> list[Any]:
        """The config's strategies, built in config order against the model's facts on first use."""
        if self._strategies is None:
            self._strategies = self.build(self.config)
        return self._strategies

    def load(self) -> Run:
        """Load the model and build the strategies now (both are otherwise done on first use);
        returns the run."""
        self.strategies  # noqa: B018 - loads the pipeline on the way
        return self

    def build(self, config: RunConfig) -> list[Any]:
        """The strategies of another config for this run's model (a bench entry, a serve preset,
        a tuning trial): built and set up against the same facts, in that config's order."""
        return build_strategies(config, self.registry, self.info)

    def check(self) -> bool:
        """Build the strategies against the model's facts read from its config files, no weights
        (the adapter's optional ``facts``): what ``generate`` would refuse, refused now, as the
        same one-line ``ConfigError``. False if the adapter has no ``facts`` (nothing was built)."""
        facts = getattr(self.adapter, "facts", None)
        if facts is None:
            return False
        build_strategies(self.config, self.registry, facts(self.config))
        return True

    def apply(self, config: RunConfig | None = None, *, strategies: Sequence[Any] | None = None) -> Applied:
        """``diffaccel.apply`` on the run's pipeline: ``with run.apply() as pipe: ...``.

        ``config``: this generation's config, a variant of the run's (another seed, batch or
        prompt), whose ``on_error`` keys and ``[guard]`` apply; default the run's. ``strategies``:
        ready strategy instances (from ``build``, or a plugin's probe); default the run's own."""
        chosen = self.strategies if strategies is None else list(strategies)
        return apply(self.pipe, config if config is not None else self.config, strategies=chosen, registry=self.registry)

    def generate(self, seed: int | None = None, *, config: RunConfig | None = None,
                 strategies: Sequence[Any] | None = None, progress: bool = False, **inputs: Any) -> Any:
        """One generation with the strategies applied (``apply``'s ``config`` and ``strategies``);
        ``seed`` defaults to the config's ``[model] seed``; ``inputs``: more of the adapter's
        ``run`` arguments (serve's ``seeds``, one per row). Returns the adapter's output
        (``.texts`` or ``.images``, and ``.report``)."""
        cfg = config if config is not None else self.config
        self._used = self.strategies if strategies is None else list(strategies)
        with self.apply(cfg, strategies=self._used):
            out = self.adapter.run(self.pipe, cfg, cfg.model.seed if seed is None else seed, progress=progress,
                                   **inputs)
        self.last_report = getattr(out, "report", None)
        return out

    def summary(self, out: Any = None) -> str:
        """One line: the checkpoint, the steps run, the strategies and what they computed and
        skipped, then each strategy's ``summary`` metric where it reports one (of ``out``'s
        report, default the last generation's; the strategies named are
        those of the last ``generate``)."""
        report = out.report if out is not None else self.last_report
        if report is None:
            raise ValueError("Run.summary: nothing has run yet; call generate() first")
        c = report["counters"]
        names = ", ".join(s.name for s in (self._used if self._used is not None else self.strategies)) or "none"
        line = (f"{self.config.model.checkpoint}, {report['steps_run']} steps, strategies: {names}; layers computed "
                f"{c['layers_computed']}, skipped {c['layers_skipped']}, positions computed {c['fraction_computed']:.0%}")
        # a strategy's own one-line account of the run (a cost gate's verdict), where it left one
        notes = [m["summary"] for m in report.get("strategies", {}).values()
                 if isinstance(m, dict) and isinstance(m.get("summary"), str)]
        return "; ".join([line, *notes])

    def __repr__(self) -> str:
        loaded = "loaded" if self._pipe is not None else "not loaded"
        return f"Run({self.config.source!r}, adapter={self.adapter.name!r}, {loaded})"
