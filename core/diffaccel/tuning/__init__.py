"""``diffaccel tune``: the tuner (``tuner``), its report, the search (optuna), budgets and the
TOML it writes. The function is ``diffaccel.tune``.

This package took the name of the old module ``diffaccel.tuning`` (now ``diffaccel.tuning.tuner``):
its names still resolve here, with a DeprecationWarning, until 0.3.
"""

from .._moved import old_names

__getattr__ = old_names(__name__, "diffaccel.tuning.tuner")
