"""Fitters for the value axis: streaming statistics in, an immutable :class:`Direction` out.

A fitter collects statistics over batches (``update(x, y) -> self``, so it streams over
store shards) and returns a :class:`Direction`; :func:`valueprobe.probe.layer_sweep.fit_store` runs one
fitter per layer and packs the results into a :class:`valueprobe.probe.axis.ValueAxis`::

    from valueprobe.probe.fitters import DiffMeans, make_fitter
    d = DiffMeans().update(x_a, y_a).update(x_b, y_b).fit()     # x: [n, d_model], y: [n]
    d.unit @ h + d.intercept > 0                                # predicts success
    make_fitter("lda").update(x, y).fit()

Sign convention everywhere: positive = success / value up (label 1, span ``post``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, Protocol, Self

import numpy as np

from valueprobe.errors import ValueprobeError
from valueprobe.vocab import choice


class Method(StrEnum):
    """The fitters by name (``valueprobe fit --method``); see each class for its definition."""

    diff_means = "diff_means"
    span_diff = "span_diff"
    lda = "lda"
    logistic = "logistic"
    paired_pca = "paired_pca"


PairBy = Literal["auto", "example_id", "group"]


@dataclass(frozen=True, eq=False)
class Direction:
    """One fitted direction in the residual stream of one layer.

    ``unit`` [d_model] has norm 1 and points to success; ``raw`` is the method's unnormalized
    vector (Δμ, Σ⁻¹Δμ, logistic ``coef_``, ...); ``intercept`` is the decision threshold on the
    unit projection: predict success where ``x @ unit + intercept > 0``.
    """

    unit: np.ndarray
    raw: np.ndarray
    intercept: float
    n_pos: int
    n_neg: int


class DegenerateFit(ValueprobeError):
    """The two classes have identical statistics, so there is no direction to fit."""


def unit_or_zero(fitter: Fitter, d_model: int) -> np.ndarray:
    """The fitted unit direction, or zeros when the classes are indistinguishable.

    For controls: the embedding output of a last-token contrast whose last token is the same
    text in both classes carries no information, and should score AUROC 0.5 rather than fail.
    """
    try:
        return fitter.fit().unit
    except DegenerateFit:
        return np.zeros(d_model)


class Fitter(Protocol):
    @property
    def pair_by(self) -> PairBy | None: ...  # None: the fitter needs no pairing keys

    def update(self, x: np.ndarray, y: np.ndarray, *, keys: Sequence[str] | None = None) -> Fitter: ...
    def fit(self) -> Direction: ...


def _as_batch(x: np.ndarray, y: np.ndarray, d_model: int | None) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if x.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueprobeError(f"fit: expected x [n, d_model] and y [n], got x {x.shape} and y {y.shape}")
    if d_model is not None and x.shape[1] != d_model:
        raise ValueprobeError(f"fit: batch has d_model {x.shape[1]} but earlier batches had {d_model}")
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
        raise ValueprobeError(
            f"fit: NaN or inf in activation rows {np.flatnonzero(bad)[:10].tolist()} of this batch"
        )
    return x, y >= 0.5  # graded labels: success means >= 0.5


class _ClassMeans:
    """Per-class running sums. Rows are shifted by the first batch's mean before summing,
    because residual streams carry large constant components (massive activations) that
    would otherwise cancel catastrophically in the scatter matrices."""

    pair_by: PairBy | None = None

    def __init__(self) -> None:
        self.shift: np.ndarray | None = None  # [d_model]
        self.sums: np.ndarray | None = None  # [2, d_model], row 0 failure, row 1 success
        self.counts = np.zeros(2, dtype=np.int64)

    def _accumulate(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x, yb = _as_batch(x, y, None if self.shift is None else self.shift.size)
        if self.shift is None or self.sums is None:
            self.shift = x.mean(axis=0) if len(x) else np.zeros(x.shape[1])
            self.sums = np.zeros((2, x.shape[1]))
        xc = x - self.shift
        sums = self.sums
        for cls in (0, 1):
            m = yb == bool(cls)
            sums[cls] += xc[m].sum(axis=0)
            self.counts[cls] += int(m.sum())
        return xc, yb

    def _means(self) -> np.ndarray:  # [2, d_model], in shifted coordinates
        if self.sums is None or (self.counts == 0).any():
            raise ValueprobeError(
                f"fit needs both classes, got {self.counts[1]} success and {self.counts[0]} failure rows;"
                " check the labels (span 'pre'/'post' or label 0/1)"
            )
        return self.sums / self.counts[:, None]

    def _direction(self, raw: np.ndarray) -> Direction:
        norm = float(np.linalg.norm(raw))
        if not math.isfinite(norm) or norm == 0.0:
            raise DegenerateFit(
                "fit: the fitted direction is zero; the two classes have identical statistics"
            )
        unit = raw / norm
        means = self._means()
        midpoint = (means[0] + means[1]) / 2 + self.shift
        return Direction(unit, raw, float(-midpoint @ unit), int(self.counts[1]), int(self.counts[0]))


class DiffMeans(_ClassMeans):
    """Difference of class means, mean(success) − mean(failure): the paper's method."""

    def update(self, x: np.ndarray, y: np.ndarray, *, keys: Sequence[str] | None = None) -> DiffMeans:
        self._accumulate(x, y)
        return self

    def fit(self) -> Direction:
        means = self._means()
        return self._direction(means[1] - means[0])


class MassMeanLDA(_ClassMeans):
    """Mass-mean probe with a covariance correction (LDA): Σ⁻¹ (μ₊ − μ₋).

    Σ is the pooled within-class covariance, shrunk toward a scaled identity:
    Σ = (1 − λ) Σ_w + λ · tr(Σ_w)/d · I, fixed λ = ``shrinkage`` (default 0.1). A fixed λ
    (not Ledoit-Wolf) keeps the fit a function of streamed second moments only. Memory:
    two d_model × d_model float64 matrices (128 MiB each at d_model 4096).
    """

    def __init__(self, *, shrinkage: float = 0.1) -> None:
        super().__init__()
        if not 0.0 <= shrinkage <= 1.0:
            raise ValueprobeError(f"MassMeanLDA: shrinkage must be in [0, 1], got {shrinkage}")
        self.shrinkage = shrinkage
        self.scatter: np.ndarray | None = None  # [2, d_model, d_model] Σ xc xcᵀ per class

    def update(self, x: np.ndarray, y: np.ndarray, *, keys: Sequence[str] | None = None) -> MassMeanLDA:
        xc, yb = self._accumulate(x, y)
        if self.scatter is None:
            self.scatter = np.zeros((2, xc.shape[1], xc.shape[1]))
        scatter = self.scatter
        for cls in (0, 1):
            xm = xc[yb == bool(cls)]
            scatter[cls] += xm.T @ xm
        return self

    def fit(self) -> Direction:
        means = self._means()
        n = int(self.counts.sum())
        assert self.scatter is not None  # _means() raised if nothing was seen
        within = self.scatter[0] - self.counts[0] * np.outer(means[0], means[0])
        within = (within + self.scatter[1] - self.counts[1] * np.outer(means[1], means[1])) / max(n - 2, 1)
        d = within.shape[0]
        cov = (1 - self.shrinkage) * within + self.shrinkage * np.trace(within) / d * np.eye(d)
        try:
            raw = np.linalg.solve(cov, means[1] - means[0])
        except np.linalg.LinAlgError:
            raise ValueprobeError(
                f"MassMeanLDA: covariance is singular ({n} rows, d_model {d}); use shrinkage > 0"
            ) from None
        return self._direction(raw)


class Logistic(_ClassMeans):
    """L2 logistic regression (scikit-learn ``LogisticRegression``, lbfgs) at the edge.

    Not a sufficient-statistics method: it keeps every row it is given in memory (float64),
    so fit it on the rows of one layer at a time. With ``standardize`` the features are
    z-scored first (residual streams have a few huge dimensions) and ``coef_`` is mapped
    back to raw activation space, so the direction applies to raw activations either way.
    """

    def __init__(self, *, C: float = 1.0, max_iter: int = 1000, standardize: bool = True) -> None:
        super().__init__()
        self.C, self.max_iter, self.standardize = C, max_iter, standardize
        self._x: list[np.ndarray] = []
        self._y: list[np.ndarray] = []

    def update(self, x: np.ndarray, y: np.ndarray, *, keys: Sequence[str] | None = None) -> Logistic:
        _, yb = self._accumulate(x, y)
        self._x.append(np.asarray(x, dtype=np.float64))
        self._y.append(yb.astype(np.int64))
        return self

    def fit(self) -> Direction:
        from sklearn.linear_model import LogisticRegression  # slow to import; only this fitter needs it

        self._means()  # both classes present
        x, y = np.concatenate(self._x), np.concatenate(self._y)
        mean, std = np.zeros(x.shape[1]), np.ones(x.shape[1])
        if self.standardize:
            mean, std = x.mean(axis=0), x.std(axis=0)
            std[std == 0] = 1.0
        clf = LogisticRegression(C=self.C, max_iter=self.max_iter).fit((x - mean) / std, y)
        w = clf.coef_[0] / std
        b = float(clf.intercept_[0] - (clf.coef_[0] * mean / std).sum())
        norm = float(np.linalg.norm(w))
        if norm == 0.0:
            raise ValueprobeError("Logistic: all coefficients are zero; raise C (weaker regularization)")
        return Direction(w / norm, w, b / norm, int(self.counts[1]), int(self.counts[0]))


class _KeyedMeans(_ClassMeans):
    """Class means per pairing key (a conversation or a group), for paired methods.

    Memory: 2 × d_model float64 per key."""

    def __init__(self, *, pair_by: PairBy = "auto") -> None:
        super().__init__()
        self.pair_by = pair_by
        self.key_sums: dict[str, np.ndarray] = {}  # key -> [2, d_model]
        self.key_counts: dict[str, np.ndarray] = {}  # key -> [2]

    def update(self, x: np.ndarray, y: np.ndarray, *, keys: Sequence[str] | None = None) -> Self:
        if keys is None or len(keys) != len(x):
            raise ValueprobeError(f"{type(self).__name__}.update needs one pairing key per row (keys=...)")
        xc, yb = self._accumulate(x, y)
        uniq, inv = np.unique(np.asarray(keys, dtype=str), return_inverse=True)
        for cls in (0, 1):
            m = yb == bool(cls)
            sums = np.zeros((uniq.size, xc.shape[1]))
            np.add.at(sums, inv[m], xc[m])
            counts = np.bincount(inv[m], minlength=uniq.size)
            for j in np.flatnonzero(counts):
                key = str(uniq[j])
                if key not in self.key_sums:
                    self.key_sums[key] = np.zeros((2, xc.shape[1]))
                    self.key_counts[key] = np.zeros(2, dtype=np.int64)
                self.key_sums[key][cls] += sums[j]
                self.key_counts[key][cls] += counts[j]
        return self

    def _pair_diffs(self) -> np.ndarray:  # [n_pairs, d_model]: mean(success) − mean(failure) per key
        self._means()
        diffs = [
            s[1] / c[1] - s[0] / c[0] for k, s in self.key_sums.items() if (c := self.key_counts[k]).all()
        ]
        if not diffs:
            raise ValueprobeError(
                f"{type(self).__name__}: no pairing key ({self.pair_by}) holds both classes;"
                " pair by a key that has both (pre/post spans of one conversation, or groups with both labels)"
            )
        return np.stack(diffs)


class SpanDiff(_KeyedMeans):
    """The paper's ICRL construction: per conversation, mean(``post`` rows) − mean(``pre`` rows),
    then averaged over conversations (pair_by="example_id"); pair_by="group" averages per group."""

    def fit(self) -> Direction:
        return self._direction(self._pair_diffs().mean(axis=0))


class PairedPCA(_KeyedMeans):
    """RepE: first principal component of the paired differences, sign-aligned to success.

    Uncentered: centering the differences would remove their mean, which is the signal
    (RepE gets the same effect by randomly flipping the order of each pair)."""

    def fit(self) -> Direction:
        diffs = self._pair_diffs()
        v = np.linalg.svd(diffs, full_matrices=False)[2][0]
        proj = diffs @ v
        if proj.mean() < 0:
            v, proj = -v, -proj
        return self._direction(v * proj.mean())


METHODS: dict[Method, Callable[[], Fitter]] = {
    Method.diff_means: DiffMeans,
    Method.span_diff: SpanDiff,
    Method.lda: MassMeanLDA,
    Method.logistic: Logistic,
    Method.paired_pca: PairedPCA,
}
# A method name, or a zero-argument factory such as ``lambda: Logistic(C=0.1)``.
MethodArg = Method | Callable[[], Fitter]


def make_fitter(method: MethodArg) -> Fitter:
    """A fresh fitter from a method name or a zero-argument factory, e.g. ``lambda: Logistic(C=0.1)``."""
    if callable(method):
        return method()
    return METHODS[choice(Method, method, what="probe method")]()


def method_name(method: MethodArg) -> str:
    """The name recorded for a method: its own, or the factory's ``__name__``."""
    return str(method) if isinstance(method, str) else getattr(method, "__name__", "custom")
