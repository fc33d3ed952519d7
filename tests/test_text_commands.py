"""Text adapter through the command line: diffaccel partial, bench --batch and --quality-only (split from test_text_adapter.py)."""

import pytest

from diffaccel.cli.entry import main
from diffaccel.contract.errors import ConfigError



def test_generate_of_a_config_with_peers_is_quiet_about_them_unless_debugging(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DIFFACCEL_DEBUG", raising=False)
    cfg = tmp_path / "peers.toml"
    cfg.write_text('[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 8\nsteps = 2\n'
                   '[[peer]]\nuse = "steps"\nsteps = 1\n')
    out = str(tmp_path / "out.txt")
    assert main(["generate", str(cfg), "--out", out, "--no-progress"]) == 0
    assert "[[peer]]" not in capsys.readouterr().err  # valid for bench and generate: no note
    assert main(["generate", str(cfg), "--out", out, "--no-progress", "--debug"]) == 0
    assert "[[peer]] tables (steps) are compared by 'diffaccel bench' only" in capsys.readouterr().err


def test_partial_command_prints_every_fraction_down_to_the_floor(tmp_path, capsys):
    cfg = tmp_path / "b2.toml"
    cfg.write_text('[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 32\n')
    assert main(["partial", str(cfg), "--repeats", "2", "--threads", "1", "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "batch 2, 32 positions" in out
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [r[0] for r in rows] == ["100%", "50%", "25%", "15%", "10%", "5%", "1"]
    assert rows[0][-1] == "1.00x" and all(r[-1].endswith("x") for r in rows)


def test_bench_batch_overrides_every_configs_batch(tmp_path, capsys):
    from diffaccel.bench.options import BenchOptions
    from diffaccel.bench.runner import run_bench

    model = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 16\nsteps = 4\n'
    (tmp_path / "base.toml").write_text(model)
    (tmp_path / "swd.toml").write_text(model + '[[strategy]]\nuse = "swd"\n')
    result = run_bench([str(tmp_path / "base.toml"), str(tmp_path / "swd.toml")],
        BenchOptions(seeds=2, batch=3, noise_floor=False, progress=False))
    assert result.model.batch == 3 and result.seeds == [0, 3]  # no row generated twice
    assert [e.name for e in result.entries] == ["baseline", "swd"]
    base = result.entries[0].reports
    assert all(r["counters"]["positions_total"] == 3 * 16 * 4 * 4 for r in base)  # rows x positions x layers x steps
    assert main(["bench", str(tmp_path / "base.toml"), "--batch", "0", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--batch must be 1 or more, got 0" in err and "Traceback" not in err


def test_quality_only_bench_runs_each_entry_once_per_seed_untimed(tmp_path, capsys, monkeypatch):
    from diffaccel.runtime.adapters_registry import get_adapter
    from diffaccel.bench.options import BenchOptions
    from diffaccel.bench.runner import format_table, run_bench

    model = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 16\nsteps = 4\n'
    (tmp_path / "base.toml").write_text(model)
    (tmp_path / "swd.toml").write_text(model + '[[strategy]]\nuse = "swd"\n')
    paths = [str(tmp_path / "base.toml"), str(tmp_path / "swd.toml")]
    timed = run_bench(paths, BenchOptions(seeds=2, noise_floor=False, progress=False, judge=None))
    adapter = get_adapter("text")
    calls = []
    real_run = adapter.run
    monkeypatch.setattr(adapter, "run", lambda *a, **k: calls.append(a[2]) or real_run(*a, **k))
    result = run_bench(paths, BenchOptions(seeds=2, noise_floor=False, progress=False, judge=None, timed=False))
    assert calls == [0, 0, 1, 1]  # no warm-up: two entries, once per seed
    assert result.timed is False and [e.speedup for e in result.entries] == [None, None]
    for a, b in zip(timed.entries, result.entries):  # the same outputs as the timed bench's
        assert a.quality == b.quality
    assert format_table(result).splitlines()[3].split()[1] == "-"
    with pytest.raises(ConfigError, match="--repeats 2: a quality-only bench runs each seed once"):
        run_bench(paths, BenchOptions(seeds=2, repeats=2, timed=False, progress=False))
    assert main(["bench", *paths, "--quality-only", "--report", str(tmp_path / "r"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--report: not available with --quality-only" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()
