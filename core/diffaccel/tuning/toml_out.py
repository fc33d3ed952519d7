"""Writing configs back as TOML (``tune``'s TUNED.toml): the subset diffaccel's configs use —
tables, arrays of tables, strings, numbers, booleans and flat lists. The standard library reads
TOML (tomllib) but does not write it, and this subset does not justify a dependency; ``loads``
of the output equals the input (tested)."""

from __future__ import annotations

import json
import math
from typing import Any


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return {True: "inf", False: "-inf"}[v > 0] if math.isinf(v) else "nan"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # a TOML basic string: JSON's escapes are valid TOML
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} {v!r} as a TOML value")


def _table(d: dict[str, Any]) -> str:
    return "".join(f"{k} = {_value(v)}\n" for k, v in d.items() if v is not None)


def dumps(doc: dict[str, Any]) -> str:
    """``doc``: top-level keys map to tables (dicts) or arrays of tables (lists of dicts)."""
    parts = []
    for name, body in doc.items():
        if isinstance(body, dict):
            parts.append(f"[{name}]\n{_table(body)}")
        elif isinstance(body, list) and all(isinstance(t, dict) for t in body):
            parts += [f"[[{name}]]\n{_table(t)}" for t in body]
        else:
            raise TypeError(f"top-level key '{name}' must be a table or an array of tables")
    return "\n".join(parts)
