"""``diffaccel generate CONFIG --prompts FILE --out DIR``: one item per line, sharded over processes.

Under ``accelerate launch`` (one machine or several) every process takes a contiguous share of
the items still to do with ``accelerate.PartialState.split_between_processes``; alone, the one
process takes them all. The outputs do not depend on the sharding:

* each item is one generation of one row (``[model] batch`` is not used), from its own seed,
  with strategies whose state starts afresh at every run, so an item's tokens or pixels are the
  same whichever process runs it and whatever ran before it;
* every item's record goes to ``DIR/.parts/NNNNN.json`` (images first to ``DIR/NNNNN.png``),
  each written under a temporary name and renamed; when every process is done, the main process
  merges the records in line order into ``DIR/results.jsonl`` (again via a temporary name) and
  removes the parts. An interrupted job leaves whole files only, and a rerun skips every item
  that has a record without an error (resume).

Prompts file: one item per line (UTF-8). A line starting with ``{`` is a JSON object
``{"prompt": "...", "seed": 7}`` (``seed`` optional); any other line is the prompt itself. An
item's seed is the given one, else ``[model] seed`` (or ``--seed``) plus the line's 0-based index.
An empty prompt is a failed item (recorded, the others run); an unreadable line stops the job
before any model loads.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import attrs

from ..contract.adapter import WritesItems
from ..contract.errors import ConfigError, DiffaccelError

RESULTS = "results.jsonl"
PARTS = ".parts"
JOB = "job.json"
#: The benchmark (``diffaccel scale-bench``) reads the main process's timings from this file.
TIMING_ENV = "DIFFACCEL_JOB_TIMING"


@attrs.frozen
class Item:
    """One line of the prompts file."""

    line: int
    """0-based line index: the item's place in results.jsonl and its file name."""
    prompt: str
    seed: int


def read_items(path: str | Path, base_seed: int) -> list[Item]:
    """The items of a prompts file; one ``DiffaccelError`` naming the file (and line) if it cannot be read."""
    p = Path(path)
    if not p.exists():
        raise DiffaccelError(f"{p}: prompts file not found")
    if not p.is_file():
        raise DiffaccelError(f"{p}: prompts file is not a file")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        line = p.read_bytes()[: exc.start].count(b"\n") + 1
        raise DiffaccelError(f"{p}: line {line}: not UTF-8 text (byte {exc.start}); prompts files are UTF-8, one item per line") from None
    except OSError as exc:
        raise DiffaccelError(f"{p}: cannot read the prompts file ({exc.strerror})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":  # the file's final newline ends the last line, it starts none
        lines.pop()
    if not lines:
        raise DiffaccelError(f"{p}: prompts file is empty; write one prompt per line")
    return [_parse_line(p, i, raw.rstrip("\r"), base_seed) for i, raw in enumerate(lines)]


def _parse_line(path: Path, index: int, raw: str, base_seed: int) -> Item:
    if not raw.lstrip().startswith("{"):
        return Item(index, raw, base_seed + index)
    where = f"{path}: line {index + 1}"
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DiffaccelError(f"{where}: a line starting with '{{' must be a JSON object ({exc.msg}, column {exc.colno}); "
                             'allowed: {"prompt": "...", "seed": 0} or a plain prompt') from None
    if not isinstance(obj, dict) or set(obj) - {"prompt", "seed"} or not isinstance(obj.get("prompt"), str):
        raise DiffaccelError(f'{where}: a JSON line needs a "prompt" string and at most a "seed" integer, got {raw[:80]}')
    seed = obj.get("seed", base_seed + index)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise DiffaccelError(f'{where}: key "seed": must be an integer >= 0, got {seed!r}')
    return Item(index, obj["prompt"], seed)


def check_out_dir(out: str | Path | None) -> Path:
    if out is None:
        raise DiffaccelError("--prompts needs --out DIR: the folder for results.jsonl and the images")
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise DiffaccelError(f"{p}: --out must be a folder (results.jsonl and images go there), and this is a file")
    for parent in p.parents:
        if parent.exists() and not parent.is_dir():
            raise DiffaccelError(f"{p}: --out cannot be created: {parent} is a file")
        if parent.exists():
            break
    return p


def item_config(cfg, item: Item):
    """The config of one item: one row, the item's prompt (the adapter's ``prompts`` option)."""
    return attrs.evolve(cfg, model=attrs.evolve(cfg.model, batch=1, seed=item.seed),
                        options=attrs.evolve(cfg.options, prompts=[item.prompt]))


def check_job_config(cfg, adapter) -> None:
    """What ``--prompts`` needs from the adapter, checked before any model loads."""
    names = {f.name for f in attrs.fields(type(cfg.options))} if attrs.has(type(cfg.options)) else set()
    if "prompts" not in names:
        raise ConfigError(f"{cfg.source}: [model]: the '{cfg.model.adapter}' adapter has no 'prompts' key; --prompts needs one")
    if not isinstance(adapter, WritesItems):
        raise ConfigError(f"{cfg.source}: [model]: the '{cfg.model.adapter}' adapter cannot write one item (no write_item); "
                          "--prompts needs it")


def fingerprint(cfg_path: str | Path, seed: int | None) -> str:
    """What a job's outputs depend on besides the items: the config file and ``--seed``."""
    h = hashlib.sha256(Path(cfg_path).read_bytes())
    h.update(f"seed={seed}".encode())
    return h.hexdigest()


def check_job_file(out: Path, cfg_path: str | Path, digest: str) -> None:
    job = out / JOB
    if not job.exists():
        return
    try:
        old = json.loads(job.read_text(encoding="utf-8")).get("config_sha256")
    except (OSError, ValueError, AttributeError):
        raise DiffaccelError(f"{job}: unreadable; remove it, or write to another --out folder") from None
    if old != digest:
        raise DiffaccelError(f"{out}: written by another config or --seed than {cfg_path} (its {JOB} differs); "
                             "use another --out folder to start afresh, or the same config to resume")


def atomic_write(path: Path, data: bytes) -> None:
    """Write under a temporary name in the same folder, then rename: readers see all or nothing."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def record_line(rec: dict[str, Any]) -> str:
    return json.dumps(rec, ensure_ascii=False, default=float)


def done_records(out: Path, items: list[Item]) -> dict[int, dict[str, Any]]:
    """Line -> record of every item already done (no error, same prompt and seed, its files there)."""
    found: dict[int, dict[str, Any]] = {}
    results = out / RESULTS
    if results.exists():
        for raw in results.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(raw)
            except ValueError:
                continue  # not ours, or damaged: the item runs again
            if isinstance(rec, dict) and isinstance(rec.get("line"), int):
                found[rec["line"]] = rec
    parts = out / PARTS
    if parts.is_dir():
        for f in parts.glob("*.json"):
            try:
                rec = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(rec, dict) and isinstance(rec.get("line"), int):
                found[rec["line"]] = rec
    by_line = {it.line: it for it in items}
    done = {}
    for line, rec in found.items():
        it = by_line.get(line)
        if it is None or "error" in rec or (rec.get("prompt"), rec.get("seed")) != (it.prompt, it.seed):
            continue
        if "image" in rec and not (out / rec["image"]).exists():
            continue
        done[line] = rec
    return done


def item_stem(line: int) -> str:
    return f"{line:05d}"


def run_item(run, item: Item, out: Path) -> dict[str, Any]:
    """Generate one item with ``run`` (a loaded ``diffaccel.Run``) and write its files; a failure
    is the record's ``error``."""
    rec: dict[str, Any] = {"line": item.line, "prompt": item.prompt, "seed": item.seed}
    if not item.prompt.strip():
        rec["error"] = "empty prompt"
        return rec
    try:
        output = run.generate(item.seed, config=item_config(run.config, item))  # the config's on_error and [guard] too
        fields = run.adapter.write_item(output, out, item_stem(item.line))
        rec.update(fields, report=output.report)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # an error inside the model: recorded, the other items go on
        msg = str(exc).strip().splitlines()
        rec["error"] = f"{type(exc).__name__}: {msg[0] if msg else ''}".rstrip(": ")
    return rec


def process_state(cfg):
    """accelerate's ``PartialState``: this process's rank and share under ``accelerate launch`` or
    ``torchrun`` (one process otherwise). A CPU model asks for the CPU (gloo) process group:
    accelerate only builds one on the CPU when told so."""
    from accelerate import PartialState

    if cfg is None:  # a config that did not load: the others' may have; they are all alike in practice
        import torch

        return PartialState(cpu=not torch.cuda.is_available())
    return PartialState(cpu=str(cfg.model.device).startswith("cpu"))


def on_own_device(cfg, state):
    """``device = "cuda"`` (no index) under a launcher: each process on its own GPU (accelerate's
    ``LOCAL_RANK`` device); anything else as configured."""
    if cfg.model.device == "cuda" and state.num_processes > 1:
        return attrs.evolve(cfg, model=attrs.evolve(cfg.model, device=str(state.device)))
    return cfg


def _load_everywhere(state, cfg, registry):
    """The run set up (``diffaccel.Run``: model loaded, strategies built) on every process; if it
    fails on any, every process raises the first failure (one line) instead of waiting for the
    others in a collective that never comes."""
    from .runs import Run

    run = None
    problem = None
    try:
        run = Run(cfg, registry=registry).load()
    except Exception as exc:  # noqa: BLE001 - any load failure must reach the other processes
        problem = load_problem(exc, cfg.model.checkpoint)
    raise_if_any(state, problem)
    return run


def load_problem(exc: BaseException, checkpoint: str) -> str:
    """One line for a load failure: a ``DiffaccelError`` as it is, anything else named with the checkpoint."""
    if isinstance(exc, DiffaccelError):
        return str(exc)
    lines = str(exc).strip().splitlines()
    return f"checkpoint '{checkpoint}': {type(exc).__name__}: {lines[0] if lines else ''}"


def raise_if_any(state, problem: str | None) -> None:
    """Every process says whether it failed (one ``gather_object``, which each process reaches
    whatever happened to it); if any did, every process raises the first failure."""
    from accelerate.utils import gather_object

    problems = gather_object([(state.process_index, problem)]) if state.num_processes > 1 else [(0, problem)]
    failed = [(rank, p) for rank, p in problems if p]
    if failed:
        rank, p = failed[0]
        raise DiffaccelError(p if state.num_processes == 1 else f"{p} (process {rank} of {state.num_processes})")


def generate_job(config_path: str, prompts: str, out: str | None, *, seed: int | None = None,
                 progress: bool = True) -> dict[str, Any]:
    """Run (or resume) a prompts job; returns a summary (items, run, skipped, failed, results path).
    Under ``accelerate launch`` call it on every process: all return the same summary."""
    from .adapters_registry import get_adapter
    from .config import load_config
    from .registry import Registry

    # Everything a user can get wrong is checked here, on every process, before any model loads;
    # then the processes compare notes, so that each prints the same line and none waits for another.
    cfg = problem = None
    try:
        registry = Registry()
        cfg = load_config(config_path, registry)
        if seed is not None:
            cfg = attrs.evolve(cfg, model=attrs.evolve(cfg.model, seed=seed))
        items = read_items(prompts, cfg.model.seed)
        out_dir = check_out_dir(out)
        adapter = get_adapter(cfg.model.adapter)
        check_job_config(cfg, adapter)
        digest = fingerprint(config_path, seed)
        check_job_file(out_dir, config_path, digest)
        done = done_records(out_dir, items)
        todo = [it for it in items if it.line not in done]
    except DiffaccelError as exc:
        problem = str(exc)
    state = process_state(cfg)
    raise_if_any(state, problem)
    cfg = on_own_device(cfg, state)
    state.wait_for_everyone()  # every process has read what is done before anything is written
    if state.is_main_process:
        (out_dir / PARTS).mkdir(parents=True, exist_ok=True)
        atomic_write(out_dir / JOB, json.dumps({"config": str(config_path), "config_sha256": digest,
                                                "seed_override": seed}, indent=2).encode())
    t_load = time.perf_counter()
    run = _load_everywhere(state, cfg, registry)
    state.wait_for_everyone()  # the parts folder exists
    t0 = time.perf_counter()
    failed = _run_share(state, run, todo, out_dir, progress)
    failed_all = _sum_everywhere(state, failed)
    t1 = time.perf_counter()
    summary = {"items": len(items), "run": len(todo), "skipped": len(done), "failed": failed_all,
               "results": str(out_dir / RESULTS), "processes": state.num_processes, "main": state.is_main_process}
    if state.is_main_process:
        _merge(out_dir, items)
        timing = os.environ.get(TIMING_ENV)
        if timing:
            Path(timing).write_text(json.dumps({**summary, "load_s": t0 - t_load, "generate_s": t1 - t0}))
    state.wait_for_everyone()
    return summary


def _run_share(state, run, todo: list[Item], out: Path, progress: bool) -> int:
    """This process's contiguous share of ``todo``; the main process's bar counts every process's records."""
    from tqdm.auto import tqdm

    parts = out / PARTS
    bar = tqdm(total=len(todo), desc="generate", unit="item", disable=not (progress and state.is_main_process))
    before = sum(1 for _ in parts.glob("*.json")) if state.is_main_process else 0
    failed = 0
    with state.split_between_processes(todo) as mine:
        for item in mine:
            rec = run_item(run, item, out)
            failed += "error" in rec
            atomic_write(parts / f"{item_stem(item.line)}.json", (record_line(rec) + "\n").encode("utf-8"))
            if state.is_main_process and not bar.disable:
                bar.n = min(len(todo), sum(1 for _ in parts.glob("*.json")) - before)
                bar.refresh()
    state.wait_for_everyone()
    bar.n = len(todo)
    bar.close()
    return failed


def _sum_everywhere(state, n: int) -> int:
    if state.num_processes == 1:
        return n
    from accelerate.utils import gather_object

    return sum(gather_object([n]))


def _merge(out: Path, items: list[Item]) -> None:
    """results.jsonl in line order from the previous file and the new parts; then drop the parts."""
    recs = done_records(out, items)
    parts = out / PARTS
    latest: dict[int, dict[str, Any]] = {}
    for f in parts.glob("*.json"):
        rec = json.loads(f.read_text(encoding="utf-8"))
        latest[rec["line"]] = rec
    for it in items:  # failed items keep their newest error
        if it.line not in recs and it.line in latest:
            recs[it.line] = latest[it.line]
    lines = [record_line(recs[it.line]) for it in items if it.line in recs]
    atomic_write(out / RESULTS, ("\n".join(lines) + "\n").encode("utf-8"))
    for f in parts.iterdir():  # the merged records, and temporary files of writes cut short
        f.unlink()
    parts.rmdir()
    for f in out.glob(".*.partial"):
        f.unlink()


def main_generate(args) -> int:
    """The CLI's ``generate --prompts``: exit 0 if every item is done, 1 if any failed."""
    try:
        s = generate_job(args.config, args.prompts, args.out, seed=args.seed, progress=not args.no_progress)
    except DiffaccelError as exc:
        return exit_together(exc)
    if s["main"]:
        print(f"diffaccel: {s['items']} items: {s['run']} run on {s['processes']} process(es), {s['skipped']} already done, "
              f"{s['failed']} failed; results: {s['results']}", file=sys.stderr)
    return 1 if s["failed"] else 0


def exit_together(exc: DiffaccelError) -> int:
    """The CLI's one line and exit code 2 for an error every process raised alike (``raise_if_any``):
    each prints it, then waits for the others, so that the launcher, which stops the rest of the
    job as soon as one process exits nonzero, stops none before it has said why."""
    sys.stderr.write(f"diffaccel: error: {exc}\n")  # one write: the processes share the stream
    sys.stderr.flush()
    from accelerate import PartialState

    if PartialState._shared_state and PartialState().num_processes > 1:
        PartialState().wait_for_everyone()
    return 2
