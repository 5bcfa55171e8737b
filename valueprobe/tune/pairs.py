"""Preference pairs: the data that ``valueprobe tune`` trains on, and its provenance record.

    >>> from valueprobe.tune.pairs import read_pairs
    >>> pairs = read_pairs("preference_words", groups=["preference_words/dolphin"])  # shipped, or a path
    >>> pairs[0].chosen, len(pairs)   # doctest: +SKIP

A pairs file is JSONL in TRL's form (prompt/chosen/rejected) or valueprobe's dataset rows
(``data/preference_*.jsonl``); :mod:`valueprobe.tune.train` turns the pairs into TRL's dataset.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from valueprobe.datasets.shipped import resolve_dataset_name
from valueprobe.errors import ValueprobeError
from valueprobe.files import sha256_file

__all__ = ["Pair", "data_record", "read_pairs"]


@dataclass(frozen=True)
class Pair:
    """One preference pair: a chat prompt (user turns) and two assistant responses."""

    prompt: tuple[dict[str, str], ...]
    chosen: str
    rejected: str
    group: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def flipped(self) -> Pair:
        """The same pair with chosen and rejected swapped (an avoid-the-target model)."""
        return replace(self, chosen=self.rejected, rejected=self.chosen)


def read_pairs(
    path: str | Path,
    *,
    groups: Sequence[str] | None = None,
    split: str | None = None,
) -> list[Pair]:
    """Read preference pairs from JSONL, in either of two forms per line.

    - TRL's: ``{"prompt": str | [messages], "chosen": str, "rejected": str}``;
    - valueprobe's dataset rows: ``{"messages": [...], "meta": {"chosen": ..., "rejected": ...}}``
      (``data/preference_*.jsonl``; the shipped ones by name: ``read_pairs("preference_words")``).

    Args:
        groups: keep rows whose ``group`` is one of these.
        split: keep rows whose ``meta.split`` equals this (``train``).

    Raises:
        ValueprobeError: ``file:line`` for a line that is not JSON or lacks prompt/chosen/rejected.
    """
    path = resolve_dataset_name(path)
    if not path.is_file():
        raise ValueprobeError(f"pairs file {path} not found: pass a JSONL of prompt/chosen/rejected rows")
    pairs: list[Pair] = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{i}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueprobeError(f"{where}: not JSON ({exc.msg}); one object per line") from None
            if not isinstance(row, dict):
                raise ValueprobeError(f"{where}: expected a JSON object with prompt, chosen, rejected")
            meta: dict[str, Any] = row["meta"] if isinstance(row.get("meta"), dict) else {}
            prompt = row.get("prompt", row.get("messages"))
            if isinstance(prompt, str):
                prompt = [{"role": "user", "content": prompt}]
            missing = [
                k
                for k, v in (
                    ("prompt", prompt),
                    ("chosen", row.get("chosen", meta.get("chosen"))),
                    ("rejected", row.get("rejected", meta.get("rejected"))),
                )
                if not v
            ]
            if missing:
                raise ValueprobeError(
                    f"{where}: missing {', '.join(repr(m) for m in missing)}; each row needs a prompt "
                    "(or messages) and chosen/rejected (top level or in meta)"
                )
            if not isinstance(prompt, list) or not all(
                isinstance(m, dict) and "content" in m for m in prompt
            ):
                raise ValueprobeError(
                    f"{where}: 'prompt' must be a string or a list of {{role, content}} messages"
                )
            chosen, rejected = (
                row.get("chosen", meta.get("chosen")),
                row.get("rejected", meta.get("rejected")),
            )
            if not isinstance(chosen, str) or not isinstance(rejected, str):
                raise ValueprobeError(
                    f"{where}: 'chosen' and 'rejected' must be strings (the assistant's reply)"
                )
            group = str(row.get("group", ""))
            if groups is not None and group not in groups:
                continue
            if split is not None and meta.get("split") != split:
                continue
            msgs = tuple({"role": str(m.get("role", "user")), "content": str(m["content"])} for m in prompt)
            pairs.append(Pair(prompt=msgs, chosen=chosen, rejected=rejected, group=group, meta=meta))
    if not pairs:
        what = f" in groups {list(groups)}" if groups is not None else ""
        what += f" with meta.split == {split!r}" if split is not None else ""
        raise ValueprobeError(f"{path}: no pairs{what}; check --group/--split against the file's rows")
    return pairs


def data_record(path: str | Path, **selection: Any) -> dict[str, Any]:
    """Provenance of a pairs file (a path, or a shipped dataset's name) and the rows taken from it."""
    return {
        "path": str(path),
        "sha256": sha256_file(resolve_dataset_name(path)),
        **{k: v for k, v in selection.items() if v is not None},
    }
