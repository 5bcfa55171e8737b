"""``ScoreResult``: what ``valueprobe score`` found, per example and per group, and how it is written.

>>> res = score_dataset(axis, lm, examples)
>>> res.write("runs/score-code")  # scores.csv + summary.json
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_text, jsonable, record_from_dict, write_json
from valueprobe.probe.axis import ProbeRef
from valueprobe.vocab import Tokens


@dataclass(frozen=True)
class ScoreResult:
    """Per-example readouts and per-group metrics of one axis on one dataset.

    ``records``: one dict per example (id, group, label, val, score, n_readout_tokens, n_tokens).
    ``summary``: one dict per group plus ``"all"``: n, n_pos, and for ``val`` and ``score`` the
    AUROC and Cohen's d with bootstrap 95% CIs (None where the group has one class), and
    ``length_auroc``, the control: the AUROC of sequence length alone, best of either sign.
    """

    records: tuple[dict, ...]
    summary: tuple[dict, ...]
    probe: ProbeRef
    layer: int
    tokens: Tokens

    def table(self) -> tuple[list[str], list[list[str]]]:
        """(headers, rows) for the printed summary."""
        headers = [
            "group",
            "n",
            "AUROC val [95% CI]",
            "d val [95% CI]",
            "AUROC score [95% CI]",
            "length AUROC",
        ]

        def ci(row: dict, key: str) -> str:
            x = row.get(key)
            if x is None:
                return "n/a"
            lo, hi = row.get(f"{key}_ci") or (None, None)
            return f"{x:.3f} [{lo:.3f}, {hi:.3f}]" if lo is not None else f"{x:.3f}"

        rows = []
        for r in self.summary:
            length = r.get("length_auroc")
            rows.append(
                [
                    r["group"] + (" (vs pairs)" if "paired" in r.get("contrast", "") else ""),
                    f"{r['n']} ({r['n_pos']}+)",
                    ci(r, "val_auroc"),
                    ci(r, "val_cohens_d"),
                    ci(r, "score_auroc"),
                    "n/a" if length is None else f"{length:.3f}",
                ]
            )
        if any("null_auroc_range" in r for r in self.summary):
            headers.append("random AUROC 95% (axis %ile)")
            for row, r in zip(rows, self.summary, strict=True):
                lo, hi = r.get("null_auroc_range") or (None, None)
                pct = r.get("score_auroc_null_percentile")
                row.append("n/a" if lo is None else f"[{lo:.3f}, {hi:.3f}] ({pct:.0f})")
        return headers, rows

    def to_dict(self) -> dict:
        return {
            "probe": jsonable(self.probe.to_dict()),
            "layer": self.layer,
            "tokens": str(self.tokens),
            "summary": jsonable(list(self.summary)),
            "n_examples": len(self.records),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, records: Sequence[Mapping[str, Any]]) -> ScoreResult:
        """The result again from ``summary.json`` and the rows of ``scores.csv`` (``records``).

        Raises:
            ValueprobeError: ``records`` is not the ``n_examples`` rows the summary counts.
        """
        if len(records) != d["n_examples"]:
            raise ValueprobeError(
                f"the summary counts {d['n_examples']} examples but {len(records)} rows were given"
            )
        return record_from_dict(cls, {**d, "records": [dict(r) for r in records]})

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        """Write ``scores.csv`` (one row per example) and ``summary.json``, each atomically."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"scores": out / "scores.csv", "summary": out / "summary.json"}
        write_scores_csv(paths["scores"], self.records)
        write_json(paths["summary"], self.to_dict(), allow_nan=False)
        return paths


# scores.csv's columns and how each reads back (an empty cell is NaN: no σ, or no row to read)
_COLUMNS: dict[str, type] = {
    "id": str,
    "group": str,
    "label": float,
    "val": float,
    "score": float,
    "n_readout_tokens": int,
    "n_tokens": int,
}


def write_scores_csv(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    """One row per example; floats as Python writes them (the shortest text that reads back exact)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(_COLUMNS), lineterminator="\n")
    writer.writeheader()
    for rec in records:
        writer.writerow(
            {k: ("" if isinstance(v, float) and not math.isfinite(v) else v) for k, v in rec.items()}
        )
    atomic_write_text(path, buf.getvalue())


def read_scores_csv(path: Path) -> list[dict]:
    """The records :func:`write_scores_csv` wrote, with their types (bit-exact floats)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        return [
            {
                k: (float("nan") if cast is float and row[k] == "" else cast(row[k]))
                for k, cast in _COLUMNS.items()
            }
            for row in rows
        ]
    except (OSError, KeyError, ValueError) as exc:
        raise ValueprobeError(
            f"{path}: not a readable scores.csv ({exc}); run `valueprobe score` again"
        ) from None
