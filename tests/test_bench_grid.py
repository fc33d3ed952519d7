"""``bench --grid`` (a strategy over a parameter grid, validated before loading) and the paired
bootstrap intervals of the bench's ratios (``diffaccel.kit.stats``)."""

from __future__ import annotations

import pytest

from diffaccel.adapters.text.adapter import TextAdapter
from diffaccel.bench.options import BenchOptions
from diffaccel.bench.runner import run_bench
from diffaccel.cli.entry import main
from diffaccel.contract.errors import ConfigError
from diffaccel.bench.grid import parse_grid
from diffaccel.kit.stats import ratio_ci

MODEL = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 16\nsteps = 6\n'


@pytest.fixture
def paths(tmp_path):
    (tmp_path / "base.toml").write_text(MODEL)
    # the old rule (masked positions frozen when stable), where tau decides how many are computed; with fresh
    # commits (the default) every masked position is computed whatever tau
    (tmp_path / "swd.toml").write_text(MODEL + '[[strategy]]\nuse = "swd"\nfresh_commits = false\n')
    return [str(tmp_path / "base.toml"), str(tmp_path / "swd.toml")]


def test_grid_options_are_parsed_as_toml_values():
    (a, b) = parse_grid(["tau=0.05,1", "swd.R=2"])
    assert (a.strategy, a.key, a.values, a.raw) == (None, "tau", (0.05, 1), ("0.05", "1"))
    assert (b.strategy, b.key, b.values) == ("swd", "R", (2,))
    assert parse_grid(["sampler=confidence,true"])[0].values == ("confidence", True)


@pytest.mark.parametrize("spec, message", [
    ("tau", "expected --grid"), ("tau=", "expected --grid"), ("=1,2", "expected --grid"),
    ("tau=1,,2", "expected --grid"), ("tau=1,1", "listed twice"),
])
def test_malformed_grid_options_are_one_line(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_grid([spec])


def test_a_grid_expands_the_strategy_into_entries_named_by_their_values(paths):
    result = run_bench(paths, BenchOptions(seeds=2, progress=False, noise_floor=False, judge=None, timed=False,
                                           grid=parse_grid(["tau=0.001,0.5"])))
    names = [e.name for e in result.entries]
    assert names == ["baseline", "swd[tau=0.001]", "swd[tau=0.5]"]
    computed = {e.name: e.fraction_computed for e in result.entries}
    assert computed["swd[tau=0.5]"] != computed["swd[tau=0.001]"]  # each value reached its strategy


@pytest.fixture
def no_loading(monkeypatch):
    def load(config):
        raise AssertionError("the model loaded before the grid was checked")
    monkeypatch.setattr(TextAdapter, "load", staticmethod(load))


@pytest.mark.parametrize("grid, message", [
    ("tau=-1,0.1", "swd.toml (--grid tau=-1): [[strategy]] #1 (swd): key 'tau'"),
    ("tau=abc", "key 'tau': expected a number"),
    ("nope=1,2", "no strategy of the config has a key 'nope'"),
    ("topk.k=1", "the config has no [[strategy]] use = 'topk'"),
])
def test_a_bad_grid_value_is_refused_before_the_model_loads(paths, no_loading, capsys, grid, message):
    assert main(["bench", *paths, "--grid", grid, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_the_speedup_interval_is_paired_by_seed():
    """Seeds that differ tenfold in cost, each run twice as fast by the entry: paired, the ratio is
    exactly 2 in every resample; resampling each side on its own would scatter it widely."""
    base = [1.0, 10.0, 3.0, 30.0, 5.0]
    assert ratio_ci(base, [b / 2 for b in base]) == pytest.approx((2.0, 2.0))
    lo, hi = ratio_ci(base, [b / 2 * f for b, f in zip(base, (1.0, 1.2, 0.9, 1.1, 1.0))])
    assert lo < 2.0 / 1.05 < hi and hi - lo < 0.5
    assert ratio_ci([1.0], [1.0]) is None and ratio_ci([1.0, float("nan")], [1.0, 1.0]) is None


def test_bench_reports_intervals_beside_each_ratio(paths):
    result = run_bench(paths, BenchOptions(seeds=3, progress=False, noise_floor=False, judge=None))
    swd = result.entries[1]
    lo, hi = swd.speedup_ci
    assert lo <= swd.speedup <= hi
    assert set(swd.quality_ci) <= set(swd.quality) and "agreement" in swd.quality_ci
    assert swd.quality_ratio_ci and set(swd.quality_ratio_ci) <= set(result.entries[0].quality_ci)
    for e in result.entries:  # each pooled metric's interval holds its point (distinct-n over all samples)
        for k, (lo, hi) in e.quality_ci.items():
            assert lo <= e.quality[k] <= hi, (e.name, k)
    base = result.entries[0].quality
    for k, (lo, hi) in swd.quality_ratio_ci.items():
        assert lo <= swd.quality[k] / base[k] <= hi, k
    quick = run_bench(paths[1:], BenchOptions(seeds=1, progress=False, noise_floor=False, judge=None))
    assert quick.entries[1].speedup_ci is None and not quick.entries[1].has("quality_ci")


def test_a_failing_plot_is_a_warning_naming_the_strategy_and_the_figures_stay(paths, tmp_path, monkeypatch):
    import diffaccel_swd.strategy as swd_strategy

    from diffaccel import hookimpl
    from diffaccel.runtime.registry import PluginWarning

    @hookimpl
    def broken(self, reports, path):
        raise KeyError("anchored_by_step")

    monkeypatch.setattr(swd_strategy.SWD, "diffaccel_bench_plot", broken, raising=False)
    with pytest.warns(PluginWarning, match="strategy 'swd': its bench plot failed .KeyError"):
        result = run_bench(paths, BenchOptions(seeds=1, progress=False, noise_floor=False, judge=None, timed=False,
                                               plot_dir=str(tmp_path / "plots")))
    assert [e.name for e in result.entries][-1] == "swd" and result.entries[-1].quality
