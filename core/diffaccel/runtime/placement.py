"""Where a model runs: ``[model] device`` and ``[model] dtype``, checked before anything loads.

One place for the rule: ``check_placement`` says in one line why a device/dtype pair cannot run
here (an unknown device, ``cuda`` on a machine without CUDA, a dtype whose kernels the device
lacks), and ``torch_dtype`` names the torch dtype. Adapters move their pipelines with
``pipe.to(device, torch_dtype(dtype))``; strategies never read the config: they make their
caches from the tensors they are handed (``like.new_zeros``, ``torch.zeros(..., device=x.device,
dtype=x.dtype)``), so ``diffaccel.apply`` on a pipeline the user placed follows the pipeline.
"""

from __future__ import annotations

from typing import Any

DTYPES = ("float32", "bfloat16", "float16")
"""``[model] dtype`` values, the default first."""


def torch_dtype(name: str) -> Any:
    """``bfloat16`` (a ``[model] dtype`` value) -> ``torch.bfloat16``."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``bfloat16`` (reports and JSON)."""
    return str(dtype).removeprefix("torch.")


def _probe(device: Any, dtype: Any) -> None:
    """The ops every shipped denoiser runs (matmul, softmax, layer and group norm, conv, SiLU/GELU),
    once on a tiny tensor: a dtype the device has no kernels for fails here, in a millisecond,
    rather than at the first step after minutes of loading."""
    import torch
    import torch.nn.functional as F

    x = torch.ones(2, 4, 4, device=device, dtype=dtype)
    (x @ x).softmax(-1)
    F.gelu(F.silu(F.layer_norm(x, (4,))))
    img = torch.ones(1, 4, 4, 4, device=device, dtype=dtype)
    F.conv2d(F.group_norm(img, 2), torch.ones(4, 4, 3, 3, device=device, dtype=dtype), padding=1)


def check_placement(device: str, dtype: str, probe=_probe) -> str | None:
    """None when ``device`` and ``dtype`` can run here, else one line saying why (no key name:
    the caller adds ``file: [model] key '...'``). Imports torch; loads no model."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        return (f"key 'device': {device!r} is not a torch device ({str(exc).splitlines()[0]}); "
                "allowed: cpu, cuda, cuda:N, mps, xpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch has no CUDA build" if torch.version.cuda is None else "no CUDA GPU is visible"
            return f"key 'device': '{device}' but CUDA is not available here ({why}); use device = \"cpu\""
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            return f"key 'device': '{device}' but this machine has {torch.cuda.device_count()} CUDA device(s)"
    elif dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        return f"key 'device': '{device}' but MPS is not available here; use device = \"cpu\""
    elif dev.type == "xpu" and not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        return f"key 'device': '{device}' but XPU is not available here; use device = \"cpu\""
    elif dev.type not in ("cpu", "cuda", "mps", "xpu"):
        return f"key 'device': '{device}' cannot run a model; allowed: cpu, cuda, cuda:N, mps, xpu"
    try:
        probe(dev, torch_dtype(dtype))
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        return (f"key 'dtype': '{dtype}' does not run on '{device}' with this torch "
                f"({str(exc).splitlines()[0]}); use dtype = \"float32\" or \"bfloat16\"")
    return None


def sync(device: Any) -> bool:
    """Wait for the work queued on ``device`` (before and after a timed region); True when a
    synchronisation happened (an accelerator), False on the CPU, whose ops run eagerly."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        return True
    mod = getattr(torch, dev.type, None) if dev.type in ("mps", "xpu") else None
    if mod is not None and hasattr(mod, "synchronize"):
        mod.synchronize()
        return True
    return False


class DeviceClock:
    """Seconds of timed regions on a device (``bench``, ``diffaccel overhead``, prompt benches).

    On an accelerator the host returns from a kernel launch long before the kernel ends: each
    region synchronises the device before its start (work queued by untimed code is not billed to
    it) and before its end (its own work is). On the CPU, whose ops run eagerly, both are no-ops.
    ``describe()`` says which, for the bench's JSON."""

    def __init__(self, device: Any = "cpu", warmup_runs: int = 0):
        self.device = str(device)
        self.warmup_runs = warmup_runs
        self.synchronized = False

    def region(self) -> "_Region":
        return _Region(self)

    def describe(self) -> dict[str, Any]:
        return {"device": self.device, "clock": "time.perf_counter", "warmup_runs": self.warmup_runs,
                "synchronize": ("device synchronised before and after each timed run" if self.synchronized
                                else "none: the CPU runs ops eagerly")}


class _Region:
    """``with clock.region() as r: ...`` then ``r.seconds``."""

    def __init__(self, clock: DeviceClock):
        self.clock = clock
        self.seconds = 0.0

    def __enter__(self) -> "_Region":
        import time

        self.clock.synchronized |= sync(self.clock.device)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        import time

        sync(self.clock.device)
        self.seconds = time.perf_counter() - self._t0
