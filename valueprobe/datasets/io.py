"""The dataset contract: one example per JSONL line, read and written with validation.

>>> from valueprobe.datasets import read_jsonl
>>> examples = read_jsonl("data/icrl.jsonl")
>>> examples[0].group, examples[0].spans[0].label
('icrl/contains_dash', 'pre')

A line looks like
``{"group":"code/shuffled","id":"code-0007-shuffled","label":0,"meta":{"pair":"code-0007"},"spans":[],"text":"..."}``.
Chat data uses ``messages`` (a list of ``{"role", "content"}``) instead of ``text``. A span with
``message`` set indexes ``messages[message]["content"]``: datasets cannot know a model's chat
template, so capture maps these offsets onto the rendered text. Offsets are characters, end exclusive.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from valueprobe.datasets.shipped import resolve_dataset_name, shipped_datasets
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_bytes

__all__ = [
    "Example",
    "Span",
    "regroup",
    "example_from_dict",
    "example_to_dict",
    "linked_groups",
    "read_jsonl",
    "write_jsonl",
]

_TOP_KEYS = ("id", "text", "messages", "label", "group", "spans", "meta")
_SPAN_KEYS = ("start", "end", "label", "message")


@dataclass(frozen=True)
class Span:
    """A character range ``[start, end)`` with a name such as ``"pre"``, ``"post"`` or ``"prefix"``."""

    start: int
    end: int
    label: str
    message: int | None = None  # set: offsets index messages[message]["content"]


@dataclass(frozen=True)
class Example:
    """One labelled example: exactly one of ``text`` or ``messages``.

    ``label`` is 1 for success / value up and 0 for failure (floats allowed for graded
    targets); ``group`` drives held-out splits. Construction checks the contract and raises
    :class:`ValueprobeError` with one line if it is broken.

    >>> Example(id="a", label=1, group="g", text="hello", spans=(Span(0, 5, "all"),)).spans[0].end
    5
    """

    id: str
    label: float
    group: str
    text: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    spans: tuple[Span, ...] = ()
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Normalise containers so equality and serialisation do not depend on list vs tuple.
        if isinstance(self.messages, list):
            object.__setattr__(self, "messages", tuple(self.messages))
        if isinstance(self.spans, list):
            object.__setattr__(self, "spans", tuple(self.spans))
        problem = _problem(self)
        if problem:
            raise ValueprobeError(f"example {self.id!r}: {problem}")


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _problem(ex: Example) -> str | None:
    """The first way ``ex`` breaks the contract, or None."""
    if not isinstance(ex.id, str) or not ex.id:
        return "'id' must be a non-empty string"
    if isinstance(ex.label, bool) or not isinstance(ex.label, (int, float)):
        return f"'label' must be a number, got {ex.label!r}"
    if not math.isfinite(ex.label):
        return f"'label' must be finite, got {ex.label!r}"
    if not isinstance(ex.group, str) or not ex.group:
        return "'group' must be a non-empty string"
    if (ex.text is None) == (ex.messages is None):
        return "give exactly one of 'text' or 'messages'"
    if ex.text is not None and not isinstance(ex.text, str):
        return "'text' must be a string"
    if ex.messages is not None:
        if not ex.messages:
            return "'messages' must be a non-empty list"
        for i, m in enumerate(ex.messages):
            if not isinstance(m, dict) or set(m) != {"role", "content"}:
                return f"messages[{i}] must be an object with exactly 'role' and 'content'"
            if not isinstance(m["role"], str) or not m["role"] or not isinstance(m["content"], str):
                return f"messages[{i}] needs a non-empty string 'role' and a string 'content'"
    if not isinstance(ex.meta, dict):
        return "'meta' must be an object"
    for i, s in enumerate(ex.spans):
        if not isinstance(s, Span):
            return f"spans[{i}] is not a Span"
        if not (_is_int(s.start) and _is_int(s.end)) or not isinstance(s.label, str) or not s.label:
            return f"spans[{i}] needs integer 'start'/'end' and a non-empty string 'label'"
        if s.message is not None:
            if ex.messages is None:
                return f"spans[{i}] sets 'message' but the example has 'text'"
            if not _is_int(s.message) or not 0 <= s.message < len(ex.messages):
                return f"spans[{i}] 'message' {s.message!r} is not in 0..{len(ex.messages) - 1}"
            limit: int | None = len(ex.messages[s.message]["content"])
            where = f"messages[{s.message}].content"
        elif ex.text is not None:
            limit, where = len(ex.text), "text"
        else:
            limit, where = None, "rendered chat"  # offsets into the rendered chat; length unknown here
        if s.start < 0 or s.end <= s.start or (limit is not None and s.end > limit):
            bound = f"0..{limit}" if limit is not None else "0.."
            return (
                f"spans[{i}] ({s.label!r}) [{s.start}, {s.end}) is out of range or empty:"
                f" it must satisfy 0 <= start < end <= len({where}) = {bound}"
            )
    return None


def example_to_dict(ex: Example) -> dict:
    """The JSON form of ``ex`` (integral labels are written as ints)."""
    d: dict = {"id": ex.id, "group": ex.group}
    label = ex.label
    d["label"] = int(label) if float(label).is_integer() else float(label)
    if ex.text is not None:
        d["text"] = ex.text
    else:
        d["messages"] = [{"role": m["role"], "content": m["content"]} for m in ex.messages or ()]
    spans = []
    for s in ex.spans:
        sd: dict = {"start": s.start, "end": s.end, "label": s.label}
        if s.message is not None:
            sd["message"] = s.message
        spans.append(sd)
    d["spans"] = spans
    d["meta"] = dict(ex.meta)
    return d


def example_from_dict(d: dict, *, where: str) -> Example:
    """Build an :class:`Example` from its JSON form; ``where`` (``file:line``) prefixes any error.

    Unknown top-level keys are folded into ``meta``.
    """
    if not isinstance(d, dict):
        raise ValueprobeError(f"{where}: expected a JSON object, got {type(d).__name__}")
    for key in ("id", "label", "group"):
        if key not in d:
            raise ValueprobeError(
                f"{where}: missing required field {key!r}; every line needs id, label, group"
            )
    meta = d.get("meta", {})
    if not isinstance(meta, dict):
        raise ValueprobeError(f"{where}: 'meta' must be an object")
    extra = {k: v for k, v in d.items() if k not in _TOP_KEYS}
    meta = {**meta, **extra} if extra else meta
    raw_spans = d.get("spans", [])
    if not isinstance(raw_spans, list):
        raise ValueprobeError(f"{where}: 'spans' must be a list")
    spans = []
    for i, s in enumerate(raw_spans):
        if not isinstance(s, dict) or not {"start", "end", "label"} <= set(s) or set(s) - set(_SPAN_KEYS):
            raise ValueprobeError(
                f"{where}: spans[{i}] must be an object with 'start', 'end', 'label' and optional 'message'"
            )
        spans.append(Span(start=s["start"], end=s["end"], label=s["label"], message=s.get("message")))
    messages = d.get("messages")
    if messages is not None:
        if not isinstance(messages, list):
            raise ValueprobeError(f"{where}: 'messages' must be a list of {{role, content}} objects")
        messages = tuple(messages)
    label = d["label"]
    if isinstance(label, int) and not isinstance(label, bool):
        label = float(label)
    try:
        return Example(
            id=d["id"],
            label=label,
            group=d["group"],
            text=d.get("text"),
            messages=messages,
            spans=tuple(spans),
            meta=meta,
        )
    except ValueprobeError as e:
        raise ValueprobeError(f"{where}: {e}") from None


def read_jsonl(path: str | Path) -> list[Example]:
    """Read and validate a dataset file; any problem raises :class:`ValueprobeError` naming ``file:line``.

    ``path`` may also name a shipped dataset (``read_jsonl("code")``, see
    :mod:`valueprobe.datasets.shipped`). Blank lines are skipped; a file with no examples, duplicate
    ids, bad JSON, missing fields and spans outside their text are all errors.
    """
    path = resolve_dataset_name(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        names = (
            f", or give a shipped dataset's name ({', '.join(shipped_datasets())})"
            if not path.exists()
            else ""
        )
        raise ValueprobeError(
            f"{path}: cannot read dataset ({e.strerror or e}); check the path{names}"
        ) from None
    try:
        content = raw.decode("utf-8-sig")  # a leading BOM (Windows editors) is not part of the data
    except UnicodeDecodeError as e:
        raise ValueprobeError(
            f"{path}: not UTF-8 ({e.reason} at byte {e.start}); save the file as UTF-8"
        ) from None
    examples: list[Example] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(content.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueprobeError(
                f"{where}: invalid JSON ({e.msg} at column {e.colno}); one object per line"
            ) from None
        ex = example_from_dict(d, where=where)
        if ex.id in seen:
            raise ValueprobeError(
                f"{where}: duplicate id {ex.id!r} (first at line {seen[ex.id]}); ids must be unique"
            )
        seen[ex.id] = lineno
        examples.append(ex)
    if not examples:
        raise ValueprobeError(
            f"{path}: no examples (the file is empty); a dataset needs at least one JSONL line"
        )
    return examples


def dumps_jsonl(examples: Iterable[Example]) -> bytes:
    """The exact bytes :func:`write_jsonl` writes: sorted keys, UTF-8, one ``\\n``-terminated line each."""
    lines = []
    seen: set[str] = set()
    for ex in examples:
        if not isinstance(ex, Example):
            raise ValueprobeError(f"write_jsonl expects Example objects, got {type(ex).__name__}")
        if ex.id in seen:
            raise ValueprobeError(f"duplicate example id {ex.id!r}; ids must be unique within a file")
        seen.add(ex.id)
        lines.append(
            json.dumps(example_to_dict(ex), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        )
    if not lines:
        raise ValueprobeError("no examples to write; a dataset needs at least one example")
    return ("\n".join(lines) + "\n").encode("utf-8")


def write_jsonl(path: str | Path, examples: Iterable[Example]) -> str:
    """Validate and write ``examples`` atomically with deterministic bytes; returns their sha256 hex."""
    data = dumps_jsonl(examples)
    atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def linked_groups(examples: Iterable[Example], key: str = "pair") -> dict[str, str]:
    """Map each example id to the name of its linked set through ``meta[key]``.

    Datasets link matched rows in two ways: to a shared value (``refusal-0007``), or to each
    other's ids (a corrupted function names its original; two rollouts name each other). Both are
    edges of one graph; a set is a connected component, named by its smallest member, so an
    original and all its variants land in one group whatever the convention.

    >>> linked_groups([Example(id="a", label=1, group="g", text="x"),
    ...                Example(id="b", label=0, group="g", text="y", meta={"pair": "a"})])
    {'a': 'a', 'b': 'a'}
    """
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    ids = []
    for ex in examples:
        ids.append(ex.id)
        a = find(ex.id)
        if key in ex.meta:
            b = find(str(ex.meta[key]))
            if a != b:
                parent[max(a, b)] = min(a, b)
    return {i: find(i) for i in ids}


def regroup(examples: Sequence[Example], group_by: str | None) -> list[Example]:
    """Re-key each example's ``group`` by the rows it is linked to through ``meta.KEY``.

    Held-out splits hold out whole groups; ``"meta.pair"`` keeps an original and its corrupted
    variants (or two matched rollouts) in one group, so each group holds both classes. See
    :func:`valueprobe.datasets.io.linked_groups`.

    >>> regroup(examples, "meta.pair")[0].group   # doctest: +SKIP
    'code-0000'
    """
    if group_by is None:
        return list(examples)
    if not group_by.startswith("meta."):
        raise ValueprobeError(f"group_by {group_by!r} must name a meta key, like 'meta.pair'")
    key = group_by[len("meta.") :]
    groups = linked_groups(examples, key)
    if len(set(groups.values())) == len(groups):
        # Every example alone in its group would silently undo the held-out pairing.
        seen = sorted({k for ex in examples for k in ex.meta})
        have = sum(key in ex.meta for ex in examples)
        raise ValueprobeError(
            f"--group-by {group_by} links no two examples ({have} of {len(groups)} have meta.{key}); "
            f"meta keys in this dataset: {', '.join(seen) or 'none'}"
        )
    return [replace(ex, group=groups[ex.id]) for ex in examples]
