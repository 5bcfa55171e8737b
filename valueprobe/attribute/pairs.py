"""Matched pairs for patching: two rows of one ``meta.pair``, equal in token length, positions aligned.

    >>> from valueprobe.attribute.pairs import read_patch_pairs
    >>> pairs = read_patch_pairs(lm, vp.read_jsonl("data/icrl_pairs.jsonl"), positions="spans", span_labels=["post"])
    >>> pairs[0].clean.example.id, pairs[0].first_diff          # ('pair-0000-rewarded', 203)

A pair's ``clean`` row is its label-1 row (the rewarded history), ``corrupt`` its label-0 row.
Patching moves a component's output at a position from one row into the other, so both must have
the same number of tokens and read the same token rows; a pair that does not is refused in one line
naming it and the first position where the token ids differ. Every position before ``first_diff``
holds the same tokens in both rows, so (the model being causal) the same activations: patching
there changes nothing, and exact patching runs that shared prefix once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from valueprobe.activations.encode import Encoded, encode
from valueprobe.datasets.io import Example
from valueprobe.errors import ValueprobeError
from valueprobe.model.load import LoadedModel
from valueprobe.vocab import ChatTemplate, Positions

__all__ = ["PatchPair", "pair_units", "read_patch_pairs"]


@dataclass(frozen=True)
class PatchPair:
    """One matched pair, tokenized: ``first_diff`` is the first position where the ids differ."""

    name: str
    clean: Encoded
    corrupt: Encoded
    first_diff: int

    @property
    def n_tokens(self) -> int:
        return len(self.clean.input_ids)


def pair_units(examples: Sequence[Example]) -> list[tuple[str, Example, Example]]:
    """(pair name, label-1 row, label-0 row) per ``meta.pair``, in the order pairs first appear.

    Raises:
        ValueprobeError: a row without ``meta.pair``, or a pair that is not one row of each label.
    """
    groups: dict[str, list[Example]] = {}
    for ex in examples:
        name = ex.meta.get("pair")
        if not isinstance(name, str) or not name:
            raise ValueprobeError(
                f"example {ex.id!r} has no meta.pair: patching needs matched pairs (two rows sharing"
                " meta.pair, labels 1 and 0), as data/icrl_pairs.jsonl has"
            )
        groups.setdefault(name, []).append(ex)
    out = []
    for name, rows in groups.items():
        labels = sorted(float(r.label) >= 0.5 for r in rows)
        if labels != [False, True]:
            raise ValueprobeError(
                f"pair {name!r} has {len(rows)} rows ({', '.join(r.id for r in rows)}): a pair is one row"
                " of label 1 (clean) and one of label 0 (corrupt)"
            )
        clean, corrupt = sorted(rows, key=lambda r: -float(r.label))
        out.append((name, clean, corrupt))
    return out


def _first_diff(a: Sequence[int], b: Sequence[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def check_pair(name: str, clean: Encoded, corrupt: Encoded) -> int:
    """The first differing position of a tokenized pair, after checking the pair can be patched."""
    a, b = clean.input_ids, corrupt.input_ids
    first = _first_diff(a, b)
    if len(a) != len(b):
        where = min(len(a), len(b)) if first is None else first
        raise ValueprobeError(
            f"pair {name!r}: its rows are {len(a)} and {len(b)} tokens long (token ids first differ at"
            f" position {where}); patching needs rows of equal length whose positions align"
        )
    if first is None:
        raise ValueprobeError(f"pair {name!r}: its two rows are the same tokens; there is nothing to patch")
    if clean.selections != corrupt.selections:
        raise ValueprobeError(
            f"pair {name!r}: its rows read different token positions; give both rows the same spans"
        )
    return first


def read_patch_pairs(
    lm: LoadedModel,
    examples: Sequence[Example],
    *,
    positions: Positions,
    span_labels: Sequence[str] | None = None,
    max_length: int | None = None,
    chat_template: ChatTemplate = ChatTemplate.model,
) -> list[PatchPair]:
    """The pairs of ``examples``, tokenized and checked (see the module doc)."""
    units = pair_units(examples)
    out = []
    for name, clean_ex, corrupt_ex in units:
        clean, corrupt = encode(
            lm,
            [clean_ex, corrupt_ex],
            positions=positions,
            span_labels=span_labels,
            max_length=max_length,
            chat_template=chat_template,
        )
        out.append(PatchPair(name, clean, corrupt, check_pair(name, clean, corrupt)))
    return out
