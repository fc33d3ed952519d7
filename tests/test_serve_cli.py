"""``diffaccel serve``'s options and presets: a mistake is one line and exit code 2, before the model
loads; and the metrics text reads back."""

from __future__ import annotations

import pytest

from diffaccel.cli.entry import main
from diffaccel.serve.metrics import Metrics, parse

MODEL = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 32\nsteps = 16\n'


@pytest.mark.parametrize("args,message", [
    (["--max-batch", "0"], "--max-batch: must be 1 or more, got 0"),
    (["--queue", "0"], "--queue: must be 1 or more, got 0"),
    (["--batch-window-ms", "-1"], "--batch-window-ms: must be 0 or more, got -1"),
    (["--port", "70000"], "--port: must be at most 65535, got 70000"),
    (["--preset", "fast"], "--preset fast: write NAME=CONFIG.toml"),
    (["--preset", "none=x.toml"], "--preset none=x.toml: 'none' is taken"),
    (["--preset", "a=missing.toml"], "missing.toml"),
    (["--max-body-bytes", "-1"], "--max-body-bytes: must be 1 or more, got -1"),
    (["--max-n", "0"], "--max-n: must be 1 or more, got 0"),
    (["--max-n", "9"], "--max-n: 9 exceeds --max-batch 8"),
    (["--max-prompt-bytes", "-5"], "--max-prompt-bytes: must be 0 or more, got -5"),
    (["--max-prompt-tokens", "-1"], "--max-prompt-tokens: must be 0 or more, got -1"),
    (["--max-streams-per-client", "0"], "--max-streams-per-client: must be 1 or more, got 0"),
    (["--request-timeout", "-2"], "--request-timeout: must be more than 0 seconds, got -2"),
    (["--request-timeout", "0"], "--request-timeout: must be more than 0 seconds, got 0"),
    (["--api-key", ""], "--api-key (number 1): an empty key"),
    (["--api-key", "ok", "--api-key", "has space"], "--api-key (number 2): a key must be printable ASCII"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "text.toml").write_text(MODEL)
    loaded = []
    monkeypatch.setattr("diffaccel.runtime.runs.get_adapter", lambda name: loaded.append(name))  # the model's loading
    assert main(["serve", "text.toml", "--port", "0", *args]) == 2  # port 0: whatever listens on 8000 here
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and err[0].startswith("diffaccel: error: ")
    assert loaded == []  # refused before the model loads


def test_a_preset_of_another_model_is_refused_naming_its_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "text.toml").write_text(MODEL)
    (tmp_path / "other.toml").write_text(MODEL.replace("length = 32", "length = 64"))
    monkeypatch.setattr("diffaccel.runtime.runs.get_adapter", lambda name: pytest.fail("the model was loaded"))
    assert main(["serve", "text.toml", "--port", "0", "--preset", "long=other.toml"]) == 2
    err = capsys.readouterr().err
    assert "other.toml: [model] differs from text.toml's; a preset must serve the same model" in err


def test_a_port_in_use_is_one_line_and_exit_2_before_the_model_loads(tmp_path, monkeypatch, capsys):
    import socket

    monkeypatch.chdir(tmp_path)
    (tmp_path / "text.toml").write_text(MODEL)
    monkeypatch.setattr("diffaccel.runtime.runs.get_adapter", lambda name: pytest.fail("the model was loaded"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "text.toml", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"diffaccel: error: --port {port}: cannot listen on 127.0.0.1:{port}: already in use (another "
                   "server is listening there); choose another --port"]


def test_metrics_render_parses_and_parse_refuses_garbage():
    m = Metrics(max_batch=4)
    m.request_done("/v1/completions", 200, 0.3)
    m.request_done("/v1/completions", 503, 0.01, "server_overloaded")
    m.batch_done("default", 3, {"layers_computed": 10, "layers_skipped": 6, "positions_computed": 30, "positions_total": 120})
    s = parse(m.render())
    assert s['diffaccel_requests_total{endpoint="/v1/completions",status="503"}'] == 1
    assert s['diffaccel_errors_total{type="server_overloaded"}'] == 1
    assert s['diffaccel_batch_rows_bucket{le="2"}'] == 0 and s['diffaccel_batch_rows_bucket{le="3"}'] == 1
    assert s['diffaccel_skipped_compute_fraction{preset="default"}'] == 0.75
    assert s['diffaccel_layer_calls_total{preset="default",result="skipped"}'] == 6
    assert s['diffaccel_request_latency_seconds_bucket{endpoint="/v1/completions",le="0.25"}'] == 1
    assert s['diffaccel_request_latency_seconds_count{endpoint="/v1/completions"}'] == 2
    with pytest.raises(ValueError, match="not a sample line"):
        parse('diffaccel_x{a="1" 3\n')


def test_an_empty_key_in_the_environment_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "text.toml").write_text(MODEL)
    monkeypatch.setenv("DIFFACCEL_API_KEY", "")
    monkeypatch.setattr("diffaccel.runtime.runs.get_adapter", lambda name: pytest.fail("the model was loaded"))
    assert main(["serve", "text.toml", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "DIFFACCEL_API_KEY (key 1 of its comma-separated list): an empty key" in err[0]


@pytest.mark.parametrize("extra,warned", [([], True), (["--api-key", "k1"], False)])
def test_a_public_address_without_a_key_warns_once_before_the_model_loads(tmp_path, monkeypatch, capsys, extra, warned):
    from diffaccel.contract.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "text.toml").write_text(MODEL)
    monkeypatch.delenv("DIFFACCEL_API_KEY", raising=False)

    def load(name):
        raise ConfigError("stopped where the model would load")

    monkeypatch.setattr("diffaccel.runtime.runs.get_adapter", load)
    assert main(["serve", "text.toml", "--host", "0.0.0.0", "--port", "0", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    warnings = [line for line in err if "warning" in line]
    assert warnings == ([f"diffaccel: warning: serving on 0.0.0.0 without an API key: whoever reaches this port can "
                         "generate (--api-key KEY or DIFFACCEL_API_KEY)"] if warned else [])
    assert err[-1] == "diffaccel: error: stopped where the model would load"
