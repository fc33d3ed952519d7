"""Memory as a cost: what strategies hold, what the device peaked at, what the process peaked at.

* ``state_bytes(obj)``: the bytes of the tensors inside a strategy's state (attrs classes, plain
  objects, lists, dicts), each storage counted once: what the core reports for a strategy whose
  ``diffaccel_memory`` hook answers None (or that has none);
* ``DevicePeak``: the CUDA allocator's peak over one run (``max_memory_allocated`` after a reset),
  None on devices without such a counter (the CPU);
* ``process_peak_rss_mb()``: the process's peak resident set (``getrusage``), a lifetime figure.
"""

from __future__ import annotations

import sys
from typing import Any

import attrs


def state_bytes(obj: Any) -> int:
    """Bytes of the distinct tensor storages reachable from ``obj`` (attrs fields, attributes of
    plain objects, lists, tuples, dict values), each storage counted once."""
    import torch

    seen: set[int] = set()
    storages: dict[int, int] = {}
    todo = [obj]
    while todo:
        x = todo.pop()
        if x is None or isinstance(x, (str, bytes, int, float, bool)) or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            if x.device.type != "meta":
                storage = x.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(x, (list, tuple, set, frozenset)):
            todo.extend(x)
        elif isinstance(x, dict):
            todo.extend(x.values())
        elif attrs.has(type(x)):
            todo.extend(getattr(x, f.name, None) for f in attrs.fields(type(x)))
        elif hasattr(x, "__dict__") and not isinstance(x, type) and not callable(x):
            todo.extend(vars(x).values())
    return sum(storages.values())


class DevicePeak:
    """``reset()`` before a run, ``read()`` after: the device allocator's peak bytes in between
    (CUDA), or None where the device keeps no such count."""

    def __init__(self, device: Any):
        import torch

        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"

    def reset(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)

    def read(self) -> int | None:
        if not self.cuda:
            return None
        import torch

        return int(torch.cuda.max_memory_allocated(self.device))


def process_peak_rss_mb() -> float | None:
    """The process's peak resident set size so far, in MiB (None where ``resource`` is missing)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def memory_cell(memory: dict[str, Any] | None) -> str:
    """A bench entry's memory cost in a table cell: MiB its strategies held, and on CUDA its
    allocator peak over the baseline's (``+x``); ``-`` for entries of a bench that did not measure it."""
    if not memory:
        return "-"
    if hasattr(memory, "to_dict"):  # diffaccel.bench.results.EntryMemory
        memory = memory.to_dict()
    cell = f"{memory['state_mb']:.2f}"
    return cell + (f" (+{memory['over_baseline_mb']:.0f})" if "over_baseline_mb" in memory else "")
