"""Two CPU processes under ``accelerate launch --multi_gpu --num_processes 2`` (its torchrun
launcher; gloo, no GPU): the shipped text and digits models write byte-identical files to a
one-process run; bench --prompts reports the same quality; bad input, and a model that fails to
load on one process, stop both with one line and exit 2.
Few items and steps: each launch starts two Python processes, which is most of the time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diffaccel.cli.entry import main
from diffaccel.bench.scale_bench import launch_command, same_outputs

pytest.importorskip("accelerate")

TEXT = """[model]
adapter = "text"
checkpoint = "wordnet-masked"
length = 24
steps = 24
seed = 1

[[strategy]]
use = "swd"
tau = 0.01
K = 2
R = 1
max_age = 8

[[strategy]]
use = "time-anchor"
threshold = 0.01
warmup = 5
max_age = 2
"""

DIGITS = """[model]
adapter = "unet"
checkpoint = "digits"
steps = 8
guidance_scale = 2.0

[[strategy]]
use = "dct-anchor"
signal = "x0"
criterion = "energy"
threshold = 0.3
band = 4
warmup = 1
max_reuse = 6
"""

# 5 items shared 3 + 2; one gives its seed, one is empty (a failed item on process 0's share)
TEXT_PROMPTS = 'dog:\n\n{"prompt": "river:", "seed": 42}\ncat:\nmusic:\n'
DIGIT_PROMPTS = "digit 3\ndigit 7\n0\n"
HELPERS = Path(__file__).resolve().parent / "scale_helpers"


def _launch(args: list[str], extra_env: dict[str, str] | None = None, module: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(extra_env or {})}
    cmd = launch_command(2, args)
    if not module:  # a script instead of -m diffaccel.cli.entry
        i = cmd.index("-m", 3)
        cmd = cmd[:i] + args
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("model,prompts,expect_code", [(TEXT, TEXT_PROMPTS, 1), (DIGITS, DIGIT_PROMPTS, 0)],
                         ids=["text", "digits"])
def test_two_processes_write_the_same_files(tmp_path, capsys, model, prompts, expect_code):
    cfg = _write(tmp_path / "c.toml", model)
    items = _write(tmp_path / "p.txt", prompts)
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["generate", cfg, "--prompts", items, "--out", str(one), "--no-progress"]) == expect_code
    proc = _launch(["generate", cfg, "--prompts", items, "--out", str(two), "--no-progress"])
    assert proc.returncode == expect_code, proc.stderr[-3000:]
    assert "run on 2 process(es)" in proc.stderr
    assert same_outputs(one, two)
    recs = [json.loads(x) for x in (two / "results.jsonl").read_text().splitlines()]
    assert [r["line"] for r in recs] == list(range(len(prompts.splitlines())))
    done = [r["report"]["counters"] for r in recs if "report" in r]
    assert any(c["fraction_computed"] < 1 or c["layers_skipped"] > 0 for c in done)  # the strategies skipped work


def test_load_failure_on_one_process_stops_both(tmp_path):
    cfg = _write(tmp_path / "c.toml", TEXT)
    items = _write(tmp_path / "p.txt", "dog:\ncat:\n")
    proc = _launch([str(HELPERS / "fail_load_on_rank1.py"), "generate", cfg, "--prompts", items, "--out",
                    str(tmp_path / "o"), "--no-progress"], module=False)
    lines = [x for x in proc.stderr.splitlines() if x.startswith("diffaccel: error:")]
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert len(lines) == 2 and all("cannot load on this process (process 1 of 2)" in x for x in lines), proc.stderr[-3000:]
    # no traceback of diffaccel's (the launcher reports the failed workers in its own words)
    assert "diffaccel/jobs.py" not in proc.stderr and "diffaccel/cli.py" not in proc.stderr
    assert not (tmp_path / "o" / "results.jsonl").exists()


def test_bad_prompts_file_stops_every_process(tmp_path):
    cfg = _write(tmp_path / "c.toml", TEXT)
    proc = _launch(["generate", cfg, "--prompts", _write(tmp_path / "p.txt", 'dog:\n{"prompt": 1}\n'),
                    "--out", str(tmp_path / "o"), "--no-progress"])
    # each process that gets to read the file says it once (the launcher's processes share one
    # stream); the launcher stops the others as soon as one exits with 2, so on a loaded machine
    # the second can be stopped before it has read the file: one or two lines, never another error
    said = proc.stderr.count("diffaccel: error:")
    assert proc.returncode != 0 and "exitcode  : 2" in proc.stderr, proc.stderr[-3000:]
    assert said in (1, 2) and proc.stderr.count("p.txt: line 2: a JSON line needs") == said, proc.stderr[-3000:]
    assert not (tmp_path / "o").exists()


def test_bench_prompts_two_processes_same_quality(tmp_path, capsys):
    cfg = _write(tmp_path / "swd.toml", TEXT)
    items = _write(tmp_path / "p.txt", "dog:\ncat:\nriver:\n")
    args = ["bench", cfg, "--prompts", items, "--judge", "none", "--no-progress", "--no-noise-floor"]
    assert main([*args, "--json", str(tmp_path / "one.json")]) == 0
    proc = _launch([*args, "--json", str(tmp_path / "two.json")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3 items of" in proc.stdout and "on 2 process(es)" in proc.stdout
    one, two = (json.loads((tmp_path / f).read_text()) for f in ("one.json", "two.json"))
    assert two["processes"] == 2 and one["processes"] == 1
    assert [e["name"] for e in one["entries"]] == [e["name"] for e in two["entries"]] == ["baseline", "swd"]
    for a, b in zip(one["entries"], two["entries"]):
        assert a["quality"] == b["quality"] and a["reports"] == b["reports"]


def test_machine_ceiling_runs_the_kernel_copies_at_once():
    from diffaccel.bench.scale_bench import _kernel_runs

    runs = _kernel_runs(2, 1, 200)
    assert len(runs) == 2 and all(end > start and seconds > 0 for start, end, seconds in runs)
    assert max(r[0] for r in runs) < min(r[1] for r in runs)  # concurrent, not one after the other


def test_machine_ceiling_is_the_throughput_of_the_copies(monkeypatch):
    from diffaccel.bench import scale_bench

    def fake(processes, threads, products):  # one copy alone: 1 s; two at once: 1.25 s, overlapping
        return [(0.0, 1.0, 1.0)] if processes == 1 else [(0.0, 1.25, 1.25), (0.1, 1.3, 1.2)]

    monkeypatch.setattr(scale_bench, "_kernel_runs", fake)
    assert scale_bench.machine_ceiling(2, repeats=2) == (1.6, True)
