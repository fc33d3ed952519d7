"""A probe of the ledger's next recipe (not shipped): restated facts in the prompt's own form
(``Ann has 36`` instead of ``Ann=36``), so that copying a count is an exact induction pattern (the
same three tokens before it in the prompt). Trains from arith's weights with the paced curriculum
and look-up masking, as the second stage did, and writes OUT/train.json and the log's level lines.

    OMP_NUM_THREADS=1 python scripts/ledger_induction_probe.py runs/probe-induct 34   # OUT, minutes

On 2026-12-07 (one thread, a shared machine) it left 2 facts at step 1848 (the gauge at 0.85, the
batch's restated digits 0.94 right) in 30 minutes; the shipped form's second stage never left 2
facts in 3,300 steps (docs/task-models.md)."""
import sys, torch
from diffaccel.adapters.text.tasks import ledger

def _solution(used, steps):
    lines = [[f"\u2581{name}", "\u2581has", "\u2581", *f"{count:02d}"] for name, count in used]
    cur = used[0][1]
    for op, n, res in steps:
        lines.append([*f"{cur:02d}", ledger.SYMBOL[op], *f"{n:02d}", "=", *f"{res:02d}"])
        cur = res
    lines.append(["####", "\u2581", *f"{cur:02d}"])
    return lines, cur

ledger._solution = _solution
_score = ledger.score

def score(problem, lines):
    import re
    ref = ["".join(x.replace("\u2581", " ") for x in line).strip() for line in problem.solution]
    got = [line.strip() for line in lines if line.strip()]
    final = re.fullmatch(r"####\s*(\d+)", got[-1]) if got else None
    acc = float(final is not None and int(final.group(1)) == int(problem.answer) and len(got) == len(ref))
    facts = [r for r in ref if " has " in r]
    return {"acc": acc, "facts_acc": sum(1 for i, f in enumerate(facts) if i < len(got) and got[i] == f) / len(facts)}

ledger.score = score
ledger.GEN_LEN = 43
from diffaccel_models.text.tasks.train import TaskTrainConfig, train_task
torch.set_num_threads(1)
cfg = TaskTrainConfig(task="ledger", out=sys.argv[1], dim=128, layers=6, heads=4, batch=32, lr=1e-3, steps=20000,
                      eval_every=300, eval_n=32, top_share=0.5, focus=0.5, lookup=0.5, pace=0.85, trim=True, bf16=False,
                      init="models/diffaccel_models/assets/arith", init_layers=(0, 1, 4, 5), max_minutes=float(sys.argv[2]))
train_task(cfg)
