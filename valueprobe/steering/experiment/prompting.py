"""Prompt conditions: the prompting baseline a steering sweep stands beside, read from a data file.

    valueprobe steer --probe probes/smollm2-135m-value --prompts data/steer_open.jsonl \\
        --conditions toward,away,reworded --out runs/steer-open

    >>> conds = read_conditions("data/steer_conditions.jsonl", "steer_open", ("toward", "away"))
    >>> conds[0].apply([{"role": "user", "content": "Describe the moon."}])
    [{'role': 'system', 'content': 'Answer briefly, in one or two sentences.'}, {'role': 'user', ...}]

Every prompt a condition adds is stated in the conditions file (``data/steer_conditions.jsonl``,
built by `valueprobe.datasets.conditions`), never in code: a ``system`` condition puts its system
prompt before the chat (``toward`` asks for the behaviour, ``away`` for its opposite); a
``wording`` condition rewrites the last user message through its template (``{prompt}`` is the
item's own message), the same items under a second wording. ``none`` is the plain prompt, always run.
The file also states each set's target: the metric, the subset it is read on, and the sign of its
move as value rises (`Goal`), which the per-item reliability and the effect-vs-KL front read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from valueprobe.datasets.io import Example, read_jsonl
from valueprobe.errors import ValueprobeError

__all__ = [
    "CONDITIONS_FILE",
    "NONE",
    "PromptCondition",
    "Goal",
    "conditions_path",
    "parse_conditions",
    "read_conditions",
    "read_target",
]

NONE = "none"  # the plain prompt: the condition every sweep runs
CONDITIONS_FILE = "steer_conditions.jsonl"
PLACEHOLDER = "{prompt}"
Chat = list[dict[str, str]]


@dataclass(frozen=True)
class Goal:
    """What a prompt set's steering is meant to move: ``metric`` on ``subset`` (``all`` pools the
    groups), moving with ``sign`` (+1 or -1) as α rises."""

    metric: str
    subset: str
    sign: int


@dataclass(frozen=True)
class PromptCondition:
    """One prompt condition: a system prompt (``kind="system"``) or a second wording of the last
    user message (``kind="wording"``, ``text`` holding ``{prompt}``)."""

    name: str
    kind: Literal["system", "wording"]
    text: str

    def apply(self, prompt: Sequence[dict[str, str]] | str) -> Chat:
        """The chat under this condition; a plain-text prompt is read as one user message."""
        chat = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        if self.kind == "system":
            return [{"role": "system", "content": self.text}, *[m for m in chat if m.get("role") != "system"]]
        last = max(i for i, m in enumerate(chat) if m.get("role") == "user")
        chat[last] = {**chat[last], "content": self.text.replace(PLACEHOLDER, chat[last]["content"])}
        return chat


def conditions_path(prompts: str | Path) -> Path:
    """Where a prompt set's conditions are stated: ``steer_conditions.jsonl`` beside the prompts file."""
    return Path(prompts).parent / CONDITIONS_FILE


def parse_conditions(text: str) -> tuple[str, ...]:
    """``"toward,away"`` -> the condition names, in the order given; ``none`` or empty -> ().

    >>> parse_conditions("toward, away"), parse_conditions("none")
    (('toward', 'away'), ())
    """
    names = [c.strip() for c in str(text).split(",") if c.strip()]
    if names == [NONE]:
        return ()
    if NONE in names or len(set(names)) != len(names):
        raise ValueprobeError(
            f"--conditions {text!r}: list each condition once; 'none' (the plain prompt) always runs"
        )
    return tuple(names)


def _rows(path: Path, prompt_set: str) -> list[Example]:
    if not path.is_file():
        raise ValueprobeError(
            f"the prompt conditions file {path} does not exist: build it with `valueprobe datasets build"
            " --family steering --out DIR`, or give --conditions-file (or --conditions none)"
        )
    return [ex for ex in read_jsonl(path) if ex.meta.get("set") == prompt_set]


def _condition(ex: Example, where: str) -> PromptCondition:
    kind = ex.meta.get("kind")
    messages = ex.messages or ()
    if kind not in ("system", "wording") or len(messages) != 1:
        raise ValueprobeError(
            f"{where}: row {ex.id!r} must hold one message and meta.kind 'system' or 'wording', got {kind!r}"
        )
    text = str(messages[0].get("content", ""))
    role = "system" if kind == "system" else "user"
    if messages[0].get("role") != role or not text.strip():
        raise ValueprobeError(
            f"{where}: condition {ex.meta.get('condition')!r} names no {role} prompt (row {ex.id!r});"
            f" give it one {role} message with text"
        )
    if kind == "wording" and PLACEHOLDER not in text:
        raise ValueprobeError(f"{where}: the wording of row {ex.id!r} has no {PLACEHOLDER} for the item")
    return PromptCondition(str(ex.meta.get("condition")), kind, text)


def read_conditions(path: str | Path, prompt_set: str, names: Sequence[str]) -> tuple[PromptCondition, ...]:
    """The conditions ``names`` of ``prompt_set`` (a prompts file's stem) stated in ``path``.

    Raises one line for a missing file, a name the file states no prompt for, or a row without text.
    """
    path = Path(path)
    if not names:
        return ()
    by_name = {str(ex.meta.get("condition")): ex for ex in _rows(path, prompt_set)}
    out = []
    for name in names:
        if name not in by_name:
            stated = ", ".join(sorted(by_name)) or "none"
            raise ValueprobeError(
                f"prompt condition {name!r} names no system prompt or wording for {prompt_set} in {path}"
                f" (it states: {stated}); add a row for it or choose from those"
            )
        out.append(_condition(by_name[name], f"{path}"))
    return tuple(out)


def read_target(path: str | Path, prompt_set: str) -> Goal | None:
    """The target ``path`` states for ``prompt_set`` (None: the file or the set is not there)."""
    path = Path(path)
    if not path.is_file():
        return None
    for ex in read_jsonl(path):
        if ex.meta.get("set") == prompt_set and {"metric", "subset", "sign"} <= set(ex.meta):
            sign = int(ex.meta["sign"])
            if sign not in (-1, 1):
                raise ValueprobeError(f"{path}: row {ex.id!r} has meta.sign {sign}; use 1 or -1")
            return Goal(str(ex.meta["metric"]), str(ex.meta["subset"]), sign)
    return None
