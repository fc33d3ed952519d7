"""A tune's report folder as a section of a combined page (docs/benchmarks.md): the held-out
figures of each re-measured point, which one was chosen, and the trial plots linked from the page."""

from __future__ import annotations

import json

from diffaccel.bench.report import combine
from diffaccel.tuning.tune_report import tune_blocks


def _tune_folder(tmp_path, chosen="tune-trial-3"):
    folder = tmp_path / "tune-x"
    folder.mkdir()
    fig = lambda s1, s8, acc, met: {  # noqa: E731
        "speedup": {"1": s1, "8": s8}, "speedup_ci": {"1": [s1 - 0.1, s1 + 0.1], "8": None},
        "quality": {"cond_acc": {"value": acc, "baseline": 0.9, "interval": [acc - 0.05, acc + 0.05]}},
        "met": {"acc>=-0.02": met}, "samples": 40}
    data = {"budgets": ["acc>=-0.02"], "points": {}, "chosen": chosen, "shipped": "digits-tune",
            "figures": {"digits-tune": fig(3.0, 3.2, 0.7, False), "tune-trial-3": fig(2.0, 2.1, 0.9, True)},
            "trials": 24, "stopped_early": 5, "tune_seeds": [0, 10], "batch": 10, "heldout": 40, "heldout_seed": 100000}
    (folder / "tune.json").write_text(json.dumps(data))
    (folder / "trials-cond_acc.png").write_bytes(b"png")
    return folder


def test_every_re_measured_point_is_a_row_and_the_chosen_one_is_marked(tmp_path):
    blocks = tune_blocks(_tune_folder(tmp_path), "tune-x", "diffaccel tune ...")
    (table,) = [b for b in blocks if b[0] == "table"]
    head, rows = table[1], table[2]
    assert head[:3] == ["entry", "speedup b1", "speedup b8"] and "cond_acc" in head
    by_entry = {r[0]: r for r in rows}
    assert by_entry["tune-trial-3 (chosen)"][-1] == "yes"
    assert by_entry["digits-tune (as given)"][-1] == "no"  # faster, but over budget on the held-out seeds
    assert [b[1] for b in blocks if b[0] == "img"] == ["trials-cond_acc.png"]


def test_a_tune_that_chose_nothing_says_so(tmp_path):
    blocks = tune_blocks(_tune_folder(tmp_path, chosen=None), "tune-x", "diffaccel tune ...")
    assert any(b[0] == "p" and "no config was written" in b[1] for b in blocks)


def test_combined_page_links_the_tune_plots_from_the_page(tmp_path):
    folder = _tune_folder(tmp_path)
    page = tmp_path / "docs" / "benchmarks.md"
    combine([], page, tmp_path / "docs" / "index.html", title="T", intro="i",
            extra=[(folder, tune_blocks(folder, "tune-x", "cmd"))])
    assert "](../tune-x/trials-cond_acc.png)" in page.read_text()


def test_the_tune_time_is_read_from_its_sessions(tmp_path):
    folder = _tune_folder(tmp_path)
    data = json.loads((folder / "tune.json").read_text())
    data["sessions"] = [{"started": "2026-12-03T15:00:00", "wall_s": 600.0, "trials_before": 0, "trials_after": 10},
                        {"started": "2026-12-03T16:00:00", "wall_s": 300.0, "trials_before": 10, "trials_after": 24}]
    (folder / "tune.json").write_text(json.dumps(data))
    (intro,) = [b[1] for b in tune_blocks(folder, "tune-x", "diffaccel tune ...") if b[0] == "p" and b[1].startswith("Budget")]
    assert "15.0 minutes of wall time over 2 sessions" in intro and "5.0 min (14 trials)" in intro
