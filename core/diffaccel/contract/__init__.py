"""What a strategy plugin or an adapter is written against: the hooks (``hookspecs``), the run
state (``state``: ``RunState``, ``RunInfo``, ``Layer``, ``StepPlan``, ``Counters``; ``reliability``),
``Strategy`` (``strategy``), the capabilities, the adapter protocols (``adapter``), the errors and
the config validators. The lowest layer: it imports no other part of diffaccel.

The names most plugins need are also at the top, ``diffaccel.Strategy``, ``diffaccel.hookimpl``.
"""
