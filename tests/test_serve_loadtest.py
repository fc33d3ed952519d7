"""The load test (``diffaccel serve-loadtest``): a small real run against the shipped
text model, and its checks on made-up figures (a lost or mixed row, a 5xx, RSS growth fail it)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from diffaccel.serve.loadtest import finish, markdown, markers

CONFIG = '[model]\nadapter = "text"\ncheckpoint = "wordnet-masked"\nlength = 32\nsteps = 16\n[[strategy]]\nuse = "swd"\n'


def test_a_small_load_run_passes_its_checks(tmp_path):
    config = tmp_path / "text.toml"
    config.write_text(CONFIG)
    doc = tmp_path / "serve.md"
    BEGIN, END = markers("text")
    doc.write_text(f"# Serving\n\nprose kept\n\n{BEGIN}\nold figures\n{END}\n\nmore prose\n")
    out = tmp_path / "load.json"
    cmd = [str(Path(sys.executable).parent / "diffaccel"), "serve-loadtest", str(config), "--requests", "12", "--clients", "4",
           "--max-batch", "4", "--batch-window-ms", "50", "--offline", "3", "--no-single", "--time-limit", "240",
           "--json", str(out), "--markdown", str(doc)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    report = json.loads(out.read_text())
    m = report["modes"]["batched"]
    assert m["ok"] == 12 and m["errors"] == {} and m["status_5xx"] == 0
    assert m["mean_batch_rows"] > 1  # four clients at once: requests shared batches
    assert m["p50_s"] <= m["p95_s"] <= m["p99_s"]
    assert report["checks"] == {"no_5xx": True, "offline_checked": 3, "offline_equal": 3,
                                "rss_growth_ok": True, "passed": True}
    text = doc.read_text()
    assert text.startswith("# Serving\n\nprose kept\n") and text.endswith(f"{END}\n\nmore prose\n")
    assert "old figures" not in text and "3 of 3 responses checked equal the offline run" in text


def _report(payloads_batched, payloads_single, status_5xx=0, growth=5.0):
    mode = {"wall_s": 1.0, "ok": 3, "throughput_rps": 3.0, "p50_s": 0.1, "p95_s": 0.2, "p99_s": 0.3, "errors": {},
            "status_5xx": status_5xx, "mean_batch_rows": 2.0, "rss_mb_after_warmup": 500.0, "rss_mb_end": 500.0 + growth,
            "rss_growth_mb": growth}
    return {"requests": 3, "clients": 2, "rounds": 1, "kind": "text", "max_batch": 4, "batch_window_ms": 10.0,
            "machine": {"cpus": 2, "omp_threads": "1", "note": "shared"},
            "modes": {"batched": {**mode, "payloads": payloads_batched},
                      "single": {**mode, "throughput_rps": 1.0, "payloads": payloads_single}}}


def test_the_checks_fail_on_a_mixed_row_a_5xx_or_memory_growth():
    a = argparse.Namespace(offline=0, rss_limit_mb=100.0, requests=3)
    rows = [["x"], ["y"], ["z"]]
    good = finish(a, _report(rows, list(rows)), [], "text")
    assert good["checks"]["passed"] and good["checks"]["batched_equals_single"] == 3
    assert good["speedup_batched_over_single"] == 3.0
    mixed = finish(a, _report([["x"], ["z"], ["y"]], rows), [], "text")
    assert not mixed["checks"]["passed"] and mixed["checks"]["batched_equals_single"] == 1
    assert not finish(a, _report(rows, rows, status_5xx=1), [], "text")["checks"]["passed"]
    assert not finish(a, _report(rows, rows, growth=150.0), [], "text")["checks"]["passed"]
    md = markdown(good, "diffaccel serve-loadtest x.toml")
    assert "Batching raises throughput 3.00x over one request at a time" in md and "shared" in md


def test_a_small_fault_run_answers_every_request_and_leaves_the_outputs_unchanged(tmp_path):
    """``--faults`` with 40 requests: 20 well-behaved ones twice, and each faulty kind at least once."""
    config = tmp_path / "blocks.toml"
    config.write_text(CONFIG.replace("steps = 16\n", "steps = 8\nblock_size = 8\n"))
    out = tmp_path / "faults.json"
    cmd = [str(Path(sys.executable).parent / "diffaccel"), "serve-loadtest", str(config), "--faults", "--requests", "40", "--clients", "4",
           "--fault-clients", "4", "--max-batch", "4", "--batch-window-ms", "50", "--offline", "2",
           "--request-timeout", "30", "--time-limit", "400", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    report = json.loads(out.read_text())
    from diffaccel.serve.faults import KINDS

    assert set(report["kinds"]) == set(KINDS) and sum(k["sent"] for k in report["kinds"].values()) == 20
    assert report["kinds"]["stalled_body"]["statuses"] == {"408": 1}
    assert report["kinds"]["wrong_key"]["statuses"] == {"401": 2}
    assert report["server_answers"].get("413") == report["kinds"]["oversized"]["sent"]
    c = report["checks"]
    assert c["same_with_faults"] == 20 and c["offline_equal"] == 2 and c["none_lost"] and c["none_hung"] and c["passed"]
    assert report["mixed"]["ok"] == report["clean"]["ok"] == 20


def test_a_fault_answered_with_another_status_or_none_is_counted_unexpected():
    from diffaccel.serve.faults import fault_kinds, tally

    kinds = fault_kinds(1000, seed=1)
    assert len(kinds) == 1000 and kinds.count("disconnect_waiting") == 200 and kinds.count("stalled_body") == 40
    got = tally([{"kind": "oversized", "status": 413, "error": None, "seconds": 0.1},
                 {"kind": "oversized", "status": 400, "error": None, "seconds": 0.2},
                 {"kind": "stalled_body", "status": None, "error": "TimeoutError", "seconds": 35.0},
                 {"kind": "disconnect_waiting", "status": None, "error": None, "seconds": 0.3}])
    assert got["oversized"] == {"sent": 2, "statuses": {"413": 1, "400": 1}, "max_s": 0.2, "unexpected": 1}
    assert got["stalled_body"]["unexpected"] == 1 and got["stalled_body"]["statuses"] == {"TimeoutError": 1}
    assert got["disconnect_waiting"]["unexpected"] == 0 and got["disconnect_waiting"]["statuses"] == {"closed": 1}


def test_counts_out_of_range_are_one_line_and_exit_2(tmp_path, capsys):
    from diffaccel.cli.entry import main

    config = tmp_path / "text.toml"
    config.write_text(CONFIG)
    assert main(["serve-loadtest", str(config), "--clients", "0"]) == 2
    err = capsys.readouterr().err
    assert "--clients: must be 1 or more, got 0" in err and "Traceback" not in err
