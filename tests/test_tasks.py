"""Task models (adapters/text/tasks): deterministic problems, a disjoint held-out split, exact
scoring, prompts checked before any model loads, the training recipe, and the adapter's task mode."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from diffaccel.adapters.text.tasks import PromptError, arith, is_held_out, sudoku, task_spec
from diffaccel.adapters.text.tasks.common import HELD_OUT_EVERY, solution_ids
from diffaccel_models.text.tasks.train import Sampler, TaskTrainConfig, encode, masked_loss, train_task
from diffaccel.tuning.budget import parse
from diffaccel.cli.entry import main


def _lines(problem):
    return ["".join(t.replace("\u2581", " ") for t in line) for line in problem.solution]


@pytest.mark.parametrize("name,grid", [("arith", 9), ("sudoku", 9), ("sudoku", 6), ("sudoku", 4)])
def test_problems_are_deterministic_and_fit_the_model(name, grid):
    spec = task_spec(name, grid)
    tok = spec.tokenizer()
    a = [spec.problem(s) for s in range(200)]
    assert a == [spec.problem(s) for s in range(200)]
    assert len({p.prompt for p in a}) > 190  # seeds give different problems
    ids, gen = encode(spec, tok, a)
    assert ids.shape == (200, spec.max_len)
    assert tok.unk_id not in ids.tolist()[0] and not (ids == tok.unk_id).any()
    # the longest generation takes exactly the full steps, one token per step
    assert int(gen.sum(1).max()) <= spec.steps
    assert all(spec.score(p, _lines(p)) == {spec.metrics[0]: 1.0, spec.metrics[1]: 1.0} for p in a)


@pytest.mark.parametrize("name,grid", [("arith", 9), ("sudoku", 6)])
def test_heldout_split_is_disjoint_from_training(name, grid):
    spec = task_spec(name, grid)
    held = [spec.heldout(i) for i in range(300)]
    assert all(is_held_out(p.prompt) for p in held)
    assert held == [spec.heldout(i) for i in range(300)]  # bench seed i: always the same problem
    assert len({p.prompt for p in held}) == 300
    sampler = Sampler(spec, seed=0)
    train = [sampler.draw(spec.levels) for _ in range(3000)]
    assert not any(is_held_out(p.prompt) for p in train)
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    # the split rejected about one problem in HELD_OUT_EVERY (it is a real split, not an empty one)
    assert 0.5 / HELD_OUT_EVERY < sampler.rejected / sampler.drawn < 2.0 / HELD_OUT_EVERY


def test_arith_scores_final_answer_and_equations():
    p = arith.parse("Tom has 12 apples. He buys 5 more. He gives away 3. He doubles them. How many apples does Tom have now?")
    assert p.answer == "28"
    assert _lines(p) == ["12+05=17", "17-03=14", "14*02=28", "#### 28"]
    assert arith.score(p, _lines(p)) == {"acc": 1.0, "steps_acc": 1.0}
    wrong_eq = ["12+05=17", "17-03=15", "15*02=30", "#### 30"]
    assert arith.score(p, wrong_eq) == {"acc": 0.0, "steps_acc": pytest.approx(1 / 3)}
    right_answer_bad_steps = ["12+05=17", "17-03=14", "14*02=29", "#### 28"]
    assert arith.score(p, right_answer_bad_steps) == {"acc": 1.0, "steps_acc": pytest.approx(2 / 3)}
    assert arith.score(p, ["12+05=17", "17-03=14", "14*02=28"])["acc"] == 0.0  # no final line
    assert arith.score(p, [])["acc"] == 0.0


def test_sudoku_scores_valid_grids_keeping_givens():
    p = sudoku.problem(3, n=6)
    grid = np.array([int(c) for c in p.answer]).reshape(6, 6)
    good = ["".join(map(str, r)) for r in grid]
    assert sudoku.score(p, good, n=6) == {"acc": 1.0, "cells_acc": 1.0}
    swapped = grid.copy()
    blank = [i for i, c in enumerate(p.prompt) if c == "0"]
    r, c = divmod(blank[0], 6)
    swapped[r, c] = swapped[r, c] % 6 + 1  # one blank cell wrong: the grid is no longer valid
    got = sudoku.score(p, ["".join(map(str, row)) for row in swapped], n=6)
    assert got["acc"] == 0.0 and got["cells_acc"] == pytest.approx(1 - 1 / len(blank))
    # a valid grid that changes a given is not a solution
    relabelled = (grid % 6) + 1
    assert sudoku.valid(relabelled)
    assert sudoku.score(p, ["".join(map(str, row)) for row in relabelled], n=6)["acc"] == 0.0
    assert sudoku.score(p, good[:5], n=6) == {"acc": 0.0, "cells_acc": 0.0}


@pytest.mark.parametrize("prompt,fragment", [
    ("What is 2 plus 2?", "expected an arith problem: '<Name> has <n> <items>.'"),
    ("Tom has 12 apples. He buys 5 more. How many apples does Tom have now?", "2 to 4"),
    ("Tom has 12 apples. He eats 5. He buys 2 more. How many apples does Tom have now?", "sentence 'He eats 5.'"),
    ("Tom has 90 apples. He buys 5 more. He doubles them. How many apples does Tom have now?", "outside 1..99"),
    ("Tom has 12 apples. He buys 5 more. He buys 1 more. How many pens does Tom have now?", "expected an arith"),
])
def test_arith_refuses_prompts_of_another_shape(prompt, fragment):
    with pytest.raises(PromptError, match="expected an arith problem") as exc:
        arith.parse(prompt)
    assert fragment in str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("prompt,fragment", [
    ("1234", "got 4 cells"), ("12x0" * 9, "characters 'x'"), ("7" + "0" * 35, "characters '7'"),
    ("110000" + "0" * 30, "repeat a digit"),
])
def test_sudoku_refuses_prompts_of_another_shape(prompt, fragment):
    with pytest.raises(PromptError) as exc:
        sudoku.parse(prompt, n=6)
    assert fragment in str(exc.value)


def _tiny_task_model(tmp_path, name="arith", grid=9):
    cfg = TaskTrainConfig(task=name, grid=grid, out=str(tmp_path / "m"), steps=4, batch=4, dim=32, layers=1, heads=2,
                          eval_every=2, eval_n=2, bf16=False)
    train_task(cfg)
    return tmp_path / "m"


def _config(tmp_path, folder, name="arith", extra=""):
    spec = task_spec(name, 6 if name == "sudoku" else 9)
    path = tmp_path / f"{name}.toml"
    grid = "grid = 6\n" if name == "sudoku" else ""
    path.write_text(f'[model]\nadapter = "text"\ncheckpoint = "{folder}"\ntask = "{name}"\n{grid}length = {spec.max_len}\n'
                    f"seed = 0\nbatch = 2\ntemperature = 0.0\n{extra}")
    return path


def test_training_lowers_the_loss_and_resumes(tmp_path):
    spec = task_spec("arith")
    tok = spec.tokenizer()
    ids, gen = encode(spec, tok, [spec.problem(s) for s in range(16)])
    out = _tiny_task_model(tmp_path)
    from diffaccel.adapters.text.sampling.model import TextDiffusionLM

    def loss_of(model):
        with torch.no_grad():
            return masked_loss(model, ids, gen, torch.Generator().manual_seed(5))[0].item()

    first = TextDiffusionLM.load(out)
    facts = json.loads((out / "train.json").read_text())
    assert facts["steps_done"] == 4 and [e["step"] for e in facts["eval"]["history"]] == [2, 4]
    # resume: 20 more steps continue from step 4 (the history keeps the first four losses)
    cfg = TaskTrainConfig(task="arith", out=str(out), steps=24, batch=16, lr=3e-3, dim=32, layers=1, heads=2,
                          eval_every=20, eval_n=2, bf16=False)
    before = torch.load(out / "ckpt.pt", weights_only=False)["history"]["loss"]
    train_task(cfg)
    after = torch.load(out / "ckpt.pt", weights_only=False)
    assert after["step"] == 24 and after["history"]["loss"][:4] == before
    trained = TextDiffusionLM(first.config)
    trained.load_state_dict(after["model"])
    assert loss_of(trained) < loss_of(first) - 0.2
    assert (out / "curves.png").stat().st_size > 1000


def test_budget_acc_names_the_task_metric():
    assert parse("acc>=-0.01", ["acc", "steps_acc", "agreement"]).metric == "acc"
    assert parse("acc>=-0.01", ["cond_acc", "psnr"]).metric == "cond_acc"  # the digits models' alias still holds


def test_bad_prompt_exits_2_before_the_model_loads(tmp_path, capsys):
    cfg = _config(tmp_path, tmp_path / "no-such-model")  # nothing to load: the prompt is refused first
    assert main(["generate", str(cfg), "--prompt", "Solve x + 2 = 5."]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a problem of task 'arith'" in err and "expected an arith problem" in err
    cfg = _config(tmp_path, tmp_path / "no-such-model", "sudoku")
    assert main(["generate", str(cfg), "--prompt", "1" * 81]) == 2
    assert "6x6 sudoku" in capsys.readouterr().err


def test_adapter_reports_task_scores_with_intervals(tmp_path):
    from diffaccel.bench.options import BenchOptions
    from diffaccel.bench.runner import run_bench

    folder = _tiny_task_model(tmp_path)
    keep: dict = {}
    res = run_bench([str(_config(tmp_path, folder))],
        BenchOptions(seeds=3, timed=False, noise_floor=False, progress=False, judge="default"), keep_outputs=keep)
    base = res.entries[0]
    assert not res.has("judge")  # no judge for a task model, even when the default is asked
    scores = [s for o in keep["baseline"] for s in o.task_scores]
    assert len(scores) == 6
    # the pooled figures are the rows' scores, recomputed here from the texts the run wrote
    spec = task_spec("arith")
    again = [spec.score(spec.heldout(i), o.split("\n")[1:]) for i, o in enumerate(t for o in keep["baseline"] for t in o.texts)]
    assert again == scores
    assert base.quality["acc"] == pytest.approx(np.mean([s["acc"] for s in scores]))
    assert base.quality["steps_acc"] == pytest.approx(np.mean([s["steps_acc"] for s in scores]))
    assert set(base.quality_ci) >= {"acc", "steps_acc"}


def test_generate_solves_a_users_problem(tmp_path, capsys):
    folder = _tiny_task_model(tmp_path)
    prompt = "Ann has 7 pens. She buys 3 more. She doubles them. How many pens does Ann have now?"
    assert main(["generate", str(_config(tmp_path, folder)), "--prompt", prompt, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.count(prompt) == 2  # both rows of the batch solve the user's problem, each printed after it


def test_damaged_task_checkpoint_is_one_line(tmp_path, capsys):
    folder = _tiny_task_model(tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    capsys.readouterr()  # the training's progress bar
    assert main(["generate", str(_config(tmp_path, folder)), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model.safetensors" in err


def test_tune_budget_on_acc_needs_no_judge():
    from diffaccel.runtime.adapters_registry import get_adapter
    from diffaccel.runtime.config import load_config
    from diffaccel.runtime.registry import Registry
    from diffaccel.tuning.tuner import reported_metrics

    registry = Registry()
    cfg = load_config("configs/arith-tune.toml", registry)
    keys = reported_metrics(get_adapter("text"), cfg, registry, "default")
    assert "gen_ppl" not in keys and {"acc", "steps_acc"} <= set(keys)
    assert parse("acc>=-0.01", keys).metric == "acc"


def test_rows_take_their_own_seeds_problem_or_the_users():
    import attrs as _attrs

    from diffaccel.adapters.text.adapter import TextOptions
    from diffaccel.adapters.text.tasks import mode

    spec = task_spec("sudoku", 6)
    opts = TextOptions(task="sudoku", grid=6, length=spec.max_len)
    assert mode.problems(spec, opts, [7, 3]) == [spec.heldout(7), spec.heldout(3)]  # serve's per-row seeds
    user = spec.heldout(50).prompt
    opts = _attrs.evolve(opts, prompts=["", user])  # serve's unconditional request is an empty prompt
    assert [p.prompt for p in mode.problems(spec, opts, [7, 3])] == [spec.heldout(7).prompt, user]
    with pytest.raises(Exception, match="key 'prompts': prompt 2 is not a problem of task 'sudoku6'"):
        _attrs.evolve(opts, prompts=["", "12"])


def test_focus_marks_the_result_digits_only():
    from diffaccel_models.text.tasks.train import result_positions

    spec = task_spec("arith")
    tok = spec.tokenizer()
    p = arith.parse("Tom has 12 apples. He buys 5 more. He gives away 3. He doubles them. How many apples does Tom have now?")
    ids, gen = encode(spec, tok, [p])
    marked = [tok.tok.id_to_token(int(i)) for i in ids[0][result_positions(tok, ids, gen)[0]]]
    assert "".join(marked) == "17" + "14" + "28" + "28"
    assert not result_positions(task_spec("sudoku", 6).tokenizer(), *encode(task_spec("sudoku", 6), task_spec("sudoku", 6).tokenizer(),
                                                                            [sudoku.problem(0, n=6)])).any()


def test_shipped_sudoku_model_solves_held_out_puzzles():
    from diffaccel.adapters.text.families.dispatch import load_pipeline
    from diffaccel.adapters.text.tasks.evaluate import solve

    spec = task_spec("sudoku", 6)
    pipe = load_pipeline("sudoku")
    scores = solve(spec, pipe.denoiser.model, pipe.tokenizer, [spec.heldout(i) for i in range(4000, 4024)])
    assert sum(s[0] for s in scores) >= 20  # 0.96 on 500 held-out puzzles; a random model solves none


# ---- other step counts (the text adapter's variant_peer): bench side by side, tune --model-space ----

def _sudoku_variant(tmp_path, steps, strategy=True):
    text = Path("configs/sudoku.toml").read_text().replace("steps = 41", f"steps = {steps}")
    path = tmp_path / f"sudoku-{steps}.toml"
    path.write_text(text + ('\n[[strategy]]\nuse = "parallel"\nrule = "threshold"\nscale = "prob"\ntau = 0.999\n' if strategy else ""))
    return path


def test_bench_runs_a_task_config_at_other_steps_beside_the_baseline(tmp_path):
    from diffaccel.bench.runner import run_bench

    res = run_bench(["configs/sudoku.toml", str(_sudoku_variant(tmp_path, 20))], seeds=2, timed=False, noise_floor=False,
                    progress=False)
    by = {e["name"]: e for e in res["entries"]}
    assert set(by) == {"baseline", "sudoku-20", "steps-20"}  # the variant's model alone joins as its steps peer
    assert all(r["steps"] == 20 for r in by["sudoku-20"]["reports"]) and all(r["steps"] == 41 for r in by["baseline"]["reports"])
    assert by["sudoku-20"]["vs_model"]["entry"] == "steps-20"


def test_tune_searches_the_step_count_of_a_task_model(tmp_path):
    from diffaccel.tuning.tuner import tune

    result = tune("configs/sudoku-tune.toml", "acc>=-0.5", tmp_path / "fast.toml", trials=2, tune_seeds=1, heldout=2,
                  candidates=1, progress=False, model_space={"steps": (20, 14)})
    import optuna

    study = optuna.load_study(study_name="tune", storage=f"sqlite:///{result.study}")
    assert {t.params["[model].steps"] for t in study.trials} <= {20, 14}
    if result.path is not None:  # a point's steps land in the written [model]
        import tomllib

        assert tomllib.loads(result.path.read_text())["model"]["steps"] in (20, 14, 41)


def test_the_sudoku_tune_searches_parallels_threshold_up_to_0_999_and_its_rules():
    from diffaccel.runtime.config import load_config
    from diffaccel.runtime.registry import Registry
    from diffaccel.tuning.tuner import tunable_space

    registry = Registry()
    space = tunable_space(load_config("configs/sudoku-tune.toml", registry), registry)
    assert set(space) == {"swd", "time-anchor", "parallel"}
    assert max(space["parallel"]["tau"].choices) == 0.999 and set(space["parallel"]["rule"].choices) == {"threshold", "factor", "entropy"}


def test_hard_sudoku_split_searches_grids_and_keeps_its_range():
    spec = task_spec("sudoku-hard", 9)
    assert spec.key == "sudoku9-hard" and spec.max_len == task_spec("sudoku", 9).max_len  # the sudoku9 model runs it
    held = [spec.heldout(i) for i in range(40)]
    assert all(is_held_out(p.prompt) for p in held) and held == [spec.heldout(i) for i in range(40)]
    assert all(50 <= p.prompt.count("0") <= 58 for p in held)
    grids = [np.array([int(c) for c in p.answer]).reshape(9, 9) for p in held]
    assert all(sudoku.valid(g) for g in grids)
    assert all(spec.score(p, ["".join(map(str, r)) for r in g]) == {"acc": 1.0, "cells_acc": 1.0} for p, g in zip(held, grids))
    # a searched grid is not a relabelled base pattern: in _grid's, the first rows of a band's three
    # boxes hold the same three digit sets cyclically, which a searched grid seldom keeps
    def cyclic(g):
        return all({frozenset(g[r, 3 * b:3 * b + 3]) for r in range(3 * band, 3 * band + 3)} ==
                   {frozenset(g[3 * band, 3 * b2:3 * b2 + 3]) for b2 in range(3)} for band in range(3) for b in range(3))
    base = [sudoku.generate(np.random.default_rng(s), 9) for s in range(20)]
    assert all(cyclic(np.array([int(c) for c in p.answer]).reshape(9, 9)) for p in base)
    assert sum(cyclic(g) for g in grids) < 5


def test_hard_sudoku_is_9x9_only(tmp_path, capsys):
    cfg = _config(tmp_path, tmp_path / "no-such-model", "sudoku")
    cfg.write_text(cfg.read_text().replace('task = "sudoku"', 'task = "sudoku-hard"'))
    assert main(["check", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "key 'grid'" in err and "sudoku-hard grid 6: allowed 9" in err
