"""What a bench entry costs beside its speed (issue 39): the device synchronised around each timed
run (and the JSON saying so), the bytes each strategy's state holds (``diffaccel_memory``, or the
core's count of its ``run.state`` tensors), the process's peak RSS, and both in the tables."""

from __future__ import annotations

import attrs
import pytest
import torch

import diffaccel
from diffaccel import hookimpl
from diffaccel.runtime import placement
from diffaccel.adapters.text.testing import tiny_text_pipeline
from diffaccel.bench.options import BenchOptions
from diffaccel.bench.runner import format_table, run_bench
from diffaccel.runtime.memory import memory_cell, state_bytes
from diffaccel.runtime.placement import DeviceClock
from diffaccel.bench.report import table

MODEL = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 16\nsteps = 6\n'


def test_the_clock_synchronises_an_accelerator_around_each_region(monkeypatch):
    calls = []
    monkeypatch.setattr(placement, "sync", lambda device: calls.append(str(device)) or True)
    clock = DeviceClock("cuda:0", warmup_runs=1)
    with clock.region() as r:
        calls.append("work")
    assert calls == ["cuda:0", "work", "cuda:0"] and r.seconds > 0
    assert clock.describe()["synchronize"] == "device synchronised before and after each timed run"


def test_on_the_cpu_nothing_is_synchronised():
    assert placement.sync("cpu") is False
    clock = DeviceClock("cpu")
    with clock.region():
        pass
    assert clock.describe() == {"device": "cpu", "clock": "time.perf_counter", "warmup_runs": 0,
                                "synchronize": "none: the CPU runs ops eagerly"}


@attrs.define
class _Held:
    a: torch.Tensor
    view: torch.Tensor
    rows: list


def test_state_bytes_counts_each_storage_once():
    a = torch.zeros(10, 4)  # 160 bytes
    held = _Held(a=a, view=a[2:], rows=[torch.zeros(3, dtype=torch.bfloat16), {"k": torch.ones(2, dtype=torch.int64)}])
    assert state_bytes(held) == 160 + 6 + 16


class Hoarder:
    """Keeps every layer input of the run in its state (bytes known in advance)."""

    name = "hoarder"

    @hookimpl
    def diffaccel_new_state(self, run):
        return {"kept": []}

    @hookimpl
    def diffaccel_layer_output(self, run, layer, hidden):
        run.state(self)["kept"].append(hidden.clone())
        return None


class Declares(Hoarder):
    name = "declares"

    @hookimpl
    def diffaccel_memory(self, run):
        return 12345


def test_the_run_report_says_what_each_strategy_held():
    pipe = tiny_text_pipeline("masked", max_len=16)
    with diffaccel.apply(pipe, strategies=[Hoarder(), Declares()]) as p:
        out = p(length=16, steps=3, seed=0, progress=False, batch=2)
    layer_input = 2 * 16 * 32 * 4  # (batch, length, dim) float32
    assert out.report["memory"] == {"state_bytes": {"hoarder": 3 * 2 * layer_input, "declares": 12345}}
    with diffaccel.apply(pipe, strategies=[]) as p:
        assert "memory" not in p(length=16, steps=3, seed=0, progress=False).report


def test_bench_entries_carry_their_memory_and_timing(tmp_path):
    (tmp_path / "base.toml").write_text(MODEL)
    (tmp_path / "ta.toml").write_text(MODEL + '[[strategy]]\nuse = "time-anchor"\nwarmup = 1\n')
    result = run_bench([str(tmp_path / "base.toml"), str(tmp_path / "ta.toml")],
        BenchOptions(seeds=1, progress=False, noise_floor=False, judge=None))
    base, ta = result.entries
    assert base.memory.to_dict() == {"state_mb": 0.0} and ta.memory.state_mb > 0
    assert ta.memory.state_mb * 2**20 == max(sum(r["memory"]["state_bytes"].values()) for r in ta.reports)
    assert result.timing.synchronize == "none: the CPU runs ops eagerly" and result.timing.warmup_runs == 1
    assert result.model.dtype == "float32" and result.memory.process_peak_rss_mb > 0
    assert "state MB" in format_table(result).splitlines()[1]
    head, rows = table(result)
    assert head[3] == "state MB" and rows[1][3] == memory_cell(ta.memory)


def test_the_cell_shows_the_device_peak_over_the_baseline():
    assert memory_cell({"state_mb": 1.5, "device_peak_mb": 900.0, "over_baseline_mb": 12.4}) == "1.50 (+12)"
    assert memory_cell(None) == "-"


def test_max_cache_mb_drops_a_strategy_that_outgrows_it_and_says_so():
    """A step's layer inputs are 16 KiB here (4 x 16 x 32 float32, two layers): a bound of 0.05 MiB
    holds three steps' worth; before step 4 the strategy holds four and is dropped."""
    from diffaccel.runtime.accelerator import Accelerator

    pipe = tiny_text_pipeline("masked", max_len=16)
    hoarder = Hoarder()
    pipe.accelerator = Accelerator([hoarder], "text", max_cache_mb={"hoarder": 0.05})
    try:
        out = pipe(length=16, steps=6, seed=0, progress=False, batch=4)
    finally:
        pipe.accelerator = None
    (dropped,) = out.report["reliability"]["disabled"]
    assert dropped["strategy"] == "hoarder" and dropped["hook"] == "pre_step" and dropped["step"] == 4
    assert dropped["error"].startswith("max_cache_mb: its state held 0.06 MiB, over the bound of 0.05 MiB")
    assert "memory" not in out.report  # dropped and released: nothing held at the end


def test_max_cache_mb_in_a_config(tmp_path):
    cfg = diffaccel.parse_config({"model": {"adapter": "text", "checkpoint": "wordnet-masked", "length": 16, "steps": 6},
                                  "strategy": [{"use": "time-anchor", "warmup": 1, "max_cache_mb": 0.0001}]})
    assert cfg.strategies[0].max_cache_mb == 0.0001
    pipe = diffaccel.load_pipeline(cfg)
    with diffaccel.apply(pipe, cfg) as p:
        out = p(length=16, steps=6, seed=0, progress=False)
    assert [d["strategy"] for d in out.report["reliability"]["disabled"]] == ["time-anchor"]
    with pytest.raises(diffaccel.ConfigError, match=r"\[\[strategy\]\] #1 \(swd\): key 'max_cache_mb': must be a positive "
                                                    r"number of MiB, got 0$"):
        diffaccel.parse_config({"model": {"adapter": "text"}, "strategy": [{"use": "swd", "max_cache_mb": 0}]})
