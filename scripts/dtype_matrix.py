"""Every shipped adapter with every strategy that applies, on tiny models, in one dtype on one device.

For each model (masked and continuous text, a LLaMA-class folder, DiffusionGemma, a toy SD-class
UNet, the digits DiT, an unconditional UNet2DModel): the adapter's run inside ``apply`` with no strategy is bitwise the run without it (the
conformance suite's ``idle`` check), the weights are in the dtype asked; then each strategy runs
under ``diffaccel.kit.hygiene.watch`` and must skip work (``SKIPS``) with no hot-path violation. The
tests run it on the CPU in bfloat16 (tests/test_dtype.py); ``scripts/gpu-check.sh`` runs it on a
GPU::

    python scripts/dtype_matrix.py --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

IMAGE = {"steps": 8, "batch": 2, "prompts": ["digit 1", "digit 2"]}
# the SD-class UNet at toy size: bfloat16 convolutions on a CPU are slow, the digits UNet took minutes
MODELS: dict[str, dict[str, Any]] = {
    "text-masked": {"adapter": "text", "checkpoint": "wordnet-masked", "length": 16, "steps": 8, "batch": 2},
    "text-continuous": {"adapter": "text", "checkpoint": "wordnet-continuous", "length": 16, "steps": 8, "batch": 2},
    "text-llama": {"adapter": "text", "checkpoint": "<tiny-llama>", "length": 16, "steps": 8, "batch": 2},
    "text-diffusion-gemma": {"adapter": "text", "checkpoint": "<tiny-gemma>", "length": 32, "steps": 6, "batch": 2},
    "unet-sd-tiny": {"adapter": "unet", "checkpoint": "synthetic-sd-tiny", **IMAGE},
    "dit-digits": {"adapter": "dit", "checkpoint": "dit-digits", **IMAGE},
    "unet2d-ddim": {"adapter": "unet2d", "checkpoint": "synthetic-ddpm-16", "steps": 8, "batch": 2},
}
"""Model tables; ``<tiny-...>`` checkpoints are built into a temporary folder (``tiny_folders``)."""

TEXT = [{"use": "swd"}, {"use": "time-anchor", "warmup": 1, "threshold": 0.5, "max_age": 4},
        {"use": "topk", "k": 8, "k_keep": 16}, {"use": "parallel", "tau": 0.05},
        {"use": "bert-cond", "source": "The cat sat on the mat in Paris.", "pin": "model"}]
IMAGES = [{"use": "dct-anchor", "threshold": 0.9, "warmup": 1},
          {"use": "time-anchor", "warmup": 1, "threshold": 0.9, "max_age": 4}]
STRATEGIES = {"text": TEXT, "unet": IMAGES, "dit": IMAGES, "unet2d": IMAGES}
"""Per adapter: strategy tables set to skip work within a few steps; those a model's
capabilities exclude are left out (``cases``)."""

SKIPS = {"swd": "positions", "time-anchor": "positions", "dct-anchor": "layers", "parallel": "steps"}
"""What a strategy must save on these models (``skipped``); the others (topk, bert-cond) change
what is drawn, not what is computed."""

TUNED = {("text-diffusion-gemma", "swd"): {"tau": 0.01, "K": 1}}
"""Per (model, strategy): settings that make it skip within the few steps of a tiny model."""

NO_SKIP = {("text-diffusion-gemma", "time-anchor"): "its random weights move every state by more than the threshold "
           "at every step (tests/test_diffusion_gemma.py): the run is checked, not the saving"}
"""Cases that must run cleanly but cannot save anything on these tiny models, and why."""


def tiny_folders(root: Path) -> dict[str, str]:
    """The tiny random checkpoints the matrix builds (no download)."""
    from diffaccel.adapters.text.families.diffusion_gemma.build import build
    from diffaccel.adapters.text.testing import tiny_llama_folder

    import torch

    from diffaccel.adapters.text.families.dispatch import load_pipeline

    gemma = build(root / "tiny-gemma", "tiny", seed=0)
    # its final norm scaled up: peaked distributions whose top-1 holds from step to step, so that
    # the strategies find something to skip in a few steps (random weights give flat ones)
    pipe = load_pipeline(str(gemma))
    with torch.no_grad():
        pipe.model.model.decoder.norm.weight.mul_(300.0)
    pipe.model.save_pretrained(gemma)
    return {"<tiny-llama>": tiny_llama_folder(root / "tiny-llama"), "<tiny-gemma>": str(gemma)}


def skipped(kind: str, report: dict[str, Any]) -> bool:
    c = report["counters"]
    if kind == "positions":
        return c["fraction_computed"] < 1.0 or c["cache_hits"] > 0
    if kind == "layers":
        return c["layers_skipped"] > 0
    return report["steps_run"] < report["steps"]


@attrs.frozen
class Case:
    model: str
    table: dict[str, Any] | None
    """None: the idle check of the model."""

    @property
    def name(self) -> str:
        return f"{self.model}:{self.table['use'] if self.table else 'idle'}"


def cases(registry: Any = None, models: tuple[str, ...] | None = None) -> Iterator[Case]:
    """(model, strategy) pairs the strategies' ``requires`` allow, and an idle case per model."""
    from diffaccel.contract.capabilities import missing
    from diffaccel.runtime.registry import Registry

    registry = registry or Registry()
    caps = {"text-diffusion-gemma": {"token-positions", "token-logits"}}
    for model, table in MODELS.items():
        if models and model not in models:
            continue
        yield Case(model, None)
        from diffaccel.runtime.adapters_registry import get_adapter

        offered = caps.get(model, get_adapter(table["adapter"]).capabilities)
        if model == "text-continuous":
            offered = set(offered) - {"mask-confidences"}  # continuous samplers have no mask confidences
        for s in STRATEGIES[table["adapter"]]:
            spec = registry.get(s["use"])
            if spec is not None and not missing(spec.requires, offered):
                s = {**s, **TUNED.get((model, s["use"]), {})}
                if s["use"] == "bert-cond" and "mask-confidences" not in offered:
                    s = {**s, "pin": "even"}  # placing by the model's probabilities needs masked positions
                yield Case(model, s)


class Loaded:
    """Pipelines loaded once per model (a case reuses its model's)."""

    def __init__(self, device: str, dtype: str, folders: dict[str, str]):
        self.device, self.dtype, self.folders = device, dtype, folders
        self._pipes: dict[str, Any] = {}

    def config(self, model: str, table: dict[str, Any] | None = None, registry: Any = None) -> Any:
        import diffaccel

        m = dict(MODELS[model], device=self.device, dtype=self.dtype)
        m["checkpoint"] = self.folders.get(m["checkpoint"], m["checkpoint"])
        return diffaccel.parse_config({"model": m, **({"strategy": [table]} if table else {})}, source=f"matrix:{model}",
                                      registry=registry)

    def pipe(self, model: str) -> tuple[Any, Any]:
        from diffaccel.runtime.adapters_registry import get_adapter

        cfg = self.config(model)
        adapter = get_adapter(cfg.model.adapter)
        if model not in self._pipes:
            self._pipes[model] = adapter.load(cfg)
        return adapter, self._pipes[model]


def check(case: Case, loaded: Loaded, registry: Any = None) -> dict[str, Any]:
    """Run one case; returns ``{"case", "ok", "why", "report", "syncs", "deliberate", "s"}``."""
    import torch

    import diffaccel
    from diffaccel.runtime.accelerator import build_strategies
    from diffaccel.conformance import CHECKS, check_adapter
    from diffaccel.kit.hygiene import watch
    from diffaccel.runtime.placement import dtype_name, torch_dtype
    from diffaccel.runtime.registry import Registry

    registry = registry or Registry()
    t0 = time.perf_counter()
    adapter, pipe = loaded.pipe(case.model)
    cfg = loaded.config(case.model)
    row: dict[str, Any] = {"case": case.name, "ok": True, "why": "", "syncs": {}, "deliberate": {}}
    want = torch_dtype(loaded.dtype)
    if case.table is None:
        dtypes = {p.dtype for p in _parameters(pipe) if p.is_floating_point()}
        if dtypes != {want}:
            row.update(ok=False, why=f"weights in {sorted(map(dtype_name, dtypes))}, not {loaded.dtype}")
        else:
            try:
                check_adapter(adapter, pipe, cfg, skip=tuple(c for c in CHECKS if c != "idle"))
            except AssertionError as exc:
                row.update(ok=False, why=str(exc).splitlines()[0])
        row["s"] = time.perf_counter() - t0
        return row
    cfg = loaded.config(case.model, case.table, registry)
    strategies = build_strategies(cfg, registry, adapter.info(pipe))
    small = cfg.model.batch * max(getattr(cfg.options, "length", 0) or 0, 64 * 64)
    with watch(strategies, device=torch.device(loaded.device), dtype=want, small=small) as seen:
        with diffaccel.apply(pipe, cfg, strategies=strategies, registry=registry):
            out = adapter.run(pipe, cfg, cfg.model.seed, progress=False)
    row.update(report=out.report, syncs=dict(seen.host_syncs), deliberate=dict(seen.deliberate))
    kind = None if (case.model, case.table["use"]) in NO_SKIP else SKIPS.get(case.table["use"])
    if seen.violations:
        row.update(ok=False, why=f"{len(seen.violations)} hot-path violation(s): {seen.violations[0]}")
    elif kind and not skipped(kind, out.report):
        row.update(ok=False, why=f"skipped no {kind}: {out.report['counters']}")
    row["s"] = time.perf_counter() - t0
    return row


def _parameters(pipe: Any) -> Iterator[Any]:
    """The denoiser's parameters, whatever the pipeline."""
    import torch

    for name in ("unet", "transformer", "model"):
        m = getattr(pipe, name, None)
        if isinstance(m, torch.nn.Module):
            yield from m.parameters()
            return
    yield from pipe.denoiser.model.parameters()


def place(configs: list[str], out: Path, device: str, dtype: str, steps: int = 0, peers: bool = True) -> list[Path]:
    """Copies of ``configs`` for one bench on ``device`` in ``dtype`` (scripts/gpu-check.sh): each
    with the first config's ``[model]`` (device, dtype and, if ``steps``, steps set) and its own
    strategies; peers from the first config only (none without ``peers``)."""
    from diffaccel.runtime.config import read_toml
    from diffaccel.tuning.toml_out import dumps

    docs = [read_toml(c) for c in configs]
    model = {**docs[0]["model"], "device": device, "dtype": dtype, **({"steps": steps} if steps else {})}
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, (path, doc) in enumerate(zip(configs, docs)):
        placed = {"model": model, **({"strategy": doc["strategy"]} if doc.get("strategy") else {})}
        if i == 0 and peers and doc.get("peer"):
            placed["peer"] = doc["peer"]
        target = out / Path(path).name
        target.write_text(dumps(placed), encoding="utf-8")
        paths.append(target)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/dtype_matrix.py", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--models", nargs="*", help=f"a subset of: {', '.join(MODELS)}")
    ap.add_argument("--place", metavar="DIR", help="instead: write the configs given, placed for one bench, into DIR "
                    "and print their paths (scripts/gpu-check.sh)")
    ap.add_argument("--steps", type=int, default=0, help="with --place: override [model] steps (0: keep)")
    ap.add_argument("--no-peers", action="store_true", help="with --place: leave the [[peer]] tables out")
    ap.add_argument("configs", nargs="*")
    args = ap.parse_args(argv)
    from diffaccel.runtime.placement import check_placement

    problem = check_placement(args.device, args.dtype)
    if problem:
        print(f"dtype_matrix: {problem}", file=sys.stderr)
        return 2
    if args.place:
        print(" ".join(map(str, place(args.configs, Path(args.place), args.device, args.dtype, args.steps, not args.no_peers))))
        return 0
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        loaded = Loaded(args.device, args.dtype, tiny_folders(Path(tmp)))
        for case in cases(models=tuple(args.models or ())):
            try:
                row = check(case, loaded)
            except Exception as exc:  # noqa: BLE001 - one line per case, the others still run
                row = {"ok": False, "why": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                       "s": 0.0, "syncs": {}, "deliberate": {}}
            failed += not row["ok"]
            syncs = sum(row["syncs"].values())
            print(f"{'ok  ' if row['ok'] else 'FAIL'} {case.name:<34} {row['s']:6.1f}s  host syncs {syncs:<4} {row['why']}")
            for why, n in row["deliberate"].items():
                print(f"       deliberate ({n} ops): {why}")
    print(f"dtype_matrix: {args.device} {args.dtype}: {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
