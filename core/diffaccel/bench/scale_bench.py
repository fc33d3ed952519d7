"""``diffaccel scale-bench CONFIG --prompts FILE``: throughput of N processes against one.

Runs ``diffaccel generate CONFIG --prompts FILE --out ...`` as one process, then under
``accelerate launch --multi_gpu --num_processes N`` (torchrun; CPU processes, gloo), every process with one thread
(``OMP_NUM_THREADS``, default 1), alternating which goes first on each repeat, each into a fresh
folder. Prints the throughput ratio of the generation phase (from the model being loaded on
every process to the last item written, as the main process times it) and of the whole command
(Python start and model loads included), and whether the outputs are byte-identical. Beside them it prints the machine's own ceiling: the same fixed amount of pure
compute (a one-thread matmul loop, no I/O, no Python between the products) in one process against
N concurrent processes, so that a ratio below N can be read against what the cores give at all
(on a VM two vCPUs may share a physical core or a power budget).
"""

from __future__ import annotations

import filecmp
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..contract.errors import DiffaccelError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(processes: int, args: list[str], port: int | None = None) -> list[str]:
    """``diffaccel ARGS`` as ``processes`` CPU processes under ``accelerate launch`` (1: plain python)."""
    if processes == 1:
        return [sys.executable, "-m", "diffaccel.cli.entry", *args]
    # accelerate launch --cpu starts one process unless it goes through mpirun; --multi_gpu is its
    # torchrun launcher, which starts N processes on a CPU-only machine too (gloo, jobs.process_state)
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(port or _free_port()), "-m", "diffaccel.cli.entry", *args]


def _run(processes: int, config: str, prompts: str, out: Path, threads: int) -> dict:
    timing = out.with_suffix(".timing.json")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "DIFFACCEL_JOB_TIMING": str(timing)}
    cmd = launch_command(processes, ["generate", config, "--prompts", prompts, "--out", str(out), "--no-progress"])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise DiffaccelError(f"scale-bench: the {processes}-process run failed (exit {proc.returncode}): {tail}")
    return {**json.loads(timing.read_text()), "wall_s": wall}


# one thread's worth of pure compute; it says "ready" after torch's import and a warm-up, then waits
# for "go" so that the copies' loops start together; prints (wall start, wall end, seconds in the loop)
_KERNEL = ("import sys, time, torch\n"
           "torch.set_num_threads({threads})\n"
           "a, b = torch.randn(256, 256), torch.randn(256, 256)\n"
           "for _ in range(50): a @ b\n"
           "print('ready', flush=True); sys.stdin.readline()\n"
           "t0, p0 = time.time(), time.perf_counter()\n"
           "for _ in range({products}): a @ b\n"
           "print(t0, time.time(), time.perf_counter() - p0)")


def _kernel_runs(processes: int, threads: int, products: int) -> list[tuple[float, float, float]]:
    """The kernel in ``processes`` concurrent processes: each one's (start, end, seconds)."""
    code = _KERNEL.format(threads=threads, products=products)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for _ in range(processes)]
    try:
        if any(proc.stdout.readline().strip() != "ready" for proc in procs):
            raise DiffaccelError("scale-bench: the ceiling's compute kernel did not start")
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        runs = []
        for proc in procs:
            out, _ = proc.communicate()
            if proc.returncode != 0:
                raise DiffaccelError(f"scale-bench: the ceiling's compute kernel failed (exit {proc.returncode})")
            start, end, seconds = map(float, out.split())
            runs.append((start, end, seconds))
        return runs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()


def machine_ceiling(processes: int, threads: int = 1, products: int = 3000, repeats: int = 2) -> tuple[float, bool]:
    """Throughput ratio of ``processes`` concurrent copies of a fixed compute kernel against one
    copy, alternating which goes first; and whether the copies' loops did overlap in time."""
    one = many = 0.0
    overlapped = True
    for rep in range(repeats):
        for p in ([1, processes] if rep % 2 == 0 else [processes, 1]):
            runs = _kernel_runs(p, threads, products)
            if p == 1:
                one += runs[0][2]
            else:
                many += max(r[2] for r in runs)
                overlapped &= max(r[0] for r in runs) < min(r[1] for r in runs)
    return processes * one / many, overlapped


def same_outputs(a: Path, b: Path) -> bool:
    """Whether two job folders hold the same files, byte for byte (job.json aside: it names the folder's config path)."""
    names = sorted(p.name for p in a.iterdir() if p.name != "job.json")
    if names != sorted(p.name for p in b.iterdir() if p.name != "job.json"):
        return False
    return all(filecmp.cmp(a / n, b / n, shallow=False) for n in names)


def scale_bench(args) -> int:
    from ..runtime.jobs import read_items

    if args.processes < 2 or args.threads < 1 or args.repeats < 1:
        raise DiffaccelError(f"scale-bench: --processes must be 2 or more, --threads and --repeats 1 or more; got "
                             f"{args.processes}, {args.threads}, {args.repeats}")
    n = len(read_items(args.prompts, 0))  # a bad prompts file: one line before anything runs
    runs: dict[int, list[dict]] = {1: [], args.processes: []}
    identical = True
    with tempfile.TemporaryDirectory(prefix="diffaccel-scale-") as tmp:
        for rep in range(args.repeats):
            order = [1, args.processes] if rep % 2 == 0 else [args.processes, 1]
            outs = {}
            for p in order:
                outs[p] = Path(tmp) / f"r{rep}-p{p}"
                runs[p].append(_run(p, args.config, args.prompts, outs[p], args.threads))
            identical &= same_outputs(outs[1], outs[args.processes])
    ceiling, overlapped = machine_ceiling(args.processes, args.threads)
    gen = {p: sum(r["generate_s"] for r in rs) for p, rs in runs.items()}
    wall = {p: sum(r["wall_s"] for r in rs) for p, rs in runs.items()}
    failed = runs[1][0]["failed"]
    P = args.processes
    print(f"{args.config}: {n} items of {args.prompts}, {args.repeats} repeat(s), {args.threads} thread(s) per process, "
          f"1 vs {P} processes alternating")
    print(f"generation phase: 1 process {n * args.repeats / gen[1]:.2f} items/s, {P} processes "
          f"{n * args.repeats / gen[P]:.2f} items/s: throughput ratio {gen[1] / gen[P]:.2f}x")
    print(f"whole command (start and model loads included): throughput ratio {wall[1] / wall[P]:.2f}x")
    print(f"this machine's ceiling: a {args.threads}-thread matmul loop, 1 vs {P} concurrent processes: {ceiling:.2f}x"
          f"{'' if overlapped else ' (the processes did not overlap: no ceiling)'}; the generation phase reaches "
          f"{100 * gen[1] / gen[P] / ceiling:.0f}% of it")
    print(f"outputs byte-identical to one process: {'yes' if identical else 'NO'}; failed items: {failed}")
    return 0 if identical else 1
