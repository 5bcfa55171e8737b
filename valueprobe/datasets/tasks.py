"""Tasks family: questions with a checkable answer, for guided decoding and its baselines.

    valueprobe datasets build --family tasks --out data --seed 0
    valueprobe replicate guide --tasks data/task_arithmetic.jsonl

- ``task_arithmetic``: word problems with an exact integer answer (``meta.answer``), at three
  levels (``group`` ``task_arithmetic/level1..3``): one step on single digits (a + b, a − b), one
  step on a two-digit number (a ± b), two steps on small numbers (a × b + c, a + b − c). Every
  result is a positive integer. (The default 135M model got 7.5% of one-step sums of two-digit
  numbers right and none of two- and three-step problems on numbers up to 90, so the levels are
  this small.)
- ``task_code``: write one small Python function (`valueprobe.datasets.task_functions`), checked
  by ``meta.tests``, assert statements whose expected values come from a reference solution run
  on inputs drawn here.

Rows are chats that end with the user's question, ``label`` 1 (each is a task with a right
answer), ``meta.task`` the kind. `valueprobe.datasets.answers` reads them back (a row whose
answer does not parse is refused with ``file:line``) and checks responses by its stated rule.
``n`` is the number of questions per arithmetic level and of code tasks (functions repeat with
new inputs past the 40 there are).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from valueprobe.datasets.io import Example
from valueprobe.datasets.task_functions import FUNCTIONS, TaskFunction
from valueprobe.errors import ValueprobeError

DEFAULT_N = 40
MAX_N = 400
TESTS_PER_FUNCTION = 4

ARITHMETIC_ASK = "Give the final answer as a number."
CODE_ASK = "Reply with the function in a ```python code block."

NAMES = ("Mia", "Sam", "Lena", "Omar", "Ava", "Ben", "Zoe", "Ravi", "Nora", "Leo", "Ivy", "Kai")
ITEMS = ("apples", "stickers", "marbles", "pencils", "cards", "shells", "stamps", "coins", "books", "cookies")

# A template draws its numbers and returns (question, answer); every answer is a positive integer.
Template = Callable[[random.Random, str, str], tuple[str, int]]


def _l1_more(r: random.Random, name: str, item: str) -> tuple[str, int]:
    a, b = r.randint(2, 9), r.randint(2, 9)
    return f"{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?", a + b


def _l1_left(r: random.Random, name: str, item: str) -> tuple[str, int]:
    b = r.randint(1, 5)
    a = b + r.randint(1, 4)
    return f"{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?", a - b


def _l2_more(r: random.Random, name: str, item: str) -> tuple[str, int]:
    a, b = r.randint(11, 40), r.randint(2, 9)
    return f"{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?", a + b


def _l2_left(r: random.Random, name: str, item: str) -> tuple[str, int]:
    a, b = r.randint(12, 40), r.randint(2, 9)
    return f"{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?", a - b


def _l3_packs(r: random.Random, name: str, item: str) -> tuple[str, int]:
    a, b = r.randint(2, 5), r.randint(2, 5)
    c = r.randint(1, 9)
    q = f"{name} buys {a} bags with {b} {item} in each bag, and finds {c} more {item}. How many {item} does {name} have?"
    return q, a * b + c


def _l3_steps(r: random.Random, name: str, item: str) -> tuple[str, int]:
    a, b = r.randint(2, 9), r.randint(2, 9)
    c = r.randint(1, a + b - 1)
    return (
        f"{name} has {a} {item}, gets {b} more, then gives away {c}. How many {item} does {name} have now?",
        a + b - c,
    )


LEVELS: dict[str, tuple[Template, ...]] = {
    "level1": (_l1_more, _l1_left),
    "level2": (_l2_more, _l2_left),
    "level3": (_l3_packs, _l3_steps),
}


def _arithmetic(n: int, rng: random.Random) -> list[Example]:
    rows: list[Example] = []
    for level, templates in LEVELS.items():
        for i in range(n):
            template = templates[i % len(templates)]
            question, answer = template(rng, rng.choice(NAMES), rng.choice(ITEMS))
            if answer <= 0:
                raise ValueprobeError(
                    f"{template.__name__} drew a non-positive answer; this is a bug in valueprobe"
                )
            rows.append(
                Example(
                    id=f"task-arith-{level}-{i:04d}",
                    label=1,
                    group=f"task_arithmetic/{level}",
                    messages=({"role": "user", "content": f"{question} {ARITHMETIC_ASK}"},),
                    meta={"task": "arithmetic", "answer": answer, "template": template.__name__[1:]},
                )
            )
    return rows


def _asserts(function: TaskFunction, rng: random.Random) -> list[str]:
    """``TESTS_PER_FUNCTION`` distinct asserts, expected values from the reference solution."""
    scope: dict = {}
    exec(function.reference, scope)  # our own reference source, defined in task_functions
    tests: list[str] = []
    for _ in range(50 * TESTS_PER_FUNCTION):
        args = function.inputs(rng)
        call = f"{function.name}({', '.join(repr(a) for a in args)})"
        test = f"assert {call} == {scope[function.name](*args)!r}"
        if test not in tests:
            tests.append(test)
        if len(tests) == TESTS_PER_FUNCTION:
            break
    return tests


def _code(n: int, rng: random.Random) -> list[Example]:
    order = list(range(len(FUNCTIONS)))
    rng.shuffle(order)
    rows: list[Example] = []
    for i in range(n):
        function = FUNCTIONS[order[i % len(order)]]
        ask = f"Write a Python function `{function.name}({function.sig})` that {function.what}. {CODE_ASK}"
        rows.append(
            Example(
                id=f"task-code-{i:04d}",
                label=1,
                group="task_code/function",
                messages=({"role": "user", "content": ask},),
                meta={
                    "task": "code",
                    "function": function.name,
                    "tests": _asserts(function, rng),
                    "reference": function.reference,
                },
            )
        )
    return rows


def generate(*, seed: int = 0, n: int | None = None) -> dict[str, list[Example]]:
    """The two task files: ``n`` questions per arithmetic level (default 40) and ``n`` code tasks.

    >>> out = generate(seed=0, n=2)
    >>> len(out["task_arithmetic"]), len(out["task_code"])
    (6, 2)
    """
    n = DEFAULT_N if n is None else n
    if n > MAX_N:
        raise ValueprobeError(f"--n {n} is too large for the tasks family; use at most {MAX_N}")
    return {
        "task_arithmetic": _arithmetic(n, random.Random(f"task_arithmetic:{seed}")),
        "task_code": _code(n, random.Random(f"task_code:{seed}")),
    }
