"""Backtracking family: step-by-step rollouts that are either right, or slip and later backtrack.

    valueprobe datasets build --family backtracking --out data --seed 0

Every problem (arithmetic, unit conversion, word problem; exact integer answers computed here)
gives two assistant rollouts in chat form:

* ``label 1``: complete and correct;
* ``label 0``: one step has a wrong result, the wrong value is carried into zero or more later
  steps, then a backtrack marker ("Wait, that's not right.") is followed by the correction and
  the correct answer.

Spans (on the assistant message, ``message=1``): ``prefix`` is the text before the backtrack
marker, so a probe reads the model before the text admits the error; on the correct twin it
covers the same number of lines. ``step`` is the line that holds the slip (or, on the correct
twin, the same line done right); ``backtrack`` is the marker sentence (erroneous rollouts only).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from valueprobe.datasets.io import Example, Span
from valueprobe.errors import ValueprobeError

DEFAULT_N = 160  # problems; two rollouts each
MAX_N = 20_000
KINDS = ("arithmetic", "unit_conversion", "word_problem")

NAMES = ("Maya", "Leo", "Amira", "Jonas", "Priya", "Tom", "Sofia", "Kenji", "Elena", "Omar", "Grace", "Mateo")
OPENERS = (
    "Let's work through this step by step.",
    "I'll solve this one step at a time.",
    "Let me break this down.",
    "Step by step:",
    "Let's solve it carefully.",
)
MARKERS = (
    "Wait, that's not right.",
    "Hmm, wait. That's not right.",
    "Wait, I made a mistake there.",
    "Hold on, that's not right.",
    "Wait, let me check that again. That's wrong.",
)
FINALS = ("So the answer is {a}.", "The answer is {a}.", "Therefore, the answer is {a}.")

Prior = list[int]


@dataclass(frozen=True)
class WorkedStep:
    """One line: ``prefix + expr + " = " + value + suffix``; ``expr`` and ``compute`` see earlier results."""

    prefix: Callable[[Prior], str]
    expr: Callable[[Prior], str]
    compute: Callable[[Prior], int]
    suffix: str = "."


@dataclass(frozen=True)
class Problem:
    kind: str
    template: str
    question: str
    steps: tuple[WorkedStep, ...]
    answer: Callable[[int], str]  # final result -> answer text with its unit


def _const(s: str) -> Callable[[Prior], str]:
    return lambda r: s


def _arithmetic(rng: random.Random) -> Problem:
    t = rng.randrange(3)
    if t == 0:
        a, b, c, d = rng.randint(12, 49), rng.randint(11, 39), rng.randint(12, 49), rng.randint(3, 19)
        q = f"What is {a} × {b} + {c} × {d}?"
        steps = (
            WorkedStep(_const("First, "), _const(f"{a} × {b}"), lambda r: a * b),
            WorkedStep(_const("Next, "), _const(f"{c} × {d}"), lambda r: c * d),
            WorkedStep(_const("Adding them: "), lambda r: f"{r[0]} + {r[1]}", lambda r: r[0] + r[1]),
        )
        return Problem("arithmetic", "sum_of_products", q, steps, str)
    if t == 1:
        a, b, c, d = rng.randint(13, 89), rng.randint(13, 89), rng.randint(3, 12), rng.randint(10, 99)
        q = f"Compute ({a} + {b}) × {c} - {d}."
        steps = (
            WorkedStep(_const("First, "), _const(f"{a} + {b}"), lambda r: a + b),
            WorkedStep(_const("Then "), lambda r: f"{r[0]} × {c}", lambda r: r[0] * c),
            WorkedStep(_const("Finally, "), lambda r: f"{r[1]} - {d}", lambda r: r[1] - d),
        )
        return Problem("arithmetic", "sum_times_minus", q, steps, str)
    d = rng.randint(3, 12)
    quotient = rng.randint(12, 60)
    a, b, c = rng.randint(15, 60), rng.randint(12, 40), d * quotient
    q = f"What is {a} × {b} - {c} ÷ {d}?"
    steps = (
        WorkedStep(_const("First, "), _const(f"{a} × {b}"), lambda r: a * b),
        WorkedStep(_const("Next, "), _const(f"{c} ÷ {d}"), lambda r: c // d),
        WorkedStep(_const("Subtracting: "), lambda r: f"{r[0]} - {r[1]}", lambda r: r[0] - r[1]),
    )
    return Problem("arithmetic", "product_minus_quotient", q, steps, str)


# (template id, big unit, small unit, middle unit, target unit, big->middle, middle->target, question form)
_CONVERSIONS = (
    ("hours_minutes_to_seconds", "hours", "minutes", "minutes", "seconds", 60, 60),
    ("km_m_to_cm", "km", "m", "m", "cm", 1000, 100),
    ("weeks_days_to_hours", "weeks", "days", "days", "hours", 7, 24),
    ("kg_g_to_mg", "kg", "g", "g", "mg", 1000, 1000),
    ("yards_feet_to_inches", "yards", "feet", "feet", "inches", 3, 12),
    ("gallons_quarts_to_pints", "US gallons", "quarts", "quarts", "pints", 4, 2),
    ("days_hours_to_minutes", "days", "hours", "hours", "minutes", 24, 60),
    ("metres_cm_to_mm", "metres", "centimetres", "centimetres", "millimetres", 100, 10),
)
_SMALL_MAX = {
    "minutes": 59,
    "m": 999,
    "days": 6,
    "g": 999,
    "feet": 2,
    "quarts": 3,
    "hours": 23,
    "centimetres": 99,
}


def _unit_conversion(rng: random.Random) -> Problem:
    tid, big, small, middle, target, f1, f2 = rng.choice(_CONVERSIONS)
    x, y = rng.randint(2, 9), rng.randint(1, _SMALL_MAX[small])
    q = rng.choice(
        (
            f"How many {target} are in {x} {big} and {y} {small}?",
            f"Convert {x} {big} {y} {small} to {target}.",
        )
    )
    steps = (
        WorkedStep(_const(f"{x} {big} is "), _const(f"{x} × {f1}"), lambda r: x * f1, f" {middle}."),
        WorkedStep(
            _const(f"Adding the {y} {small}: "), lambda r: f"{r[0]} + {y}", lambda r: r[0] + y, f" {middle}."
        ),
        WorkedStep(_const(f"In {target}: "), lambda r: f"{r[1]} × {f2}", lambda r: r[1] * f2, f" {target}."),
    )
    return Problem("unit_conversion", tid, q, steps, lambda v: f"{v} {target}")


def _word_problem(rng: random.Random) -> Problem:
    t = rng.randrange(6)
    name = rng.choice(NAMES)
    if t == 0:
        trays, per, more = rng.randint(3, 9), rng.randint(12, 30), rng.randint(5, 25)
        sold = rng.randint(10, trays * per - 5)
        q = (
            f"A baker makes {trays} trays of {per} cookies each, sells {sold} cookies, and then bakes {more} more. "
            "How many cookies does the baker have now?"
        )
        steps = (
            WorkedStep(
                _const(f"{trays} trays of {per} cookies is "),
                _const(f"{trays} × {per}"),
                lambda r: trays * per,
                " cookies.",
            ),
            WorkedStep(
                _const(f"After selling {sold}: "),
                lambda r: f"{r[0]} - {sold}",
                lambda r: r[0] - sold,
                " cookies.",
            ),
            WorkedStep(
                _const(f"After baking {more} more: "),
                lambda r: f"{r[1]} + {more}",
                lambda r: r[1] + more,
                " cookies.",
            ),
        )
        return Problem("word_problem", "cookies", q, steps, lambda v: f"{v} cookies")
    if t == 1:
        n, p, pen = rng.randint(3, 9), rng.randint(2, 9), rng.randint(1, 6)
        bill = 50 if n * p + pen < 50 else 100
        q = (
            f"{name} buys {n} notebooks at ${p} each and a pen for ${pen}, and pays with a ${bill} note. "
            f"How much change does {name} get?"
        )
        steps = (
            WorkedStep(
                _const(f"The notebooks cost ${p} each, so "),
                _const(f"{n} × {p}"),
                lambda r: n * p,
                " dollars.",
            ),
            WorkedStep(
                _const("With the pen, the total is "),
                lambda r: f"{r[0]} + {pen}",
                lambda r: r[0] + pen,
                " dollars.",
            ),
            WorkedStep(
                _const("The change is "), lambda r: f"{bill} - {r[1]}", lambda r: bill - r[1], " dollars."
            ),
        )
        return Problem("word_problem", "change", q, steps, lambda v: f"${v}")
    if t == 2:
        v, h, u, k = rng.randint(40, 120), rng.randint(2, 6), rng.randint(40, 120), rng.randint(2, 6)
        q = (
            f"A train travels at {v} km/h for {h} hours, then at {u} km/h for {k} hours. "
            "How far does it travel in total?"
        )
        steps = (
            WorkedStep(_const("The first part covers "), _const(f"{v} × {h}"), lambda r: v * h, " km."),
            WorkedStep(_const("The second part covers "), _const(f"{u} × {k}"), lambda r: u * k, " km."),
            WorkedStep(_const("In total: "), lambda r: f"{r[0]} + {r[1]}", lambda r: r[0] + r[1], " km."),
        )
        return Problem("word_problem", "train_distance", q, steps, lambda x: f"{x} km")
    if t == 3:
        w, length, c = rng.randint(5, 40), rng.randint(5, 60), rng.randint(3, 15)
        q = (
            f"A garden is {w} m wide and {length} m long. Fencing costs ${c} per metre. "
            "How much does it cost to fence the whole perimeter?"
        )
        steps = (
            WorkedStep(
                _const("Width plus length is "), _const(f"{w} + {length}"), lambda r: w + length, " m."
            ),
            WorkedStep(_const("The perimeter is "), lambda r: f"2 × {r[0]}", lambda r: 2 * r[0], " m."),
            WorkedStep(_const("The cost is "), lambda r: f"{r[1]} × {c}", lambda r: r[1] * c, " dollars."),
        )
        return Problem("word_problem", "fence_cost", q, steps, lambda x: f"${x}")
    if t == 4:
        p, d, last = rng.randint(12, 40), rng.randint(3, 9), rng.randint(5, 30)
        total = p * d + last + rng.randint(20, 200)
        q = (
            f"{name} reads {p} pages a day for {d} days, then {last} pages the next day. The book has {total} pages. "
            "How many pages are left?"
        )
        steps = (
            WorkedStep(
                _const(f"In {d} days {name} reads "), _const(f"{p} × {d}"), lambda r: p * d, " pages."
            ),
            WorkedStep(
                _const("Adding the next day: "),
                lambda r: f"{r[0]} + {last}",
                lambda r: r[0] + last,
                " pages read.",
            ),
            WorkedStep(_const("Pages left: "), lambda r: f"{total} - {r[1]}", lambda r: total - r[1], "."),
        )
        return Problem("word_problem", "pages_left", q, steps, lambda x: f"{x} pages")
    rows, trees, apples, bad = rng.randint(4, 15), rng.randint(6, 20), rng.randint(10, 40), rng.randint(5, 60)
    q = (
        f"An orchard has {rows} rows of {trees} trees, and each tree gives {apples} apples. {bad} apples are "
        "bruised and thrown away. How many apples are kept?"
    )
    steps = (
        WorkedStep(
            _const("The number of trees is "), _const(f"{rows} × {trees}"), lambda r: rows * trees, "."
        ),
        WorkedStep(_const("They give "), lambda r: f"{r[0]} × {apples}", lambda r: r[0] * apples, " apples."),
        WorkedStep(
            _const("Without the bruised ones: "),
            lambda r: f"{r[1]} - {bad}",
            lambda r: r[1] - bad,
            " apples.",
        ),
    )
    return Problem("word_problem", "orchard", q, steps, lambda x: f"{x} apples")


_GENERATORS: dict[str, Callable[[random.Random], Problem]] = {
    "arithmetic": _arithmetic,
    "unit_conversion": _unit_conversion,
    "word_problem": _word_problem,
}


def _wrong(value: int, rng: random.Random) -> int:
    digits = str(value)
    options = [value + 1, value - 1, value + 10, value - 10, value + 2, value - 2]
    if len(digits) >= 2 and digits[-1] != digits[-2] and (len(digits) > 2 or digits[-1] != "0"):
        options.append(int(digits[:-2] + digits[-1] + digits[-2]))  # transposed last two digits
    options = [o for o in options if o > 0 and o != value and len(str(o)) >= len(digits) - 1]
    return rng.choice(options)


def _line(step: WorkedStep, prior: Prior, value: int) -> str:
    return f"{step.prefix(prior)}{step.expr(prior)} = {value}{step.suffix}"


def solve(
    problem: Problem, *, error_at: int | None = None, wrong: int | None = None, upto: int | None = None
) -> tuple[list[str], list[int]]:
    """Lines and results of ``problem``'s steps, optionally with ``wrong`` at step ``error_at``
    (carried into later steps) and stopping after step ``upto``."""
    lines: list[str] = []
    results: list[int] = []
    last = len(problem.steps) - 1 if upto is None else upto
    for k, step in enumerate(problem.steps[: last + 1]):
        value = step.compute(results)
        if k == error_at:
            value = wrong if wrong is not None else value
        lines.append(_line(step, results, value))
        results.append(value)
    return lines, results


def generate(*, seed: int = 0, n: int | None = None) -> dict[str, list[Example]]:
    """``n`` problems, each as a correct rollout (label 1) and a backtracking one (label 0).

    >>> rows = generate(seed=0, n=1)["backtracking"]
    >>> [r.label for r in rows], [s.label for s in rows[1].spans]
    ([1, 0], ['prefix', 'step', 'backtrack'])
    """
    n = DEFAULT_N if n is None else n
    if n > MAX_N:
        raise ValueprobeError(f"--n {n} is too large for backtracking; use at most {MAX_N}")
    rng = random.Random(f"backtracking:{seed}")
    rows: list[Example] = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        problem = _GENERATORS[kind](rng)
        right_lines, right = solve(problem)
        answer = problem.answer(right[-1])
        opener = rng.choice(OPENERS)
        final = rng.choice(FINALS).format(a=answer)
        n_steps = len(problem.steps)
        error_at = rng.randrange(n_steps)
        carried = rng.randint(0, n_steps - 1 - error_at)  # later steps done with the wrong value
        wrong = _wrong(right[error_at], rng)
        bad_lines, bad = solve(problem, error_at=error_at, wrong=wrong, upto=error_at + carried)
        marker = rng.choice(MARKERS)
        step = problem.steps[error_at]
        fix = f"{step.expr(right[:error_at])} = {right[error_at]}, not {wrong}."
        redo = right_lines[error_at + 1 :]

        good_text = "\n".join([opener, *right_lines, final])
        head = "\n".join([opener, *bad_lines])
        bad_text = "\n".join([head, f"{marker} {fix}", *redo, final])

        k = error_at + carried + 1  # lines before the marker, not counting the opener
        good_prefix_end = len("\n".join([opener, *right_lines[:k]]))
        step_start = len("\n".join([opener, *right_lines[:error_at]])) + 1
        marker_start = len(head) + 1
        bad_step_start = len("\n".join([opener, *bad_lines[:error_at]])) + 1
        pid = f"bt-{i:04d}"
        meta = {
            "kind": kind,
            "template": problem.template,
            "answer": answer,
            "error_step": error_at,
            "steps_before_backtrack": k,
        }
        question = {"role": "user", "content": problem.question}
        rows.append(
            Example(
                id=f"{pid}-correct",
                label=1,
                group=f"backtracking/{kind}",
                messages=(question, {"role": "assistant", "content": good_text}),
                spans=(
                    Span(0, good_prefix_end, "prefix", message=1),
                    Span(step_start, step_start + len(right_lines[error_at]), "step", message=1),
                ),
                meta={**meta, "backtrack": False, "pair": f"{pid}-backtrack"},
            )
        )
        rows.append(
            Example(
                id=f"{pid}-backtrack",
                label=0,
                group=f"backtracking/{kind}",
                messages=(question, {"role": "assistant", "content": bad_text}),
                spans=(
                    Span(0, len(head), "prefix", message=1),
                    Span(bad_step_start, bad_step_start + len(bad_lines[error_at]), "step", message=1),
                    Span(marker_start, marker_start + len(marker), "backtrack", message=1),
                ),
                meta={
                    **meta,
                    "backtrack": True,
                    "pair": f"{pid}-correct",
                    "wrong_value": wrong,
                    "right_value": right[error_at],
                    "carried_steps": carried,
                },
            )
        )
    return {"backtracking": rows}
