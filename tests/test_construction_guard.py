"""The construction guard: every span of every shipped construction dataset lies inside an assistant
message and covers its labelled token, in the text and in the rendered tokens."""

from __future__ import annotations

import copy
import random
from dataclasses import replace

import pytest
from tokenizers import processors

from valueprobe.audit.guard import span_problems
from valueprobe.datasets import icrl
from valueprobe.datasets.io import Example, Span, read_jsonl
from valueprobe.datasets.shipped import shipped_datasets

CONSTRUCTIONS = sorted(
    name
    for name, path in shipped_datasets().items()
    if path.suffix == ".jsonl" and any(ex.spans for ex in read_jsonl(path))
)


def test_the_constructions_are_found():
    # the datasets whose spans a probe is fitted on or read at
    assert {"icrl", "icrl_control", "icrl_pairs", "backtracking", "confidence"} <= set(CONSTRUCTIONS)


@pytest.mark.parametrize("name", CONSTRUCTIONS)
def test_every_span_lies_in_an_assistant_message(name):
    problems = [p for ex in read_jsonl(name) for p in span_problems(ex)]
    assert problems == []


@pytest.fixture(scope="module")
def untrimmed(tiny_tokenizer):
    """The tiny BPE tokenizer with offsets that keep a word's leading space, as SmolLM2's do."""
    tok = copy.deepcopy(tiny_tokenizer)
    tok._tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    assert tok("The capital", return_offsets_mapping=True)["offset_mapping"][1] == (3, 11)
    return tok


@pytest.mark.parametrize("name", CONSTRUCTIONS)
def test_every_span_covers_its_token_under_a_bpe_tokenizer(name, untrimmed):
    problems = [p for ex in read_jsonl(name)[:60] for p in span_problems(ex, tokenizer=untrimmed)]
    assert problems == []


@pytest.mark.slow
@pytest.mark.parametrize("name", CONSTRUCTIONS)
def test_every_span_covers_its_token_under_the_default_model(name, default_lm):
    problems = [p for ex in read_jsonl(name) for p in span_problems(ex, tokenizer=default_lm.tokenizer)]
    assert problems == []


def _icrl_example():
    main, _ = icrl.conversation(7, random.Random(0))
    return main


def test_the_guard_sees_a_span_on_the_users_turn():
    ex = _icrl_example()
    moved = replace(ex, spans=(Span(0, 5, "pre", message=0), *ex.spans[1:]))
    (problem,) = span_problems(moved)
    assert "message 0, the user's turn" in problem


def test_the_guard_sees_a_span_off_any_message():
    ex = _icrl_example()
    loose = replace(ex, spans=(replace(ex.spans[0], message=None), ex.spans[1]))
    assert any("names no message" in p for p in span_problems(loose))


def test_the_guard_sees_a_post_span_that_leaves_its_token_in_pre(untrimmed):
    def answer(post_start: int) -> Example:
        text = "The capital of France is Paris."
        return Example(
            id="x", label=1, group="g", meta={"token": "capital"},
            messages=({"role": "user", "content": "Say it."}, {"role": "assistant", "content": text}),
            spans=(Span(0, post_start, "pre", message=1), Span(post_start, len(text), "post", message=1)),
        )  # fmt: skip

    at_letter, at_space = answer(4), answer(3)
    assert span_problems(at_letter) == span_problems(at_space) == []  # the text starts at the token...
    (problem,) = span_problems(at_letter, tokenizer=untrimmed)  # ...but " capital" begins in pre
    assert "' capital', which the span before it holds" in problem
    assert span_problems(at_space, tokenizer=untrimmed) == []
