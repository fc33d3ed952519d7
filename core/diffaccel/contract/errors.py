"""Errors that reach a user as one line (the CLI prints them and exits 2, without a traceback)."""


class DiffaccelError(Exception):
    """A user mistake: bad config, unknown plugin, missing model. ``str(e)`` is the whole message."""


class ConfigError(DiffaccelError):
    """A config file, table or key is wrong."""


class PluginError(DiffaccelError):
    """A plugin failed to load or registered something invalid."""


class ModelLoadError(DiffaccelError):
    """A model could not be loaded (missing path, no network for a hub id, wrong kind of model)."""


class ConfigValueError(ValueError):
    """Raised by config validators: ``key`` is the offending key, ``message`` says what is allowed.

    The config loader turns it into a ``ConfigError`` that names the file and table too.
    """

    def __init__(self, key: str, message: str):
        super().__init__(f"key '{key}': {message}")
        self.key = key
        self.message = message


class StrategyError(DiffaccelError):
    """A strategy's hook implementation raised (not the model, not a user mistake).

    ``strategy`` is the strategy's name, ``distribution`` and ``version`` the installed
    distribution that registered it (``-`` for one registered by hand), ``hook`` the hook without
    its ``diffaccel_`` prefix (``layer_output``), ``step`` the run's step (None outside a run).
    The original exception is ``__cause__``. The CLI prints ``str(e)`` and exits 1.
    """

    def __init__(self, strategy: str, distribution: str, version: str, hook: str, step: int | None, error: BaseException):
        where = f" at step {step}" if step is not None and step >= 0 else ""
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        super().__init__(f"strategy '{strategy}' ({distribution} {version}) raised {type(error).__name__} in {hook}{where}"
                         f"{': ' + first if first else ''}")
        self.strategy = strategy
        self.distribution = distribution
        self.version = version
        self.hook = hook
        self.step = step


class ModelError(DiffaccelError):
    """The model's own computation raised (an out-of-memory in a layer, say), also when a
    strategy's hook had called ``layer.compute``: never blamed on that strategy.

    ``checkpoint`` names the model (None when the adapter did not say), ``step`` the run's step,
    ``layer`` the layer whose ``compute`` raised. The original exception is ``__cause__``. The CLI
    prints ``str(e)`` (one line) and exits 1."""

    def __init__(self, checkpoint: str | None, adapter: str, step: int, layer: str, error: BaseException):
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        model = f"model '{checkpoint}'" if checkpoint else f"{adapter or 'the'} model"
        super().__init__(f"{model} raised {type(error).__name__} at step {step} in layer {layer}{': ' + first if first else ''}")
        self.checkpoint = checkpoint
        self.step = step
        self.layer = layer


class NonFiniteError(DiffaccelError):
    """The denoiser's output held NaN or inf at a step, with no strategy to blame (or also in the
    full recomputation). The CLI prints ``str(e)`` and exits 1."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step
