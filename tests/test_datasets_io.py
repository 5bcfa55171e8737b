"""Property tests for the dataset JSONL reader and validator (valueprobe.datasets.io).

python -m pytest -q tests/test_datasets_io.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from valueprobe.datasets import Example, Span, read_jsonl, write_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.files import sha256_file

texts = st.text(min_size=1, max_size=40)


@st.composite
def examples(draw: st.DrawFn, ident: str | None = None) -> Example:
    chat = draw(st.booleans())
    if chat:
        messages = tuple(
            {"role": draw(st.sampled_from(["system", "user", "assistant"])), "content": draw(texts)}
            for _ in range(draw(st.integers(1, 3)))
        )
        k = draw(st.integers(0, len(messages) - 1))
        size, text, message = len(messages[k]["content"]), None, k
    else:
        text, messages, message = draw(texts), None, None
        size = len(text)
    start = draw(st.integers(0, size - 1))
    end = draw(st.integers(start + 1, size))
    label = draw(st.one_of(st.sampled_from([0.0, 1.0]), st.floats(-5, 5, allow_nan=False)))
    return Example(
        id=ident or draw(st.text(min_size=1, max_size=8)),
        label=label,
        group=draw(st.text(min_size=1, max_size=8)),
        text=text,
        messages=messages,
        spans=(Span(start, end, draw(st.sampled_from(["pre", "post", "prefix"])), message=message),),
        meta=draw(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3)),
    )


def _lines(n: int) -> list[str]:
    return [
        json.dumps(
            {
                "id": f"x{i}",
                "text": "hello",
                "label": 1,
                "group": "g",
                "spans": [{"start": 0, "end": 5, "label": "all"}],
            }
        )
        for i in range(n)
    ]


def _write(lines: list[str]) -> Path:
    d = Path(tempfile.mkdtemp())
    p = d / "data.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


@settings(max_examples=60, deadline=None)
@given(st.lists(examples(), min_size=1, max_size=4))
def test_round_trip(exs: list[Example]) -> None:
    exs = [Example(**{**ex.__dict__, "id": f"{i}-{ex.id}"}) for i, ex in enumerate(exs)]
    path = Path(tempfile.mkdtemp()) / "rt.jsonl"
    digest = write_jsonl(path, exs)
    assert digest == sha256_file(path)
    back = read_jsonl(path)
    assert [(b.id, b.text, b.messages, b.spans, b.meta) for b in back] == [
        (e.id, e.text, e.messages, e.spans, e.meta) for e in exs
    ]
    assert [b.label for b in back] == pytest.approx([e.label for e in exs])
    write_jsonl(path.with_name("again.jsonl"), back)
    assert path.with_name("again.jsonl").read_bytes() == path.read_bytes()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.data())
def test_malformed_json_names_file_and_line(n: int, data: st.DataObject) -> None:
    lines = _lines(n)
    k = data.draw(st.integers(0, n - 1))
    lines[k] = lines[k][: data.draw(st.integers(1, len(lines[k]) - 1))]  # truncated JSON
    path = _write(lines)
    with pytest.raises(ValueprobeError, match=f"{path}:{k + 1}:"):
        read_jsonl(path)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.data(), st.sampled_from(["id", "label", "group", "text"]))
def test_missing_field_names_file_and_line(n: int, data: st.DataObject, field: str) -> None:
    lines = _lines(n)
    k = data.draw(st.integers(0, n - 1))
    d = json.loads(lines[k])
    del d[field]
    lines[k] = json.dumps(d)
    path = _write(lines)
    with pytest.raises(ValueprobeError, match=f"{path}:{k + 1}:"):
        read_jsonl(path)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.data(), st.integers(-20, 20), st.integers(-20, 40))
def test_span_out_of_range_names_file_and_line(n: int, data: st.DataObject, start: int, end: int) -> None:
    lines = _lines(n)
    k = data.draw(st.integers(0, n - 1))
    d = json.loads(lines[k])  # text "hello": valid spans satisfy 0 <= start < end <= 5
    d["spans"] = [{"start": start, "end": end, "label": "x"}]
    lines[k] = json.dumps(d)
    path = _write(lines)
    if 0 <= start < end <= 5:
        assert read_jsonl(path)[k].spans[0] == Span(start, end, "x")
    else:
        with pytest.raises(ValueprobeError, match=f"{path}:{k + 1}:.*out of range"):
            read_jsonl(path)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 30), st.integers(1, 3))
def test_message_span_checked_against_its_message(end: int, which: int) -> None:
    d = {
        "id": "c",
        "label": 0,
        "group": "g",
        "messages": [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "Yes"}],
        "spans": [{"start": 0, "end": end, "label": "r", "message": which}],
    }
    path = _write([json.dumps(d)])
    if which <= 1 and 0 < end <= len(d["messages"][which]["content"]):
        assert read_jsonl(path)[0].spans[0].message == which
    else:
        with pytest.raises(ValueprobeError, match=f"{path}:1:"):
            read_jsonl(path)


@pytest.mark.parametrize("content", ["", "\n", "  \n\n"])
def test_empty_file_is_an_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(ValueprobeError, match=f"{path}: no examples"):
        read_jsonl(path)


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('{"id": "a", "label": 1, "group": "g"}', "exactly one of 'text' or 'messages'"),
        ('{"id": "a", "label": 1, "group": "g", "text": "t", "messages": []}', "exactly one"),
        ('{"id": "a", "label": true, "group": "g", "text": "t"}', "'label' must be a number"),
        ('{"id": "a", "label": 1, "group": "g", "messages": [{"role": "user"}]}', "messages[0]"),
        ("[1, 2]", "expected a JSON object"),
        ('{"id": "a", "label": 1, "group": "g", "text": "t", "spans": [{"start": 0}]}', "spans[0]"),
    ],
)
def test_contract_violations(tmp_path: Path, line: str, needle: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(_lines(1)[0] + "\n" + line + "\n")
    with pytest.raises(ValueprobeError, match=f"{path}:2:") as e:
        read_jsonl(path)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_duplicate_ids_and_unknown_keys(tmp_path: Path) -> None:
    path = tmp_path / "dup.jsonl"
    path.write_text(_lines(1)[0] + "\n" + _lines(1)[0] + "\n")
    with pytest.raises(ValueprobeError, match=f"{path}:2: duplicate id 'x0' \\(first at line 1\\)"):
        read_jsonl(path)
    path.write_text('{"id": "a", "label": 1, "group": "g", "text": "t", "source": "web"}\n')
    assert read_jsonl(path)[0].meta == {"source": "web"}


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueprobeError, match="cannot read dataset"):
        read_jsonl(tmp_path / "nope.jsonl")


def test_linked_groups_join_both_link_conventions():
    from valueprobe.datasets.io import linked_groups

    mk = lambda i, **meta: Example(id=i, label=1, group="g", text="t", meta=meta)  # noqa: E731
    hub = [mk("code-1"), mk("code-1-shuffled", pair="code-1"), mk("code-1-syntax", pair="code-1")]
    mutual = [mk("bt-1-correct", pair="bt-1-backtrack"), mk("bt-1-backtrack", pair="bt-1-correct")]
    shared = [mk("r-1-harmful", pair="r-1"), mk("r-1-benign", pair="r-1"), mk("r-2-benign", pair="r-2")]
    groups = linked_groups(hub + mutual + shared)
    assert {groups[e.id] for e in hub} == {"code-1"}
    assert {groups[e.id] for e in mutual} == {"bt-1-backtrack"}
    assert groups["r-1-harmful"] == groups["r-1-benign"] == "r-1" != groups["r-2-benign"]
