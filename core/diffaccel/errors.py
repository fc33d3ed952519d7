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
