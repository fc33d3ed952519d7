"""``arith``: multi-step arithmetic word problems in GSM8K's shape, in miniature.

The prompt is a short templated story: a start quantity, then 2 to 4 operations (buys / finds /
gets more, gives away / loses / sells, doubles / triples / quadruples, keeps half / a third / a
quarter), then the question. The generation is a worked solution, one equation per operation,
each number written with two digits (``17+05=22``: every line has the same length, so a line's
place in the generation does not depend on earlier results), then the final-answer line
``#### 22``, then [EOS] to the end. Every intermediate result stays in 1..99.

Scores: ``acc`` (the final answer is right) and ``steps_acc`` (share of the reference's
equations the generation writes exactly, at their line).
"""

from __future__ import annotations

import re

import numpy as np

from .common import Problem, PromptError, seed_rng

NAME = "arith"
NAMES = {"Tom": "He", "Sam": "He", "Ben": "He", "Leo": "He", "Ann": "She", "Mia": "She", "Eva": "She", "Zoe": "She"}
ITEMS = ["apples", "pens", "cards", "coins", "books", "eggs", "shells", "stamps"]
ADD = ["buys", "finds", "gets"]
SUB = ["gives away", "loses", "sells"]
MUL = {2: "doubles them", 3: "triples them", 4: "quadruples them"}
DIV = {2: "keeps half of them", 3: "keeps a third of them", 4: "keeps a quarter of them"}
SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
MAX_OPS, MIN_OPS = 4, 2
#: prompt tokens at most (4 operations, two-digit numbers) and at least (2 operations), and the
#: generation after the longest prompt (the solution is 40 tokens at most; [EOS] fills the rest)
PROMPT_LEN, MIN_PROMPT_LEN = 44, 22
GEN_LEN = 64
WORDS = sorted({*(f"\u2581{w}" for w in [*NAMES, *set(NAMES.values()), *ITEMS, "has", "more", "How", "many", "does",
                                         "have", "now", "of", "them", "a"]),
                *(f"\u2581{w}" for phrase in [*ADD, *SUB, *MUL.values(), *DIV.values()] for w in phrase.split()),
                ".", "?", "+", "-", "*", "/", "=", "####"})


def _step(rng: np.random.Generator, cur: int) -> tuple[str, int, int]:
    """One operation on ``cur`` that keeps the result in 1..99: (op, operand, result)."""
    ops = ["add"] * (cur <= 97) + ["sub"] * (cur >= 2) + ["mul"] * (cur * 2 <= 99) + ["div"] * any(cur % k == 0 for k in (2, 3, 4))
    op = ops[rng.integers(len(ops))]
    if op == "add":
        n = int(rng.integers(1, min(30, 99 - cur) + 1))
        return op, n, cur + n
    if op == "sub":
        n = int(rng.integers(1, min(30, cur - 1) + 1))
        return op, n, cur - n
    if op == "mul":
        k = int(rng.choice([k for k in (2, 3, 4) if cur * k <= 99]))
        return op, k, cur * k
    k = int(rng.choice([k for k in (2, 3, 4) if cur % k == 0]))
    return op, k, cur // k


def _sentence(rng: np.random.Generator, pron: str, op: str, n: int) -> str:
    if op == "add":
        return f"{pron} {ADD[rng.integers(len(ADD))]} {n} more."
    if op == "sub":
        return f"{pron} {SUB[rng.integers(len(SUB))]} {n}."
    return f"{pron} {(MUL if op == 'mul' else DIV)[n]}."


def _problem(start: int, steps: list[tuple[str, int, int]], prompt: str) -> Problem:
    lines, cur = [], start
    for op, n, res in steps:
        lines.append([*f"{cur:02d}", SYMBOL[op], *f"{n:02d}", "=", *f"{res:02d}"])
        cur = res
    lines.append(["####", "\u2581", *f"{cur:02d}"])
    return Problem(prompt=prompt, solution=lines, answer=str(cur))


def generate(rng: np.random.Generator, n_ops: int | None = None) -> Problem:
    """A problem with ``n_ops`` operations (default: 2 to 4, uniformly)."""
    n_ops = int(rng.integers(MIN_OPS, MAX_OPS + 1)) if n_ops is None else n_ops
    name = list(NAMES)[rng.integers(len(NAMES))]
    item = ITEMS[rng.integers(len(ITEMS))]
    start = int(rng.integers(2, 41))
    steps, cur, text = [], start, [f"{name} has {start} {item}."]
    for _ in range(n_ops):
        op, n, cur = _step(rng, cur)
        steps.append((op, n, cur))
        text.append(_sentence(rng, NAMES[name], op, n))
    text.append(f"How many {item} does {name} have now?")
    return _problem(start, steps, " ".join(text))


def problem(seed: int) -> Problem:
    """Problem ``seed`` (2 to 4 operations), the same on every machine."""
    return generate(seed_rng(NAME, seed))


_START = re.compile(r"(\w+) has (\d+) (\w+)\.$")
_ADD = re.compile(rf"(He|She) (?:{'|'.join(ADD)}) (\d+) more\.$")
_SUB = re.compile(rf"(He|She) (?:{'|'.join(SUB)}) (\d+)\.$")
_MULDIV = {f"{p} {v}.": (op, k) for op, table in (("mul", MUL), ("div", DIV)) for k, v in table.items() for p in ("He", "She")}
EXPECTED = (f"expected an {NAME} problem: '<Name> has <n> <items>.', then {MIN_OPS} to {MAX_OPS} of 'He buys <n> more.', "
            "'She gives away <n>.', 'He doubles them.', 'She keeps half of them.' (and the like), then "
            "'How many <items> does <Name> have now?'; results within 1..99")


def parse(prompt: str) -> Problem:
    """The problem a user's prompt states (``PromptError`` naming what was expected when it is
    not one): the generator's own sentences, any names and items of its vocabulary."""
    sentences = re.findall(r"[^.?]+[.?]", " ".join(prompt.split()))
    if "".join(sentences).replace(" ", "") != prompt.replace(" ", "").strip() or len(sentences) < MIN_OPS + 2:
        raise PromptError(EXPECTED)
    m = _START.match(sentences[0].strip())
    q = re.match(r"How many (\w+) does (\w+) have now\?$", sentences[-1].strip())
    if not m or not q or m.group(1) not in NAMES or m.group(3) not in ITEMS or q.groups() != (m.group(3), m.group(1)):
        raise PromptError(EXPECTED)
    cur = start = int(m.group(2))
    steps = []
    for s in (x.strip() for x in sentences[1:-1]):
        if (a := _ADD.match(s)) or (b := _SUB.match(s)):
            op, n = ("add", int(a.group(2))) if a else ("sub", int(b.group(2)))
        elif s in _MULDIV:
            op, n = _MULDIV[s]
        else:
            raise PromptError(f"sentence '{s}' is not one the task knows; {EXPECTED}")
        res = {"add": cur + n, "sub": cur - n, "mul": cur * n, "div": cur // n if cur % n == 0 else -1}[op]
        if not 1 <= res <= 99 or not 1 <= n <= 99:
            raise PromptError(f"sentence '{s}' takes {cur} outside 1..99 (or to a fraction); {EXPECTED}")
        steps.append((op, n, res))
        cur = res
    if not 1 <= start <= 99 or not MIN_OPS <= len(steps) <= MAX_OPS:
        raise PromptError(EXPECTED)
    return _problem(start, steps, " ".join(s.strip() for s in sentences))


def score(problem: Problem, lines: list[str]) -> dict[str, float]:
    """``acc``: the last line is ``#### <answer>``; ``steps_acc``: the share of the reference's
    equations the generation writes exactly, at their line. ``lines``: the generated text's lines."""
    ref = ["".join(x.replace("\u2581", " ") for x in line) for line in problem.solution]
    got = [line.strip() for line in lines if line.strip()]
    final = re.fullmatch(r"####\s*(\d+)", got[-1]) if got else None
    acc = float(final is not None and int(final.group(1)) == int(problem.answer) and len(got) == len(ref))
    eqs = ref[:-1]
    hits = sum(1 for i, e in enumerate(eqs) if i < len(got) and got[i] == e)
    return {"acc": acc, "steps_acc": hits / len(eqs)}
