"""A batch whose clients all went away stops at its next step (``run.stop``): the steps left are
never computed. Checked on the engine (text and the digits UNet) and through a real server."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from diffaccel.serve.engine import Batch, Engine, Work
from diffaccel.serve.launch import start_server
from diffaccel.serve.metrics import parse

TEXT = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 32\nsteps = 16\n'
DIGITS = '[model]\nadapter = "unet"\ncheckpoint = "digits"\nsteps = 10\nprompts = ["digit 3"]\n'


@pytest.mark.parametrize("config, kind", [(TEXT, "text"), (DIGITS, "image")])
def test_a_set_stop_event_ends_the_run_at_its_next_step(tmp_path, config, kind):
    path = tmp_path / "serve.toml"
    path.write_text(config)
    engine = Engine(str(path))
    batch = Batch(Work(kind, "default"), ["digit 3"] * 2 if kind == "image" else ["", ""], [1, 2])
    full = engine.run(batch)
    stop = threading.Event()
    unset = engine.run(batch, stop)  # an event that is never set changes nothing
    stop.set()
    stopped = engine.run(batch, stop)
    assert full.report["steps_run"] == unset.report["steps_run"] == full.report["steps"]
    assert stopped.report["steps_run"] == 1
    assert stopped.report["counters"]["layers_computed"] < full.report["counters"]["layers_computed"] / 2
    if kind == "text":
        assert unset.texts == full.texts
    else:
        assert unset.images.equal(full.images)


def test_a_batch_whose_client_went_away_stops(tmp_path):
    path = tmp_path / "long.toml"
    path.write_text('[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 128\nsteps = 16\n')
    with start_server(str(path), "--max-batch", "8", "--batch-window-ms", "0") as server:
        with pytest.raises(httpx.ReadTimeout):  # the batch (4096 steps) runs far longer than this
            httpx.post(f"{server.url}/v1/completions", json={"n": 2, "seed": 1, "diffaccel": {"steps": 4096}},
                       timeout=1.0)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = parse(httpx.get(f"{server.url}/metrics", timeout=10).text)
            if m["diffaccel_stopped_batches_total"] == 1:
                break
            time.sleep(0.05)
        assert m["diffaccel_stopped_batches_total"] == 1
        assert m["diffaccel_dropped_rows_total"] == 2
        # the worker is free again long before 4096 steps would have ended: a short request answers
        r = httpx.post(f"{server.url}/v1/completions", json={"seed": 1, "diffaccel": {"steps": 8}}, timeout=60)
        assert r.status_code == 200, r.text
