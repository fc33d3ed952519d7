"""The ``ledger`` task (adapters/text/tasks/ledger.py): a long prompt of facts, a question far from
the fact it needs, a worked solution sized to the canvas; prompts checked before any model loads;
the recipe's start from ``arith``'s weights (grow.py) and its batch trimming."""

from __future__ import annotations

import re

import pytest
import torch

from diffaccel.adapters.text.tasks import PromptError, ledger, task_spec
from diffaccel.adapters.text.tasks.common import solution_ids
from diffaccel_models.text.tasks.train import TaskTrainConfig, _pace, encode, level_cap, lookup_positions, trim
from diffaccel.cli.entry import main

SPEC = task_spec("ledger")
FACTS = " ".join(f"{n} has {c} {i}." for n, c, i in [("Ann", 34, "apples"), ("Tom", 12, "apples"), ("Mia", 20, "pens")])


def _lines(problem):
    return ["".join(t.replace("\u2581", " ") for t in line).strip() for line in problem.solution]


def test_prompt_is_long_and_the_canvas_is_the_solution():
    tok = SPEC.tokenizer()
    probs = [SPEC.problem(s) for s in range(400)]
    prompts = [len(tok.encode(p.prompt)) for p in probs]
    sols = [len(solution_ids(tok, p.solution)) for p in probs]
    assert min(prompts) >= 3 * (SPEC.max_len - min(prompts))  # the prompt is >= 3x every generated canvas
    assert max(p + s for p, s in zip(prompts, sols)) == SPEC.max_len
    # the canvas after a prompt is at most a few [EOS] longer than its solution (no long tail)
    assert max(SPEC.max_len - p - s for p, s in zip(prompts, sols)) <= 14
    assert {len(p.solution) for p in probs} == {5, 6}  # one or two facts restated, three equations, the answer
    assert all(len(re.findall(r"\w+ has \d+ \w+\.", p.prompt)) == ledger.FACTS for p in probs)


def test_parse_states_the_generators_problems_and_solves_them():
    for s in range(300):
        p = SPEC.problem(s)
        assert ledger.parse(p.prompt) == p
        assert ledger.score(p, _lines(p)) == {"acc": 1.0, "facts_acc": 1.0}
    p = ledger.parse(f"{FACTS} Ann takes all the apples of Tom. She buys 5 more. She sells 6. How many apples does Ann have now?")
    assert _lines(p) == ["Ann has 34", "Tom has 12", "34+12=46", "46+05=51", "51-06=45", "#### 45"] and p.answer == "45"


def test_the_answer_follows_the_fact_wherever_it_stands():
    q = "Mia sells 4. She doubles them. She buys 3 more. How many pens does Mia have now?"
    base = ledger.parse(f"{FACTS} {q}")
    assert _lines(base)[:2] == ["Mia has 20", "20-04=16"] and base.answer == "35"
    moved = ledger.parse(f"Mia has 20 pens. Ann has 34 apples. Tom has 12 apples. {q}")
    assert moved.answer == base.answer and moved.solution == base.solution
    changed = ledger.parse(FACTS.replace("Mia has 20", "Mia has 30") + " " + q)
    assert changed.answer == "55" and _lines(changed)[0] == "Mia has 30"


def test_scores_the_answer_and_the_copied_facts():
    p = ledger.parse(f"{FACTS} Ann takes all the apples of Tom. She buys 5 more. She sells 1. How many apples does Ann have now?")
    good = _lines(p)
    assert ledger.score(p, good) == {"acc": 1.0, "facts_acc": 1.0}
    wrong_fact = ["Ann has 34", "Tom has 13", "34+13=47", "47+05=52", "52-01=51", "#### 51"]
    assert ledger.score(p, wrong_fact) == {"acc": 0.0, "facts_acc": 0.5}
    assert ledger.score(p, good[:-1])["acc"] == 0.0 and ledger.score(p, [])["acc"] == 0.0


@pytest.mark.parametrize("prompt,fragment", [
    (f"{FACTS} Zed buys 5 more. He doubles them. He sells 3. How many apples does Zed have now?", "asks about Zed, whom no fact names"),
    ("Ann has 34 plums. Ann buys 5 more. She doubles them. She sells 3. How many plums does Ann have now?", "names 'plums'"),
    (f"{FACTS} Ann buys 50 more. She doubles them. She sells 3. How many apples does Ann have now?", "outside 1..99"),
    (f"{FACTS} Ann buys 5 more. She doubles them. How many apples does Ann have now?", "2 operations"),
    (f"{FACTS} Ann eats 5. She doubles them. She sells 3. How many apples does Ann have now?", "sentence 'Ann eats 5.'"),
    (f"{FACTS} Ann buys 5 more. She doubles them. She sells 3. How many pens does Ann have now?", "the facts give Ann apples"),
    ("Ann has 34 apples. Ann has 3 apples. Ann buys 5 more. She doubles them. She sells 3. How many apples does Ann have now?",
     "states Ann's count twice"),
    (" ".join(f"{n} has 10 pens." for n in list(ledger.NAMES)[:21]) + " Tom buys 5 more. He doubles them. He sells 3. "
     "How many pens does Tom have now?", "states 21 facts"),
])
def test_refuses_prompts_outside_the_task(prompt, fragment):
    with pytest.raises(PromptError, match="expected a ledger problem") as exc:
        ledger.parse(prompt)
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


def test_bad_prompt_exits_2_before_the_model_loads(tmp_path, capsys):
    cfg = tmp_path / "ledger.toml"
    cfg.write_text(f'[model]\nadapter = "text"\ncheckpoint = "{tmp_path / "none"}"\ntask = "ledger"\nlength = {SPEC.max_len}\n')
    assert main(["generate", str(cfg), "--prompt", f"{FACTS} How many apples does Zed have now?"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a problem of task 'ledger'" in err and "Zed" in err


def test_trim_cuts_short_batches_and_keeps_full_ones():
    tok = SPEC.tokenizer()
    short = [SPEC.generate(__import__("numpy").random.default_rng(s), 2) for s in range(4)]
    ids, gen = encode(SPEC, tok, short)
    cut, cut_gen = trim(ids, gen, tok.tok.token_to_id("[EOS]"), slack=16)
    longest = max(len(tok.encode(p.prompt)) + len(solution_ids(tok, p.solution)) for p in short)
    assert cut.shape == (4, longest + 16) and torch.equal(cut, ids[:, : longest + 16]) and torch.equal(cut_gen, gen[:, : longest + 16])
    full = encode(SPEC, tok, [SPEC.problem(s) for s in range(64)])
    assert trim(*full, tok.tok.token_to_id("[EOS]"))[0].shape[1] == SPEC.max_len


def test_lookup_positions_are_the_restated_facts_and_the_first_equation():
    tok = SPEC.tokenizer()
    problems = [SPEC.problem(s) for s in range(8)]
    ids, gen = encode(SPEC, tok, problems)
    marked = lookup_positions(tok, ids, gen)
    for row, p in enumerate(problems):
        facts = [line for line in p.solution if line[0].startswith("\u2581")]
        first_eq = p.solution[len(facts)]
        assert [tok.tok.id_to_token(int(i)) for i in ids[row][marked[row]]] == [t for line in [*facts, first_eq] for t in line]
    facts = lookup_positions(tok, ids, gen, facts_only=True)
    assert torch.equal(facts & marked, facts) and [tok.tok.id_to_token(int(i)) for i in ids[0][facts[0]]] == [
        t for line in problems[0].solution if line[0].startswith("\u2581") for t in line]
    assert not (marked & ~gen).any()


def test_paced_curriculum_follows_the_level_not_the_step():
    ramp, paced = TaskTrainConfig(task="ledger", curriculum=0.5, steps=100), TaskTrainConfig(task="ledger", pace=0.9)
    assert [level_cap(SPEC, ramp, s) for s in (0, 25, 50)] == [1, 1 + SPEC.levels // 2, SPEC.levels]
    assert level_cap(SPEC, paced, 10_000, paced=3) == 3 and level_cap(SPEC, paced, 0, paced=99) == SPEC.levels


def test_a_carried_run_starts_at_its_level(tmp_path):
    from diffaccel_models.text.tasks.train import train_task

    cfg = TaskTrainConfig(task="ledger", out=str(tmp_path / "m"), steps=2, batch=2, dim=32, layers=1, heads=2, eval_every=2,
                          eval_n=1, bf16=False, pace=0.99, start_level=4, trim=True)
    train_task(cfg)
    assert torch.load(tmp_path / "m" / "ckpt.pt", weights_only=False)["history"]["level"] == 4
    with pytest.raises(ValueError, match="start_level"):
        TaskTrainConfig(task="ledger", start_level=0)


def test_the_pace_moves_one_level_when_the_gauge_reaches_the_bound():
    cfg, history = TaskTrainConfig(task="ledger", pace=0.85), {"level": 1}
    assert _pace(cfg, SPEC, history, 0.5, None, 0) == 0.5 and history["level"] == 1  # no look-up digit masked
    assert _pace(cfg, SPEC, history, 0.5, 1.0, 1) == 0.5 * 0.98 + 0.02 and history["level"] == 1
    assert _pace(cfg, SPEC, history, 0.86, 1.0, 2) == 0.0 and history["level"] == 2  # a fresh gauge
    history["level"] = SPEC.levels
    assert _pace(cfg, SPEC, history, 0.9, 1.0, 3) > 0.85 and history["level"] == SPEC.levels  # the top stays


def test_a_model_grown_from_arith_computes_what_arith_did():
    from diffaccel.adapters.text.loading.reference import shipped_path
    from diffaccel.adapters.text.sampling.model import TextDiffusionConfig, TextDiffusionLM
    from diffaccel.adapters.text.sampling.tokenizer import TextTokenizer
    from diffaccel_models.text.tasks.grow import grow_from

    src_dir = shipped_path("arith")
    src, src_tok = TextDiffusionLM.load(src_dir), TextTokenizer.from_file(src_dir / "tokenizer.json")
    tok = SPEC.tokenizer()
    torch.manual_seed(0)
    model = TextDiffusionLM(TextDiffusionConfig(vocab_size=tok.vocab_size, max_len=SPEC.max_len, dim=128, n_layers=6, n_heads=4,
                                                mask_id=tok.mask_id, pad_id=tok.pad_id)).eval()
    assert grow_from(model, tok, src_dir, [0, 1, 4, 5]) == {"tokens": src_tok.vocab_size, "positions": 108, "blocks": 4}
    text = "Tom has 12 apples. He buys 5 more. He doubles them. How many apples does Tom have now?"
    a, b = src_tok.encode(text), tok.encode(text)
    words = [src_tok.tok.id_to_token(i) for i in range(src_tok.vocab_size)]
    cols = torch.tensor([tok.tok.token_to_id(w) for w in words])
    with torch.no_grad():
        want = src(torch.tensor([a]))
        got = model(torch.tensor([b]))[..., cols]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="--init-layers"):
        grow_from(model, tok, src_dir, [0, 1, 2])
