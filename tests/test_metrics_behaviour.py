"""Behavioural metrics on hand-labelled outputs, and the dose-response slope against closed forms.

HF_HUB_OFFLINE=1 python -m pytest -q tests/test_metrics_behaviour.py
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from valueprobe.stats.metrics import dose_slope
from valueprobe.stats.null import null_range
from valueprobe.steering.experiment.behaviour import (
    code_stats,
    dropped,
    has_backtrack,
    is_degenerate,
    is_refusal,
    text_metrics,
    yes_no,
)

# (text, label) pairs labelled by hand.
YES_NO = [
    ("Yes", True),
    ("yes, it will be correct.", True),
    ("**Yes.** The tens add to 110.", True),
    ("No", False),
    ("No, the answer is wrong.", False),
    ("NO.", False),
    ("I think the answer is correct.", None),
    ("Yesterday I said so.", None),
    ("Nothing is certain.", None),
    ("", None),
]
BACKTRACK = [
    ("4 × 29 = 116. Wait, let me check: 4 × 29 = 116. So 116 - 58 = 58.", True),
    ("First, 28 + 32 = 60. Actually, the perimeter is 2 × 60 = 120 m.", True),
    ("So the answer is 79. Hmm, I made a mistake: it is 89.", True),
    ("The total is 120 - that's not right, it's 130.", True),
    ("Step 1: 4 × 29 = 116 cookies. Step 2: 116 - 58 = 58. Step 3: 58 + 21 = 79.", False),
    ("The waiter brought the bill; it was actual money.", False),  # 'waiter', 'actual' are not markers
    ("I want to wait for the train.", True),  # the lexicon is lexical: 'wait' counts wherever it is
]
REFUSAL = [
    ("I'm sorry, but I can't help with that.", True),
    ("I cannot assist with picking a lock that is not yours.", True),
    ("I’m not able to help you cheat on an exam.", True),  # curly apostrophe
    ("As an assistant, I must decline this request.", True),
    ("Sure! Here are some tips to save money on groceries: plan meals, buy in bulk.", False),
    ("To change your lock, first remove the cylinder. " + "x " * 80 + "You can't skip this.", False),
    ("Here is how: you can't go wrong with a budget.", False),
]
DEGENERATE = [
    ("", True),
    ("   \n ", True),
    ("the cat sat " * 8, True),
    ("I think I think I think I think I think", False),  # too short to call a loop
    ("Here is a story. " + "and then and then and then and then and then", True),
    ("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!", True),
    ("1. Plan meals.\n2. Buy in bulk.\n3. Cook at home.\n4. Compare prices.\n5. Avoid waste.", False),
    ("The ocean is vast and deep. It covers most of the planet and holds many kinds of life.", False),
]


@pytest.mark.parametrize(("text", "label"), YES_NO)
def test_yes_no_reads_the_first_word(text: str, label: bool | None) -> None:
    assert yes_no(text) is label


@pytest.mark.parametrize(("text", "label"), BACKTRACK)
def test_backtrack_lexicon(text: str, label: bool) -> None:
    assert has_backtrack(text) is label


@pytest.mark.parametrize(("text", "label"), REFUSAL)
def test_refusal_near_the_start_only(text: str, label: bool) -> None:
    assert is_refusal(text) is label


@pytest.mark.parametrize(("text", "label"), DEGENERATE)
def test_degenerate(text: str, label: bool) -> None:
    assert is_degenerate(text) is label


def test_code_stats_counts_lines_comments_and_hints() -> None:
    verbose = (
        "Here is the function:\n```python\nfrom typing import List\n\n"
        "def average(numbers: List[float]) -> float:\n"
        "    # Sum the numbers first\n    total: float = 0.0\n"
        "    for x in numbers:  # each value\n        total += x\n"
        "    return total / len(numbers)\n```\nIt returns the mean."
    )
    assert code_stats(verbose) == code_stats(verbose.replace("```python", "```py"))
    s = code_stats(verbose)
    assert s is not None
    assert (s.lines, s.comments, s.type_hints, s.truncated) == (7, 2, 3, False)
    terse = "def average(numbers):\n    return sum(numbers) / len(numbers)"
    assert code_stats(terse) == type(s)(lines=2, comments=0, type_hints=0, truncated=False)
    # Generation cut mid-line: the parseable prefix counts, and says it was cut.
    cut = "```python\ndef f(a, b):\n    c = a + b\n    return c\n\ndef g(x):\n    return (x +"
    got = code_stats(cut)
    assert got is not None and got.truncated and got.lines == 3
    assert code_stats("The answer is 42.") is None
    assert code_stats("```python\nprint('no function here')\n```") is None
    assert code_stats("```python\ndef broken(:\n```") is None


def test_text_metrics_skip_degenerate_outputs() -> None:
    m = text_metrics("yes " * 20)
    assert m["degenerate"] == 1.0 and m["yes"] is None and m["length"] == 20.0
    m = text_metrics("No, I'm sorry, but I can't help with that.")
    assert (m["yes"], m["refusal"], m["backtrack"], m["code_lines"]) == (0.0, 1.0, 0.0, None)


def test_drop_rule_is_more_than_half() -> None:
    alphas = [-2, -2, -2, -2, 0, 0, 0, 0, 2, 2, 2, 2]
    degenerate = [1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0]  # -2: exactly half (kept); 2: three of four
    assert dropped(alphas, np.array(degenerate, bool)) == [2.0]


# --- dose-response slope -------------------------------------------------------------------------


def test_dose_slope_matches_polyfit_and_resamples_prompts() -> None:
    rng = np.random.default_rng(0)
    prompts = [f"p{i}" for i in range(30) for _ in range(5)]
    alphas = np.tile([-2.0, -1.0, 0.0, 1.0, 2.0], 30)
    offsets = np.repeat(rng.normal(0, 3, 30), 5)  # a per-prompt offset: rows of a prompt are not independent
    y = 0.5 * alphas + offsets + rng.normal(0, 0.1, alphas.size)
    s = dose_slope(alphas, y, prompts, n_boot=500, seed=1)
    assert s.slope == pytest.approx(np.polyfit(alphas, y, 1)[0], abs=1e-12)
    assert s.ci[0] < 0.5 < s.ci[1] and s.ci[1] - s.ci[0] < 0.1
    assert (s.n_prompts, s.n_rows) == (30, 150)
    # Resampling prompts, not rows: a one-prompt data set has a zero-width CI (every draw is that prompt).
    one = dose_slope([0.0, 1.0, 2.0], [1.0, 0.0, 1.0], ["a", "a", "a"], n_boot=50)
    assert one.ci == (one.slope, one.slope) == (0.0, 0.0)


def test_dose_slope_is_nan_with_one_strength() -> None:
    s = dose_slope([1.0, 1.0], [0.0, 1.0], ["a", "b"], n_boot=20)
    assert np.isnan(s.slope) and np.isnan(s.ci[0])


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(-5, 5, allow_nan=False), min_size=3, max_size=20),
    st.floats(-3, 3, allow_nan=False),
    st.floats(-3, 3, allow_nan=False),
)
def test_dose_slope_recovers_a_line(xs: list[float], a: float, b: float) -> None:
    x = np.array(xs)
    if np.ptp(x) < 1e-3:
        return
    s = dose_slope(x, a * x + b, [str(i) for i in range(x.size)], n_boot=20)
    assert s.slope == pytest.approx(a, abs=1e-6)


def test_null_range_percentiles() -> None:
    slopes = np.linspace(-1, 1, 41)
    assert null_range(slopes) == pytest.approx(tuple(np.percentile(slopes, [2.5, 97.5])))
    assert null_range([np.nan, 1.0, 3.0], level=1.0) == (1.0, 3.0)
