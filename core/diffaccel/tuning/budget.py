"""Quality budgets: ``gen_ppl<=+5%``, ``psnr>=30``, ``acc>=-0.02``, ``distinct2>=-5%``.

A budget names a quality metric the bench reports and a bound, read against the unaccelerated run
of the same seeds (the bench's baseline) or as an absolute value:

* ``+5%`` / ``-5%`` (a signed percentage): relative to the baseline's value
  (``gen_ppl<=+5%``: at most 5% above the baseline's gen_ppl);
* ``+0.02`` / ``-0.02`` (a signed number): a difference from the baseline's value
  (``acc>=-0.02``: at most 0.02 below the baseline's accuracy);
* ``30`` (an unsigned number): the value itself (``psnr>=30``).

Metrics measured *against* the baseline (PSNR, SSIM, agreement: the baseline scores itself as
identical) take absolute bounds only. ``parse`` checks an expression and, given the metrics an
adapter reports (``metrics``), that it names one of them, so a mistake is one line before any
model loads. ``Budget.check`` reads a bench entry's quality against the baseline's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ..contract.errors import ConfigError

ALIASES = {"acc": "cond_acc", "accuracy": "cond_acc", "distinct2": "distinct_2", "distinct1": "distinct_1",
           "ppl": "perplexity", "genppl": "gen_ppl"}
"""Short names accepted in expressions for the bench's quality keys."""

VS_BASELINE = frozenset({"psnr", "psnr_min", "ssim", "agreement"})
"""Keys that compare an entry with the baseline itself: only absolute bounds mean something."""

_EXPR = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|<|>)\s*([+-]?)\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(%?)\s*$")
FORMS = "METRIC<=BOUND or METRIC>=BOUND, BOUND one of +5% / -5% (relative to the baseline), +0.02 / -0.02 " \
        "(a difference from the baseline), 30 (absolute); e.g. gen_ppl<=+5%, psnr>=30, acc>=-0.02"


@attrs.frozen
class Budget:
    """One bound on one quality metric."""

    metric: str
    """The bench's quality key (aliases resolved)."""
    op: str
    """``<=``, ``>=``, ``<`` or ``>``."""
    value: float
    """The bound: a fraction for ``relative`` (0.05 for +5%), a difference for ``delta``, else the value."""
    kind: str
    """``relative``, ``delta`` or ``absolute``."""
    text: str
    """The expression as written."""

    @property
    def lower_is_better(self) -> bool:
        return self.op in ("<=", "<")

    def limit(self, baseline: float | None) -> float:
        """The bound as a value of the metric, given the baseline's value (unused for absolute bounds)."""
        if self.kind == "absolute":
            return self.value
        if baseline is None or not math.isfinite(baseline):
            raise ValueError(f"budget {self.text}: the baseline's {self.metric} is {baseline}; a relative bound needs a finite one")
        return baseline * (1 + self.value) if self.kind == "relative" else baseline + self.value

    def margin(self, value: float, baseline: float | None = None) -> float:
        """How far inside the bound ``value`` is, in the metric's units (negative: over budget)."""
        limit = self.limit(baseline)
        return limit - value if self.lower_is_better else value - limit

    def met(self, value: float | None, baseline: float | None = None) -> bool:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return False
        m = self.margin(value, baseline)
        return m > 0 if self.op in ("<", ">") else m >= 0

    def check(self, entry_quality: Mapping[str, Any], baseline_quality: Mapping[str, Any]) -> tuple[bool, float]:
        """(met, margin) of a bench entry's quality dict against the baseline entry's."""
        value, base = entry_quality.get(self.metric), baseline_quality.get(self.metric)
        if value is None:
            return False, -math.inf
        return self.met(value, base), self.margin(value, base)


def parse(expr: str, metrics: Iterable[str] | None = None) -> Budget:
    """A ``Budget`` from ``expr``; ``metrics``: the quality keys the run will report (None: any).
    Raises ``ConfigError`` (one line: the expression, what is wrong, what is allowed)."""
    m = _EXPR.match(expr or "")
    if m is None:
        raise ConfigError(f"--budget {expr!r}: not a budget; write {FORMS}")
    name, op, sign, number, pct = m.groups()
    metric = ALIASES.get(name.lower(), name.lower())
    if metrics is not None and name.lower() in set(metrics):
        metric = name.lower()  # a key reported under its own name wins over an alias (task models' acc)
    if metrics is not None:
        known = sorted(set(metrics))
        if metric not in known:
            raise ConfigError(f"--budget {expr!r}: metric '{name}' is not reported for this config; "
                              f"reported: {', '.join(known) or 'none'}")
    value = float(number)
    if pct:
        if not sign:
            raise ConfigError(f"--budget {expr!r}: a percentage is relative to the baseline: write it signed "
                              f"(+{number}% or -{number}%)")
        kind, value = "relative", value / 100 * (-1 if sign == "-" else 1)
    elif sign:
        kind, value = "delta", value * (-1 if sign == "-" else 1)
    else:
        kind = "absolute"
    if kind != "absolute" and metric in VS_BASELINE:
        raise ConfigError(f"--budget {expr!r}: {metric} compares a run with the baseline itself (the baseline scores "
                          f"itself as identical), so only an absolute bound means something, e.g. {metric}{op}{number}")
    return Budget(metric=metric, op=op, value=value, kind=kind, text=expr.strip())


def parse_all(exprs: Iterable[str], metrics: Iterable[str] | None = None) -> list[Budget]:
    """Every ``--budget`` of a command; one metric bounded twice in the same direction is refused."""
    budgets = [parse(e, metrics) for e in exprs]
    seen: dict[tuple[str, bool], str] = {}
    for b in budgets:
        key = (b.metric, b.lower_is_better)
        if key in seen:
            raise ConfigError(f"--budget {b.text!r}: {b.metric} is already bounded by {seen[key]!r}; give one bound per "
                              f"metric and direction")
        seen[key] = b.text
    if not budgets:
        raise ConfigError(f"--budget: give at least one ({FORMS})")
    return budgets
