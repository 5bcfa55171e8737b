"""The result records of :func:`valueprobe.tune.shift.shift`: per-group shifts, pair separations, the whole comparison.

>>> res = shift(axis, base, tuned, examples, targeted=["harmful"])
>>> headers, rows = res.table(); res.write("runs/shift-safety")   # shift.json, examples.csv, shift.html
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import plotly.graph_objects as go

from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_dir, jsonable, write_html, write_json
from valueprobe.probe.axis import ProbeRef
from valueprobe.records import Record

__all__ = ["GroupShift", "PairSeparation", "ShiftResult"]

# The name shift.json has always carried; the subpackage move briefly wrote "valueprobe.tune.shift",
# which reads as the same format.
FORMAT = "valueprobe.shift"


@dataclass(frozen=True)
class GroupShift:
    """One group's move along the axis at the headline layer.

    ``shift`` and ``ci`` are in base σ (the axis's spread over its reference set, the unit of every
    score); ``shift_data_sigma`` and ``null_range`` are in data σ (its spread over these examples in the
    base model). The table, the report and the demo's summary state shifts in data σ.
    """

    group: str
    n: int
    targeted: bool
    base_mean: float
    tuned_mean: float
    shift: float  # mean over examples of (tuned − base) score
    ci: tuple[float, float]  # bootstrap 95% CI of ``shift`` over examples
    shift_data_sigma: float  # the same shift in the axis's σ over the data: the unit of the null
    null_range: tuple[float, float]  # central 95% of random directions' shifts (each in its own σ)
    null_percentile: float  # where the axis's shift falls among the random directions, 0–100
    d_before: float | None  # Cohen's d by label inside the group (contrast), base model
    d_after: float | None
    share: float  # the group's share of all examples
    quartiles_before: tuple[float, float, float, float]  # share of each base quartile (low → high) held
    quartiles_after: tuple[float, float, float, float]
    counts: bool  # leaves the random null and (if there are untargeted groups) their range


@dataclass(frozen=True)
class PairSeparation:
    """Cohen's d of group ``a`` against group ``b`` at each layer, base and tuned."""

    a: str
    b: str
    d_base: tuple[float, ...]
    d_tuned: tuple[float, ...]


@dataclass(frozen=True)
class ShiftResult(Record):
    """Everything :func:`shift` measured; ``write`` puts shift.json, examples.csv and shift.html in a folder.

    shift.json is its ``to_dict``: the fields, then ``format`` and ``format_version``."""

    FORMAT = FORMAT
    LEGACY_FORMATS = ("valueprobe.tune.shift",)
    FORMAT_AT = "end"

    base_id: str
    tuned_id: str
    base_fingerprint: str
    tuned_fingerprint: str
    probe: ProbeRef
    layer: int
    layers: tuple[int, ...]
    tokens: str
    n_random: int
    groups: tuple[GroupShift, ...]
    shift_by_layer: dict[str, tuple[float, ...]]  # group -> mean shift in σ at each of ``layers``
    pairs: tuple[PairSeparation, ...]
    untargeted_range: tuple[float, float] | None  # min, max shift of the untargeted groups
    axis_cosine: dict[str, tuple[float, ...]] | None  # refit: cos per layer (see shift(refit=...))
    # per example: id, group, label, base, tuned (scores at ``layer``); examples.csv holds them, and
    # a summary that leaves them out (replicate safety's results.json) reads back with none
    records: tuple[dict, ...] = ()

    def table(self) -> tuple[list[str], list[list[str]]]:
        headers = [
            "group",
            "n",
            "targeted",
            "shift (data σ)",
            "95% CI",
            "random-direction null 95%",
            "axis %ile",
            "d before",
            "d after",
            "Q1 share before→after",
            "counts",
        ]
        f = lambda x: "—" if x is None or not math.isfinite(x) else f"{x:+.3f}"  # noqa: E731
        # One unit in every shift column, as in the report and the demo's summary: data σ, the axis's
        # spread over these examples in the base model (the unit of the random-direction null).
        k = self.data_sigma_per_base_sigma() or math.nan
        rows = [
            [
                g.group,
                str(g.n),
                "yes" if g.targeted else "",
                f(g.shift_data_sigma),
                f"[{f(g.ci[0] * k)}, {f(g.ci[1] * k)}]",
                f"[{f(g.null_range[0])}, {f(g.null_range[1])}]",
                f"{g.null_percentile:.0f}",
                f(g.d_before),
                f(g.d_after),
                f"{g.quartiles_before[0]:.2f}→{g.quartiles_after[0]:.2f}",
                "YES" if g.counts else "no",
            ]
            for g in self.groups
        ]
        return headers, rows

    def data_sigma_per_base_sigma(self) -> float | None:
        """How many data σ make one base σ at the headline layer: each group records its shift in
        both units, so ``shift_data_sigma / shift`` of any group that moved (no extra key in
        shift.json). None when no group moved."""
        for g in self.groups:
            if g.shift and math.isfinite(g.shift) and math.isfinite(g.shift_data_sigma):
                return g.shift_data_sigma / g.shift
        return None

    def write(self, out_dir: str | Path, *, overwrite: bool = False, figure: go.Figure | None = None) -> Path:
        """Write shift.json, examples.csv and, given ``figure``, shift.html (plotly inlined), all or nothing.

        ``figure`` is `valueprobe.report.plots.shift_figure` of this result: figures live in
        ``report/``, above this record. The folder appears under its name only when complete
        (`valueprobe.files.atomic_write_dir`).
        """
        out = Path(out_dir)
        if out.exists() and not overwrite:
            raise ValueprobeError(
                f"output folder {out} already exists: pass --overwrite or choose another --out"
            )

        def fill(tmp: Path) -> None:
            write_json(tmp / "shift.json", jsonable(self.to_dict()), allow_nan=False)
            with open(tmp / "examples.csv", "w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=["id", "group", "label", "base", "tuned"])
                writer.writeheader()
                writer.writerows(self.records)
            if figure is not None:
                write_html(figure, tmp / "shift.html")

        return atomic_write_dir(out, fill)
