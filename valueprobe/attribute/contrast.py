"""The two classes an attribution compares, and the units (pairs, examples) its intervals resample.

    >>> from valueprobe.attribute.contrast import Classes
    >>> cls = Classes.of(labels, units)            # units: meta.pair, else the example id, per row
    >>> cls.gap(values)                            # [k]: class 1 minus class 0, within units when paired
    >>> lo, hi = cls.gap_ci(values, n_boot=1000)

Rows come from the token selection (one per example, per span, or per token). A unit is what the
bootstrap resamples: a pair of examples (``meta.pair``), else one example. When every unit holds
rows of both classes (the two rows of a pair; the ``pre`` and ``post`` spans of one example) the
comparison is paired: the gap is the mean over units of each unit's class-1 mean minus its class-0
mean, and the AUROC is taken on rows centred within their unit, so what every unit shares (its
text, its length) cancels. Otherwise classes are compared as two groups of units.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from valueprobe.errors import ValueprobeError
from valueprobe.stats.metrics import auroc
from valueprobe.stats.null import diff_cis, mean_cis

__all__ = ["Classes"]


@dataclass(frozen=True)
class Classes:
    """Per row: its class ``y`` and its ``unit`` index; ``paired`` when every unit has both classes."""

    y: np.ndarray  # bool [rows]
    unit: np.ndarray  # int64 [rows]
    paired: bool

    @classmethod
    def of(cls, labels: Sequence[float] | np.ndarray, units: Sequence[str]) -> Classes:
        y = np.asarray(labels, dtype=np.float64) >= 0.5
        if y.all() or not y.any():
            raise ValueprobeError(
                f"the contrast needs rows of both classes, but all {y.size} are class {int(y[0])}:"
                " give data with labels 1 and 0 (or spans pre and post with --target span)"
            )
        _, unit = np.unique(np.asarray(units, dtype=object).astype(str), return_inverse=True)
        both = np.zeros((unit.max() + 1, 2), dtype=bool)
        both[unit, y.astype(int)] = True
        return cls(y, unit.astype(np.int64), bool(both.all()))

    @property
    def n_units(self) -> int:
        return int(self.unit.max()) + 1

    def _unit_means(self, x: np.ndarray, cls: bool) -> np.ndarray:
        """[units, k] mean of each unit's rows of class ``cls`` (NaN for a unit without any)."""
        x = np.asarray(x, dtype=np.float64).reshape(len(self.y), -1)
        keep = self.y == cls
        sums = np.zeros((self.n_units, x.shape[1]))
        np.add.at(sums, self.unit[keep], x[keep])
        counts = np.bincount(self.unit[keep], minlength=self.n_units)[:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            return sums / counts

    def class_means(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean of class 1 and of class 0 per column, each over its units' means."""
        return np.nanmean(self._unit_means(x, True), axis=0), np.nanmean(self._unit_means(x, False), axis=0)

    def unit_gaps(self, x: np.ndarray) -> np.ndarray:
        """[units, k]: each unit's class-1 mean minus its class-0 mean (paired contrasts only)."""
        return self._unit_means(x, True) - self._unit_means(x, False)

    def gap(self, x: np.ndarray) -> np.ndarray:
        """Class 1 minus class 0 per column: the mean unit gap when paired, else the class means'."""
        if self.paired:
            return self.unit_gaps(x).mean(axis=0)
        pos, neg = self.class_means(x)
        return pos - neg

    def gap_ci(self, x: np.ndarray, *, n_boot: int = 1000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """95% bootstrap CI of `gap` per column, resampling units."""
        if self.paired:
            return mean_cis(self.unit_gaps(x), n_boot=n_boot, seed=seed)
        pos, neg = self._unit_means(x, True), self._unit_means(x, False)
        return diff_cis(pos[~np.isnan(pos[:, 0])], neg[~np.isnan(neg[:, 0])], n_boot=n_boot, seed=seed)

    def centred(self, s: np.ndarray) -> np.ndarray:
        """Scores [rows] minus their unit's mean when paired (what `auroc` ranks), else as they are."""
        s = np.asarray(s, dtype=np.float64)
        if not self.paired:
            return s
        means = np.bincount(self.unit, weights=s) / np.bincount(self.unit)
        return s - means[self.unit]

    def auroc(self, s: np.ndarray) -> float:
        """AUROC of scores [rows] for class 1, within units when paired."""
        return auroc(self.centred(s), self.y)

    def within_unit_r(self, x: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Pearson r per column between ``x`` [rows, k] and ``t`` [rows] (a token position) after
        removing each unit's means: how closely a term tracks position inside one text. NaN where
        no unit has two positions."""
        x = np.asarray(x, dtype=np.float64).reshape(len(self.y), -1)
        t = np.asarray(t, dtype=np.float64)
        counts = np.bincount(self.unit)
        tc = t - (np.bincount(self.unit, weights=t) / counts)[self.unit]
        sums = np.zeros((self.n_units, x.shape[1]))
        np.add.at(sums, self.unit, x)
        xc = x - (sums / counts[:, None])[self.unit]
        denom = np.sqrt((xc**2).sum(0) * (tc**2).sum())
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(denom > 0, (xc * tc[:, None]).sum(0) / np.where(denom > 0, denom, 1.0), np.nan)
