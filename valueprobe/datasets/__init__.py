"""Contrast datasets for the value axis, generated offline and deterministically from a seed.

    valueprobe datasets build --family all --out data --seed 0

>>> from valueprobe.datasets import build, read_jsonl
>>> files = build("confidence", "/tmp/vp-data", seed=0)
>>> read_jsonl(files["confidence"])[0].messages[-1]["content"]
'Yes'

Families (see data/README.md): icrl (+ icrl_control), code, backtracking, confidence,
refusal (+ sensitive), preference (words, words eval, safety), steering (prompt sets), tasks
(checkable: arithmetic and code; read and checked by `valueprobe.datasets.answers`).
"""

from __future__ import annotations

from valueprobe.datasets.build import FAMILIES, build, generate, summary
from valueprobe.datasets.io import (
    Example,
    Span,
    example_from_dict,
    example_to_dict,
    read_jsonl,
    write_jsonl,
)

__all__ = [
    "FAMILIES",
    "Example",
    "Span",
    "build",
    "example_from_dict",
    "example_to_dict",
    "generate",
    "read_jsonl",
    "summary",
    "write_jsonl",
]
