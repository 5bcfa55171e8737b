"""Checkable tasks: read a task file, pull the answer out of a response by a stated rule, check it.

    >>> tasks = read_tasks("data/task_arithmetic.jsonl")
    >>> check(tasks[0], "12 + 7 = 19, so the answer is 19.")
    >>> extract_integer("It costs $1,250. That is 3 more than before.")
    3

The rules (tested in tests/test_tasks.py):
- **arithmetic**: the answer is the *last integer* in the response. Runs of digits and commas are
  read as one number when the commas group thousands (``1,250``), and as a list otherwise
  (``2,3,4`` ends in 4); a run with a non-zero fraction is no integer and is skipped (``3.5``;
  ``3.0`` is 3); a minus sign counts when the start of the text, a space, ``(``, ``=`` or ``:``
  precedes it (``x-3`` ends in 3). No integer: wrong. Right when it equals ``meta.answer``.
- **code**: the answer is the body of the *first* fenced block opened with ```` ```python ````
  (any case; ```` ```py ```` too); without one, the whole response. Right when every assert of
  ``meta.tests`` holds in the sandbox (`valueprobe.datasets.sandbox`): killed at the time limit,
  an answer counts as wrong and the run goes on.

A task file is a dataset JSONL (`valueprobe.datasets.io`) whose rows say their kind in
``meta.task`` (``arithmetic`` or ``code``). Rows whose answers do not parse (an arithmetic
answer that is no integer, code tests that are not assert statements) stop the read with one
line naming ``file:line``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from valueprobe.datasets.io import Example, read_jsonl
from valueprobe.datasets.sandbox import Outcome, run_asserts
from valueprobe.errors import ValueprobeError

__all__ = ["Task", "Verdict", "check", "extract_code", "extract_integer", "read_tasks"]

Kind = Literal["arithmetic", "code"]
KINDS: tuple[str, ...] = ("arithmetic", "code")

# a run of digits and commas, then an optional fraction (a sign is checked apart)
_NUMBER = re.compile(r"(?<![\d.])\d[\d,]*(?:\.\d+)?")
_GROUPED = re.compile(r"\d{1,3}(?:,\d{3})+")
_FENCE = re.compile(r"```[ \t]*(?:python|py)[ \t]*\r?\n(.*?)(?:```|\Z)", re.IGNORECASE | re.DOTALL)
_INTEGER_TEXT = re.compile(r"-?\d+")


@dataclass(frozen=True)
class Task:
    """One checkable task: its prompt (a chat), its kind and what a right answer is.

    ``answer`` is the integer of an arithmetic task; ``tests`` the assert statements of a code task.
    """

    id: str
    group: str
    kind: Kind
    messages: tuple[dict[str, str], ...]
    answer: int | None = None
    tests: tuple[str, ...] = ()
    function: str | None = None


@dataclass(frozen=True)
class Verdict:
    """A checked response: ``correct``, what was extracted, and the sandbox's outcome for code."""

    correct: bool
    extracted: str | None
    outcome: Outcome | None = None


def extract_integer(response: str) -> int | None:
    """The last integer in ``response`` (see the module's rule), or None.

    >>> extract_integer("5 - 3 = 2"), extract_integer("It is -4."), extract_integer("about 2.5")
    (2, -4, None)
    """
    for match in reversed(list(_NUMBER.finditer(response))):
        whole, _, fraction = match.group().partition(".")
        if fraction.strip("0"):
            continue  # 3.5 is not an integer
        whole = whole.rstrip(",")  # "12, then" is 12
        if "," in whole and not _GROUPED.fullmatch(whole):
            return int(whole.rsplit(",", 1)[1])  # "2,3,4" is a list: its last is 4
        value = int(whole.replace(",", ""))
        before = response[: match.start()]
        if before.endswith("-") and (len(before) == 1 or before[-2] in " \t\n(=:"):
            value = -value
        return value
    return None


def extract_code(response: str) -> str:
    """The first ```python (or ```py) block of ``response``, or the whole response without one."""
    found = _FENCE.search(response)
    return found.group(1) if found else response


def check(task: Task, response: str, *, timeout_s: float = 5.0, memory_mb: int = 512) -> Verdict:
    """Whether ``response`` answers ``task`` right, by the module's extraction rule."""
    if task.kind == "arithmetic":
        got = extract_integer(response)
        return Verdict(got is not None and got == task.answer, None if got is None else str(got))
    code = extract_code(response)
    outcome = run_asserts(code, task.tests, timeout_s=timeout_s, memory_mb=memory_mb)
    return Verdict(outcome.passed, code, outcome)


def read_tasks(path: str | Path) -> list[Task]:
    """The tasks of a task file; a row whose answer does not parse raises one line naming file:line."""
    path = Path(path)
    examples = read_jsonl(path)
    lines = [i for i, line in enumerate(path.read_text(encoding="utf-8-sig").split("\n"), 1) if line.strip()]
    return [_task(ex, f"{path}:{line}") for ex, line in zip(examples, lines, strict=True)]


def _task(ex: Example, where: str) -> Task:
    kind = ex.meta.get("task")
    if kind not in KINDS:
        raise ValueprobeError(f"{where}: meta.task must be one of {', '.join(KINDS)}, got {kind!r}")
    if ex.messages is None:
        raise ValueprobeError(f"{where}: a task row needs 'messages' (the chat to answer)")
    if kind == "arithmetic":
        return Task(ex.id, ex.group, "arithmetic", ex.messages, answer=_integer(ex.meta.get("answer"), where))
    tests = ex.meta.get("tests")
    if not isinstance(tests, list) or not tests:
        raise ValueprobeError(f"{where}: meta.tests must be a non-empty list of assert statements")
    for test in tests:
        if not isinstance(test, str) or not _is_assert(test):
            raise ValueprobeError(f"{where}: meta.tests holds {test!r}, which is not one assert statement")
    return Task(ex.id, ex.group, "code", ex.messages, tests=tuple(tests), function=ex.meta.get("function"))


def _integer(raw: object, where: str) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and _INTEGER_TEXT.fullmatch(raw.strip()):
        return int(raw)
    raise ValueprobeError(
        f"{where}: meta.answer {raw!r} is not an integer; arithmetic answers are exact integers"
    )


def _is_assert(source: str) -> bool:
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return False
    return len(body) == 1 and isinstance(body[0], ast.Assert)
