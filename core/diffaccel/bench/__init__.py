"""The bench: ``runner`` (``run_bench``, the table), the prompt bench, the scale-out throughput
bench, the report and the grid of configs.

This package took the name of the old module ``diffaccel.bench`` (now ``diffaccel.bench.runner``):
its names still resolve here, with a DeprecationWarning, until 0.3.
"""

from .._moved import old_names

__getattr__ = old_names(__name__, "diffaccel.bench.runner")
