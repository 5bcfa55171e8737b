"""Checkable tasks: the answer-extraction rules, the sandbox's limits, the task files and their reader.

Run: ``python -m pytest -q tests/test_tasks.py``
References: hand-worked extraction cases and hypothesis round trips; each arithmetic answer
recomputed from the numbers in its question by a formula written here, per template; each code
task's reference solution passing its asserts in the sandbox (and a wrong one failing them).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from valueprobe.datasets import tasks
from valueprobe.datasets.answers import check, extract_code, extract_integer, read_tasks
from valueprobe.datasets.io import read_jsonl
from valueprobe.datasets.sandbox import network_isolation, run_asserts
from valueprobe.errors import ValueprobeError

DATA = Path(__file__).resolve().parents[1] / "data"


# --- the arithmetic rule: the last integer -------------------------------------------------------

LAST_INTEGER = [
    ("5 - 3 = 2", 2),
    ("It is -4.", -4),
    ("(-5)", -5),
    ("x-3", 3),  # a minus glued to a word is not a sign
    ("The answer is 1,250.", 1250),
    ("It costs $1,250. That is 3 more than before.", 3),
    ("2,3,4", 4),  # commas that do not group thousands make a list
    ("12, then", 12),
    ("3.0 apples", 3),
    ("about 2.5", None),
    ("1.5 and 2.50", None),
    (".5", None),
    ("0.5 and 12.", 12),
    ("Step 1: 12 apples\nAnswer: 15", 15),
    ("5,000,000", 5000000),
    ("the 12th", 12),
    ("no number here", None),
    ("", None),
]


@pytest.mark.parametrize(("response", "want"), LAST_INTEGER)
def test_the_last_integer_by_hand(response, want):
    assert extract_integer(response) == want


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(-(10**9), 10**9),
    grouped=st.booleans(),
    lead=st.text(alphabet="abc xyz:=\n", max_size=20),
    tail=st.sampled_from(["", ".", " apples.", "!", "\n"]),
)
def test_the_last_integer_is_read_back(n, grouped, lead, tail):
    written = f"{n:,}" if grouped else str(n)
    response = f"{lead} so the answer is {written}{tail}"
    assert extract_integer(response) == n


def test_check_arithmetic_compares_the_last_integer():
    task = next(t for t in read_tasks(DATA / "task_arithmetic.jsonl"))
    right, wrong = task.answer, (task.answer or 0) + 1
    assert check(task, f"First {wrong}, then finally {right}.").correct
    assert not check(task, f"It is {right}, no wait, {wrong}.").correct
    assert not check(task, "I do not know.").correct


# --- the code rule: the first ```python block or the whole text ----------------------------------


def test_extract_code_takes_the_first_python_block():
    response = "Sure:\n```Python\ndef f():\n    return 1\n```\nOr:\n```python\ndef f():\n    return 2\n```"
    assert extract_code(response) == "def f():\n    return 1\n"
    assert extract_code("```py\nx = 1\n```") == "x = 1\n"
    assert extract_code("```python\nx = 1") == "x = 1"  # an unclosed block runs to the end
    assert extract_code("```\nx = 1\n```") == "```\nx = 1\n```"  # not python: the whole text
    assert extract_code("def f(): pass") == "def f(): pass"


# --- the sandbox ---------------------------------------------------------------------------------

ADD_TESTS = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]


def test_sandbox_passes_right_and_fails_wrong_answers():
    assert run_asserts("def add(a, b):\n    return a + b", ADD_TESTS).passed
    wrong = run_asserts("def add(a, b):\n    return a - b", ADD_TESTS)
    assert (wrong.status, wrong.n_passed) == ("failed", 0)
    assert run_asserts("def add(a, b) return", ADD_TESTS).status == "error"


def test_a_hanging_answer_is_killed_at_the_limit_and_the_run_goes_on():
    start = time.monotonic()
    hung = run_asserts("def add(a, b):\n    while True:\n        pass", ADD_TESTS, timeout_s=1.0)
    assert hung.status == "timeout" and not hung.passed
    assert time.monotonic() - start < 5
    assert run_asserts("def add(a, b):\n    return a + b", ADD_TESTS, timeout_s=1.0).passed


def test_memory_is_capped():
    greedy = "blob = bytearray(2 * 1024 ** 3)\ndef add(a, b):\n    return a + b"
    assert run_asserts(greedy, ADD_TESTS, memory_mb=256).status == "error"
    small = "blob = bytearray(16 * 1024 ** 2)\ndef add(a, b):\n    return a + b"
    assert run_asserts(small, ADD_TESTS, memory_mb=256).passed


@pytest.mark.parametrize(
    "escape",
    [
        "import socket\nsocket.create_connection(('127.0.0.1', 9))",
        "import socket\nsocket.socket()",
        "import subprocess\nsubprocess.run(['true'])",
        "import os\nos.system('true')",
        "import ctypes\nctypes.CDLL(None)",
    ],
)
def test_network_processes_and_ctypes_are_refused(escape):
    out = run_asserts(escape + "\ndef add(a, b):\n    return a + b", ADD_TESTS)
    assert out.status == "error" and "PermissionError" in out.detail, out


def test_the_namespace_has_no_network_interface_but_loopback():
    if network_isolation() != "unshare+audit":
        pytest.skip("unshare -n does not run here: the audit hook alone refuses sockets")
    probe = "names = [l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]]"
    assert run_asserts(probe, ["assert names == ['lo']"]).passed
    # the control: outside the namespace this machine has more than loopback
    assert len(Path("/proc/net/dev").read_text().splitlines()[2:]) > 1


def test_an_answer_that_exits_early_does_not_pass():
    for leave in ("import sys\nsys.exit(0)", "import os\nos._exit(0)", "raise SystemExit"):
        assert run_asserts(leave, ["assert True"]).status == "error", leave


def test_a_main_block_does_not_run_and_prints_are_dropped():
    answer = (
        "def add(a, b):\n    print('x' * 10000)\n    return a + b\nif __name__ == '__main__':\n    input()"
    )
    assert run_asserts(answer, ADD_TESTS, timeout_s=2.0).passed


# --- the committed task files --------------------------------------------------------------------

# per template, the answer from the integers of the question, in order (written apart from the generator)
FORMULAS = {
    "l1_more": lambda a, b: a + b,
    "l1_left": lambda a, b: a - b,
    "l2_more": lambda a, b: a + b,
    "l2_left": lambda a, b: a - b,
    "l3_packs": lambda a, b, c: a * b + c,
    "l3_steps": lambda a, b, c: a + b - c,
}


def test_arithmetic_answers_follow_from_their_questions():
    rows = read_jsonl(DATA / "task_arithmetic.jsonl")
    assert {r.group for r in rows} == {f"task_arithmetic/level{k}" for k in (1, 2, 3)}
    for row in rows:
        numbers = [int(x) for x in re.findall(r"\d+", row.messages[0]["content"])]
        want = FORMULAS[row.meta["template"]](*numbers)
        assert want == row.meta["answer"] > 0, row.id


def test_every_code_task_passes_its_reference_and_fails_a_wrong_answer():
    for task, row in zip(
        read_tasks(DATA / "task_code.jsonl"), read_jsonl(DATA / "task_code.jsonl"), strict=True
    ):
        assert len(set(task.tests)) == tasks.TESTS_PER_FUNCTION
        assert run_asserts(row.meta["reference"], task.tests).passed, task.id
        stub = f"def {task.function}(*args):\n    return object()"
        assert run_asserts(stub, task.tests).n_passed == 0, task.id


# --- reading a task file: answers that do not parse ---------------------------------------------


def _task_file(tmp_path: Path, meta: dict) -> Path:
    good = json.loads((DATA / "task_arithmetic.jsonl").read_text().splitlines()[0])
    bad = {**good, "id": "bad", "meta": meta}
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(bad) + "\n")
    return path


@pytest.mark.parametrize(
    ("meta", "says"),
    [
        ({"task": "arithmetic", "answer": "twelve"}, "meta.answer 'twelve' is not an integer"),
        ({"task": "arithmetic", "answer": 2.5}, "meta.answer 2.5 is not an integer"),
        ({"task": "arithmetic"}, "meta.answer None is not an integer"),
        ({"task": "code", "tests": ["add(1, 2) == 3"]}, "is not one assert statement"),
        ({"task": "code", "tests": []}, "meta.tests must be a non-empty list"),
        ({"task": "poetry"}, "meta.task must be one of arithmetic, code"),
    ],
)
def test_a_task_whose_answer_does_not_parse_names_its_line(tmp_path, meta, says):
    path = _task_file(tmp_path, meta)
    with pytest.raises(ValueprobeError) as e:
        read_tasks(path)
    assert str(e.value).startswith(f"{path}:3: ") and says in str(e.value)
    assert "\n" not in str(e.value)


def test_an_integer_answer_written_as_text_is_read(tmp_path):
    read = read_tasks(_task_file(tmp_path, {"task": "arithmetic", "answer": " -42 "}))
    assert [t.answer for t in read][1] == -42
