"""Does attribution patching agree with exact patching? Spearman ρ and top-k overlap on the same pairs.

    >>> from valueprobe.attribute.agreement import agreement
    >>> agree = agreement(exact, approx, k=10)      # two Attribution records of the same pairs
    >>> agree.spearman_components, agree.top_k_overlap, agree.missed

`valueprobe replicate attribute` compares exact patching of the first pairs with attribution
patching of the same pairs (its run summarized on those pairs only) and records the result beside
both; the report says where they disagree.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import spearmanr

from valueprobe.attribute.records import Agreement, Attribution, PatchTerm
from valueprobe.errors import ValueprobeError

__all__ = ["agreement"]


def _rho(a: np.ndarray, b: np.ndarray) -> float:
    keep = np.isfinite(a) & np.isfinite(b)
    if keep.sum() < 3:
        return float("nan")
    return float(spearmanr(a[keep], b[keep]).statistic)


def _cells(res: Attribution, layers: list[int]) -> np.ndarray:
    """The mean denoising effect of the residual cells of ``layers``, in each view, flattened."""
    assert res.grid is not None
    rows = [res.grid.layers.index(layer) for layer in layers]
    return np.concatenate([np.asarray(v.denoise, np.float64)[rows].ravel() for v in res.grid.views])


def agreement(exact: Attribution, approx: Attribution, *, k: int = 10) -> Agreement:
    """Compare the denoising read effects of ``approx`` (attribution patching) with ``exact``'s."""
    if exact.method != "patch" or approx.method != "attrib-patch" or exact.n_units != approx.n_units:
        raise ValueprobeError(
            f"agreement compares exact patching with attribution patching of the same pairs, not"
            f" {exact.method} ({exact.n_units} pairs) with {approx.method} ({approx.n_units})"
        )
    ex = {p.name: p for p in exact.patches if isinstance(p, PatchTerm)}
    ap = {p.name: p for p in approx.patches if isinstance(p, PatchTerm)}
    names = [n for n in ex if n in ap]
    a = np.array([ex[n].denoise for n in names])
    b = np.array([ap[n].denoise for n in names])
    cells = float("nan")
    if exact.grid is not None and approx.grid is not None:
        common = sorted(set(exact.grid.layers) & set(approx.grid.layers))
        cells = _rho(_cells(exact, common), _cells(approx, common)) if common else float("nan")
    top_exact = [n for n in exact.top(k) if n in ap]
    top_approx = set(approx.top(k))
    missed = tuple(n for n in top_exact if n not in top_approx)
    flips = tuple(n for n in top_exact if np.sign(ex[n].denoise) != np.sign(ap[n].denoise))
    overlap = (len(top_exact) - len(missed)) / max(len(top_exact), 1)
    return Agreement(exact.n_units, _rho(a, b), cells, k, overlap, missed, flips)
