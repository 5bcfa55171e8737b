"""The committed datasets, shipped inside the package and read by name from any folder.

    valueprobe score --probe smollm2-135m-value --data code --out runs/score-code
    valueprobe steer --probe smollm2-135m-value --prompts steer_confidence --out runs/steer

    >>> from valueprobe.datasets.shipped import dataset_path, shipped_datasets
    >>> dataset_path("code").name
    'code.jsonl'

``data/`` beside this module is a byte-for-byte copy of the repository's ``data/`` (its JSONL files
and ``MANIFEST.json``, whose ``files`` are the index of names), so every installed copy reads the
exact bytes the shipped axes and results were computed from (``code.jsonl`` is mined from the
build's standard library and is rebuilt identically only on that Python; see ``data/README.md``).
``tests/test_registry.py`` fails when the copy drifts. ``valueprobe datasets build`` still writes
them anywhere. A name is a file's stem (``code``, ``steer_confidence``); a path still works, and a
name that is also a file or folder in the current directory is refused in one line.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from valueprobe.errors import ValueprobeError
from valueprobe.files import resolve_shipped

__all__ = ["DATA_DIR", "dataset_path", "resolve_dataset_name", "shipped_datasets"]

DATA_DIR = Path(__file__).resolve().parent / "data"


@functools.cache
def shipped_datasets() -> dict[str, Path]:
    """Every shipped dataset by name (the file's stem) → its installed path, sorted by name."""
    files = json.loads((DATA_DIR / "MANIFEST.json").read_text(encoding="utf-8"))["files"]
    return {Path(name).stem: DATA_DIR / name for name in sorted(files)}


def resolve_dataset_name(spec: str | os.PathLike[str]) -> Path:
    """``spec`` as a path: a shipped dataset's file when it is a name, else ``spec`` itself (unchecked)."""
    return resolve_shipped(spec, shipped_datasets(), what="dataset")


def dataset_path(spec: str | os.PathLike[str]) -> Path:
    """The JSONL file ``spec`` names: a shipped dataset by name, or a path (a ``Path`` is always a path).

    Raises:
        ValueprobeError: ``spec`` is neither a shipped name nor an existing file (the line lists
            the names), or it is a name and also a file or folder here (the line names both).
    """
    path = resolve_dataset_name(spec)
    if not path.exists():
        raise ValueprobeError(
            f"{spec} does not exist and is not a shipped dataset ({', '.join(shipped_datasets())}):"
            " give a dataset JSONL path or one of those names"
        )
    return path
