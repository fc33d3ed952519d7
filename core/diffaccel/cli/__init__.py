"""The ``diffaccel`` command line: the entry point and parser (``entry``), the command registry
(``commands``), the examples, the output checks and the smaller tools. The top layer.

This package took the name of the old module ``diffaccel.cli`` (now ``diffaccel.cli.entry``):
its names still resolve here, with a DeprecationWarning, until 0.3.
"""

from .._moved import old_names

__getattr__ = old_names(__name__, "diffaccel.cli.entry")
