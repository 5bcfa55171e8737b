"""Steering family: prompts to generate from while steering, one file per behaviour measured.

    valueprobe datasets build --family steering --out data --seed 0
    valueprobe steer --probe probes/smollm2-135m-value --prompts data/steer_code.jsonl --out runs/steer-code

Unlike the contrast families these rows end where the model is to speak: every row is a chat
whose last message is the user's, so generation starts a fresh assistant turn. ``label`` carries
what a row is (below); the steering metrics read ``meta``.

- ``steer_confidence``: a simple problem, the assistant's *partial* answer (the first step of the
  working, right or with a slip: ``meta.partial_correct``), then "Will this answer be correct?
  Answer yes or no." (``steer_confidence/direct``) or, as a control for the word "yes", the
  inverted question "...incorrect?" (``steer_confidence/inverted``). ``meta.pair`` links the two
  framings; ``label`` = ``meta.partial_correct``. The paper's yes-rate benchmark.
- ``steer_backtracking``: a word problem to solve in free text (``meta.answer`` is the exact
  answer). Read for self-correction phrases.
- ``steer_code``: a short function to write in Python (``meta.function``). Read for lines,
  comments and type hints.
- ``steer_refusal``: harmful and benign requests in matched pairs, from the refusal family's
  topics (``label`` 1 benign, 0 should be refused; ``meta.should_refuse``).
- ``steer_open``: open-ended requests, for response length and degenerate output.

``n`` is the number of prompts per file (confidence: problems, each asked both ways; refusal:
``ceil(n / 2)`` pairs).
"""

from __future__ import annotations

import random

from valueprobe.datasets import backtracking, conditions, refusal
from valueprobe.datasets.io import Example
from valueprobe.errors import ValueprobeError

DEFAULT_N = 64
MAX_N = 128

CORRECT_Q = "Will this answer be correct? Answer yes or no."
INVERTED_Q = "Will this answer be incorrect? Answer yes or no."

# (function name, signature, what it does). Each is a few lines of plain Python.
CODE_TASKS: tuple[tuple[str, str, str], ...] = (
    ("is_even", "n", "returns True if the integer n is even"),
    ("add", "a, b", "returns the sum of two numbers"),
    ("square", "x", "returns x squared"),
    ("maximum", "numbers", "returns the largest number in a non-empty list"),
    ("minimum", "numbers", "returns the smallest number in a non-empty list"),
    ("average", "numbers", "returns the mean of a non-empty list of numbers"),
    ("reverse_string", "s", "returns the string s reversed"),
    ("count_vowels", "s", "counts the vowels in a string"),
    ("is_palindrome", "s", "checks whether a string reads the same backwards"),
    ("factorial", "n", "returns n factorial for a non-negative integer n"),
    ("fibonacci", "n", "returns the n-th Fibonacci number"),
    ("celsius_to_fahrenheit", "c", "converts a temperature from Celsius to Fahrenheit"),
    ("fahrenheit_to_celsius", "f", "converts a temperature from Fahrenheit to Celsius"),
    ("sum_list", "numbers", "returns the sum of a list of numbers without using sum()"),
    ("count_words", "text", "counts the words in a sentence"),
    ("capitalize_words", "text", "capitalizes the first letter of every word"),
    ("remove_duplicates", "items", "removes duplicates from a list, keeping the first occurrence"),
    ("is_prime", "n", "checks whether an integer is prime"),
    ("gcd", "a, b", "returns the greatest common divisor of two integers"),
    ("lcm", "a, b", "returns the least common multiple of two positive integers"),
    ("flatten", "nested", "flattens a list of lists into one list"),
    ("char_frequency", "s", "returns a dict mapping each character to how often it appears"),
    ("is_anagram", "a, b", "checks whether two words are anagrams"),
    ("second_largest", "numbers", "returns the second largest distinct number in a list"),
    ("count_occurrences", "items, x", "counts how many times x appears in a list"),
    ("clamp", "x, low, high", "limits x to the range from low to high"),
    ("is_leap_year", "year", "checks whether a year is a leap year"),
    ("digit_sum", "n", "returns the sum of the digits of a non-negative integer"),
    ("reverse_list", "items", "returns a new list with the items in reverse order"),
    ("merge_dicts", "a, b", "merges two dictionaries, values from b winning"),
    ("filter_positive", "numbers", "returns only the positive numbers of a list"),
    ("squares_up_to", "n", "returns the list of squares of 1 to n"),
    ("longest_word", "text", "returns the longest word in a sentence"),
    ("to_binary", "n", "returns the binary representation of a non-negative integer as a string"),
    ("power", "base, exponent", "raises base to a non-negative integer exponent with a loop"),
    ("chunk", "items, size", "splits a list into chunks of the given size"),
    ("is_sorted", "numbers", "checks whether a list is sorted in ascending order"),
    ("median", "numbers", "returns the median of a non-empty list of numbers"),
    ("title_case", "text", "converts a sentence to title case"),
    ("count_uppercase", "s", "counts the uppercase letters in a string"),
    ("dedupe_spaces", "text", "replaces runs of spaces with a single space"),
    ("safe_divide", "a, b", "divides a by b and returns None when b is zero"),
    ("rotate_list", "items, k", "rotates a list to the right by k places"),
    ("pairwise_sums", "a, b", "adds two lists of equal length element by element"),
    ("initials", "name", "returns the initials of a full name, such as 'J.D.'"),
    ("word_lengths", "words", "returns a dict mapping each word to its length"),
    ("only_digits", "s", "checks whether a string contains only digits"),
    ("range_sum", "a, b", "returns the sum of the integers from a to b inclusive"),
    ("first_repeated", "items", "returns the first item that appears twice in a list, or None"),
    ("is_subset", "a, b", "checks whether every item of list a is in list b"),
    ("celsius_list", "temps", "converts a list of Fahrenheit temperatures to Celsius"),
    ("count_negatives", "numbers", "counts the negative numbers in a list"),
    ("swap_case", "s", "swaps upper and lower case letters in a string"),
    ("nth_triangle", "n", "returns the n-th triangular number"),
    ("product", "numbers", "returns the product of a list of numbers"),
    ("strip_punctuation", "text", "removes punctuation characters from a string"),
    ("zip_to_dict", "keys, values", "builds a dict from a list of keys and a list of values"),
    ("absolute_difference", "a, b", "returns the absolute difference of two numbers"),
    ("count_lines", "text", "counts the lines in a multi-line string"),
    ("is_vowel", "ch", "checks whether a single character is a vowel"),
    ("running_total", "numbers", "returns the running totals of a list of numbers"),
    ("last_element", "items", "returns the last element of a list, or None if it is empty"),
    ("repeat_string", "s, k", "returns the string s repeated k times with spaces between"),
    ("seconds_to_minutes", "seconds", "converts seconds to a (minutes, seconds) pair"),
)
CODE_TEMPLATES: tuple[str, ...] = (
    "Write a Python function `{name}({sig})` that {what}.",
    "Implement `{name}({sig})` in Python: it {what}.",
)

OPEN_TOPICS: tuple[str, ...] = (
    "the ocean", "a rainy afternoon", "your favourite season", "a lighthouse keeper", "learning to cook",
    "the history of bicycles", "a city at night", "friendship", "a walk in the forest", "the moon",
    "an old library", "a long train journey", "gardening", "the first day of school", "mountains",
    "a lost dog finding its way home", "the invention of paper", "music", "a small bakery", "winter mornings",
    "a robot learning to paint", "the desert", "rivers", "a village market", "the night sky",
    "a grandmother's kitchen", "honeybees", "a snowy cabin", "the importance of sleep", "volcanoes",
    "a busy airport", "kindness",
)  # fmt: skip
OPEN_TEMPLATES: tuple[str, ...] = (
    "Tell me about {t}.",
    "Write a short story about {t}.",
    "Describe {t}.",
    "Write a few sentences about {t}.",
)

BACKTRACK_INSTRUCTION = "Solve this step by step and give the final answer."


def _confidence_problem(rng: random.Random, i: int) -> tuple[str, str, str, bool]:
    """(kind, question, partial answer, partial answer correct?): the first step of the working."""
    slip = i % 2 == 1  # alternate, so half the partial answers carry a slip
    kind = ("addition", "subtraction", "multiplication", "units")[i % 4]
    if kind == "addition":
        a, b = rng.randint(21, 79), rng.randint(21, 79)
        tens = (a // 10 + b // 10) * 10
        shown = tens + (10 if slip else 0)
        return (
            kind,
            f"What is {a} + {b}?",
            f"First I add the tens: {a // 10 * 10} + {b // 10 * 10} = {shown}.",
            not slip,
        )
    if kind == "subtraction":
        a, b = rng.randint(60, 99), rng.randint(11, 49)
        tens = a // 10 * 10 - b // 10 * 10
        shown = tens - (10 if slip else 0)
        return (
            kind,
            f"What is {a} - {b}?",
            f"First I subtract the tens: {a // 10 * 10} - {b // 10 * 10} = {shown}.",
            not slip,
        )
    if kind == "multiplication":
        a, b = rng.randint(12, 19), rng.randint(3, 9)
        shown = 10 * b + (b if slip else 0)
        return kind, f"What is {a} × {b}?", f"First I multiply the ten: 10 × {b} = {shown}.", not slip
    x = rng.randint(2, 9)
    unit, per, wrong, small = rng.choice(
        (
            ("hours", 60, 100, "minutes"),
            ("metres", 100, 1000, "centimetres"),
            ("kilograms", 1000, 100, "grams"),
            ("minutes", 60, 100, "seconds"),
        )
    )
    question = f"How many {small} are in {x} {unit}?"
    partial = f"One of the {unit[:-1]} is {wrong if slip else per} {small}, so I multiply that by {x}."
    return kind, question, partial, not slip


def _confidence(n: int, rng: random.Random) -> list[Example]:
    rows: list[Example] = []
    for i in range(n):
        kind, question, partial, correct = _confidence_problem(rng, i)
        pid = f"steer-conf-{i:04d}"
        for framing, ask in (("direct", CORRECT_Q), ("inverted", INVERTED_Q)):
            rows.append(
                Example(
                    id=f"{pid}-{framing}",
                    label=int(correct),
                    group=f"steer_confidence/{framing}",
                    messages=(
                        {"role": "user", "content": question},
                        {"role": "assistant", "content": partial},
                        {"role": "user", "content": ask},
                    ),
                    meta={"pair": pid, "kind": kind, "framing": framing, "partial_correct": correct},
                )
            )
    return rows


def _backtracking(n: int, rng: random.Random) -> list[Example]:
    rows: list[Example] = []
    for i in range(n):
        problem = backtracking._word_problem(rng)
        _, results = backtracking.solve(problem)
        rows.append(
            Example(
                id=f"steer-bt-{i:04d}",
                label=1,
                group=f"steer_backtracking/{problem.template}",
                messages=({"role": "user", "content": f"{problem.question} {BACKTRACK_INSTRUCTION}"},),
                meta={"answer": problem.answer(results[-1]), "template": problem.template},
            )
        )
    return rows


def _code(n: int, rng: random.Random) -> list[Example]:
    order = list(range(len(CODE_TASKS)))
    rng.shuffle(order)
    rows: list[Example] = []
    for i in range(n):
        lap, k = divmod(i, len(order))
        name, sig, what = CODE_TASKS[order[k]]
        template = CODE_TEMPLATES[(k + lap) % len(CODE_TEMPLATES)]
        rows.append(
            Example(
                id=f"steer-code-{i:04d}",
                label=1,
                group="steer_code/function",
                messages=({"role": "user", "content": template.format(name=name, sig=sig, what=what)},),
                meta={"function": name},
            )
        )
    return rows


def _refusal(n: int, rng: random.Random) -> list[Example]:
    rows: list[Example] = []
    for i, (tid, _, harmful, benign) in enumerate(refusal.refusal_pairs((n + 1) // 2, rng)):
        pid = f"steer-ref-{i:04d}"
        for kind, text, label in (("harmful", harmful, 0), ("benign", benign, 1)):
            rows.append(
                Example(
                    id=f"{pid}-{kind}",
                    label=label,
                    group=f"steer_refusal/{kind}",
                    messages=({"role": "user", "content": text},),
                    meta={"pair": pid, "topic": tid, "should_refuse": label == 0},
                )
            )
    return rows


def _open(n: int, rng: random.Random) -> list[Example]:
    combos = [(t, k) for k in range(len(OPEN_TEMPLATES)) for t in OPEN_TOPICS]
    rng.shuffle(combos)
    rows: list[Example] = []
    for i, (topic, k) in enumerate(combos[:n]):
        rows.append(
            Example(
                id=f"steer-open-{i:04d}",
                label=1,
                group=f"steer_open/{('about', 'story', 'describe', 'sentences')[k]}",
                messages=({"role": "user", "content": OPEN_TEMPLATES[k].format(t=topic)},),
                meta={"topic": topic},
            )
        )
    return rows


def generate(*, seed: int = 0, n: int | None = None) -> dict[str, list[Example]]:
    """The five steering prompt sets, ``n`` prompts each (default 64), with their prompt conditions
    and the neutral corpus for side effects (`valueprobe.datasets.conditions`; neither depends on ``n``).

    >>> out = generate(seed=0, n=2)
    >>> [len(out[k]) for k in sorted(out)]
    [48, 2, 2, 15, 4, 2, 2]
    """
    n = DEFAULT_N if n is None else n
    if n > MAX_N:
        raise ValueprobeError(f"--n {n} is too large for the steering family; use at most {MAX_N}")
    return {
        "steer_confidence": _confidence(n, random.Random(f"steer_confidence:{seed}")),
        "steer_backtracking": _backtracking(n, random.Random(f"steer_backtracking:{seed}")),
        "steer_code": _code(n, random.Random(f"steer_code:{seed}")),
        "steer_refusal": _refusal(n, random.Random(f"steer_refusal:{seed}")),
        "steer_open": _open(n, random.Random(f"steer_open:{seed}")),
        "steer_conditions": conditions.conditions(),
        "neutral_text": conditions.neutral_text(random.Random(f"neutral_text:{seed}")),
    }
