"""``ledger``: a long-context task. The prompt is a ledger of many facts, the question needs one
or two of them, far from it, and three operations.

The prompt states ``FACTS`` facts, one sentence each (``Ann has 34 apples.``, every name once,
counts 10..49), then a question in ``arith``'s sentences about one person, with three operations
on their count, or about two (``Ann takes all the apples of Tom.``, then two operations):

    ... Ann has 34 apples. ... Tom has 12 apples. ... Ann takes all the apples of Tom.
    She buys 5 more. She keeps half of them. How many apples does Ann have now?

The generation is the worked solution: first the facts it uses, restated in the prompt's own
words (``Ann has 34``: the three tokens before the count are the prompt's, so the copy is an exact
induction pattern, which small models learn early; the form ``Ann=34`` never formed the look-up,
docs/task-models.md), then one equation per operation as ``arith`` writes them (two-digit
numbers), then ``#### <answer>``:

    Ann has 34 / Tom has 12 / 34+12=46 / 46+05=51 ... / #### 26

Every problem has three operations, so solutions are 37 or 43 tokens and the canvas after the
prompt is at most a few [EOS] longer: fewer steps than tokens must commit needed tokens together.
The prompt (161 to 170 tokens, 20 facts) is over three times the generation. Every result stays
in 1..99.

Scores: ``acc`` (the final answer is right) and ``facts_acc`` (share of the restated facts the
generation copies exactly: the lookup alone).
"""

from __future__ import annotations

import re

import numpy as np

from .arith import ADD, DIV, ITEMS, MUL, SUB, SYMBOL, _sentence, _step
from .common import Problem, PromptError, seed_rng

NAME = "ledger"
#: facts per problem (the test distribution; training grows to it from 2)
FACTS = 20
#: three operations per problem (the combine of two people's counts is the first of them)
OPS = 3
NAMES = {**{n: "He" for n in ("Tom", "Sam", "Ben", "Leo", "Max", "Dan", "Jim", "Ray", "Tim", "Joe", "Ned", "Bob", "Ian",
                               "Ted", "Roy", "Ken", "Gus", "Hal", "Lou", "Vic")},
         **{n: "She" for n in ("Ann", "Mia", "Eva", "Zoe", "Amy", "Ivy", "Joy", "Kim", "Liz", "Meg", "Pam", "Sue", "Tia",
                                "Una", "Val", "Bea", "Dot", "Fay", "Gil", "Kay")}}
COUNT = (10, 49)
#: the longest prompt (20 facts of 7 tokens; the two-person question with two-digit operands) and the
#: shortest (the one-person question with one-digit operands and the shortest sentences)
PROMPT_LEN, MIN_PROMPT_LEN = FACTS * 7 + 30, FACTS * 7 + 21
GEN_LEN = 43
WORDS = sorted({*(f"\u2581{w}" for w in [*NAMES, "He", "She", *ITEMS, "has", "more", "How", "many", "does", "have", "now",
                                         "of", "them", "a", "takes", "all", "the"]),
                *(f"\u2581{w}" for phrase in [*ADD, *SUB, *MUL.values(), *DIV.values()] for w in phrase.split()),
                ".", "?", "+", "-", "*", "/", "=", "####"})


def _facts(rng: np.random.Generator, n: int) -> list[tuple[str, int, str]]:
    names = rng.choice(list(NAMES), size=n, replace=False)
    return [(str(name), int(rng.integers(COUNT[0], COUNT[1] + 1)), ITEMS[rng.integers(len(ITEMS))]) for name in names]


def _solution(used: list[tuple[str, int]], steps: list[tuple[str, int, int]]) -> tuple[list[list[str]], int]:
    lines = [[f"\u2581{name}", "\u2581has", "\u2581", *f"{count:02d}"] for name, count in used]
    cur = used[0][1]
    for op, n, res in steps:
        lines.append([*f"{cur:02d}", SYMBOL[op], *f"{n:02d}", "=", *f"{res:02d}"])
        cur = res
    lines.append(["####", "\u2581", *f"{cur:02d}"])
    return lines, cur


def generate(rng: np.random.Generator, n_facts: int | None = None) -> Problem:
    """A problem with ``n_facts`` facts (default ``FACTS``): half ask about one person, half about two."""
    facts = _facts(rng, FACTS if n_facts is None else n_facts)
    a = int(rng.integers(len(facts)))
    name, start, item = facts[a]
    two = len(facts) > 1 and rng.random() < 0.5
    text, steps, used = [], [], [(name, start)]
    cur = start
    if two:
        b = int(rng.choice([i for i in range(len(facts)) if i != a]))
        facts[b] = (facts[b][0], facts[b][1], item)  # the two hold the same things
        other = facts[b][1]
        used.append((facts[b][0], other))
        cur = start + other
        steps.append(("add", other, cur))
        text.append(f"{name} takes all the {item} of {facts[b][0]}.")
    while len(steps) < OPS:
        op, n, cur = _step(rng, cur)
        steps.append((op, n, cur))
        text.append(_sentence(rng, name if not text else NAMES[name], op, n))
    text.append(f"How many {item} does {name} have now?")
    prompt = " ".join([*(f"{n} has {c} {i}." for n, c, i in facts), *text])
    lines, answer = _solution(used, steps)
    return Problem(prompt=prompt, solution=lines, answer=str(answer))


def problem(seed: int) -> Problem:
    """Problem ``seed`` (``FACTS`` facts), the same on every machine."""
    return generate(seed_rng(NAME, seed))


_FACT = re.compile(r"(\w+) has (\d+) (\w+)\.$")
_TAKE = re.compile(r"(\w+) takes all the (\w+) of (\w+)\.$")
_ADD = re.compile(rf"(\w+) (?:{'|'.join(ADD)}) (\d+) more\.$")
_SUB = re.compile(rf"(\w+) (?:{'|'.join(SUB)}) (\d+)\.$")
_MULDIV = {v: (op, k) for op, table in (("mul", MUL), ("div", DIV)) for k, v in table.items()}
_QUESTION = re.compile(r"How many (\w+) does (\w+) have now\?$")
EXPECTED = (f"expected a {NAME} problem: 1 to {FACTS} facts '<Name> has <n> <items>.' (each name once), then "
            f"'<Name> takes all the <items> of <Name>.' or none, then operations in arith's sentences ('<Name> buys "
            f"<n> more.', 'She gives away <n>.', 'He doubles them.', 'She keeps half of them.'), {OPS} in all, then "
            "'How many <items> does <Name> have now?'; names, items and results (1..99) of the task's vocabulary")


def _fail(why: str) -> PromptError:
    return PromptError(f"{why}; {EXPECTED}")


def _parse_facts(sentences: list[str]) -> tuple[dict[str, tuple[int, str]], int]:
    facts: dict[str, tuple[int, str]] = {}
    i = 0
    while i < len(sentences) and (m := _FACT.match(sentences[i])):
        name, n, item = m.group(1), int(m.group(2)), m.group(3)
        if name not in NAMES or item not in ITEMS:
            raise _fail(f"fact '{sentences[i]}' names '{name if name not in NAMES else item}', not a name or item of the task")
        if name in facts:
            raise _fail(f"the prompt states {name}'s count twice")
        if not 1 <= n <= 99:
            raise _fail(f"fact '{sentences[i]}': counts are 1..99")
        facts[name] = (n, item)
        i += 1
    if not 1 <= len(facts) <= FACTS:
        raise _fail(f"the prompt states {len(facts)} facts")
    return facts, i


def _operation(s: str, who: str, first: bool) -> tuple[str, int]:
    subject, _, rest = s.partition(" ")
    want = who if first else NAMES[who]
    if subject != want:
        raise _fail(f"sentence '{s}' should begin with '{want}'")
    a, b = _ADD.match(s), _SUB.match(s)
    if a or b:
        return ("add", int(a.group(2))) if a else ("sub", int(b.group(2)))
    if rest.rstrip(".") in _MULDIV:
        return _MULDIV[rest.rstrip(".")]
    raise _fail(f"sentence '{s}' is not one the task knows")


def parse(prompt: str) -> Problem:
    """The problem a user's prompt states (``PromptError`` naming what was expected otherwise):
    unknown words, a question about a person the facts do not name, a result outside 1..99."""
    sentences = [s.strip() for s in re.findall(r"[^.?]+[.?]", " ".join(prompt.split()))]
    if "".join(sentences).replace(" ", "") != prompt.replace(" ", "").replace("\n", "").strip() or len(sentences) < 3:
        raise _fail("the prompt is not whole sentences")
    facts, i = _parse_facts(sentences)
    q = _QUESTION.match(sentences[-1])
    if not q:
        raise _fail(f"the last sentence '{sentences[-1]}' is not the question")
    item, who = q.groups()
    if who not in facts:
        raise _fail(f"the question asks about {who}, whom no fact names")
    if facts[who][1] != item:
        raise _fail(f"the question asks for {who}'s {item}; the facts give {who} {facts[who][1]}")
    body, used, steps = sentences[i:-1], [(who, facts[who][0])], []
    cur = facts[who][0]
    if body and (t := _TAKE.match(body[0])):
        other = t.group(3)
        if t.group(1) != who or other not in facts or other == who or t.group(2) != item or facts[other][1] != item:
            raise _fail(f"sentence '{body[0]}' must name {who}, the {item} and another person whose fact gives {item}")
        used.append((other, facts[other][0]))
        cur += facts[other][0]
        steps.append(("add", facts[other][0], cur))
        body = body[1:]
    for s in body:
        op, n = _operation(s, who, first=not steps)
        res = {"add": cur + n, "sub": cur - n, "mul": cur * n, "div": cur // n if cur % n == 0 else -1}[op]
        if not 1 <= res <= 99 or not 1 <= n <= 99:
            raise _fail(f"sentence '{s}' takes {cur} outside 1..99 (or to a fraction)")
        steps.append((op, n, res))
        cur = res
    if not 1 <= cur <= 99 or len(steps) != OPS:
        raise _fail(f"the question has {len(steps)} operations, or a result outside 1..99")
    lines, answer = _solution(used, steps)
    return Problem(prompt=" ".join(sentences), solution=lines, answer=str(answer))


def score(problem: Problem, lines: list[str]) -> dict[str, float]:
    """``acc``: the last line is ``#### <answer>`` after as many lines as the reference's;
    ``facts_acc``: the share of the reference's restated facts written exactly, at their line."""
    ref = ["".join(x.replace("\u2581", " ") for x in line).strip() for line in problem.solution]
    got = [line.strip() for line in lines if line.strip()]
    final = re.fullmatch(r"####\s*(\d+)", got[-1]) if got else None
    acc = float(final is not None and int(final.group(1)) == int(problem.answer) and len(got) == len(ref))
    facts = [r for r in ref if " has " in r]
    hits = sum(1 for i, f in enumerate(facts) if i < len(got) and got[i] == f)
    return {"acc": acc, "facts_acc": hits / len(facts)}
