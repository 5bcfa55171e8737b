"""Controls: what a probe must beat before its AUROC means anything.

Shared by the layer sweep (:mod:`valueprobe.probe.layer_sweep`) and the transfer matrix (:mod:`valueprobe.probe.transfer`)::

    from valueprobe.probe.baselines import shuffle_within_group, oriented_auroc
    y_null = shuffle_within_group(src.y, src.group, src.keep, rng)   # the permutation null
    oriented_auroc(src.position.n_tokens, src.y, train_rows, test_rows)  # a 1-D position probe
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from valueprobe.stats.metrics import auroc

__all__ = ["PositionScores", "oriented_auroc", "position_sign", "shuffle_within_group"]


@dataclass(frozen=True)
class PositionScores:
    """Where each row sits, as 1-D scores that a probe reading only position would use.

    ``token_index``: the row's token index in its example; ``relative_index``: that index minus the
    mean over the example's rows (pre/post spans of one paragraph differ in it by construction,
    whatever the history); ``n_tokens``: the example's length.
    """

    token_index: np.ndarray  # [n_rows] float64
    relative_index: np.ndarray  # [n_rows] float64
    n_tokens: np.ndarray  # [n_rows] float64

    @classmethod
    def of(cls, example_id: np.ndarray, token_index: np.ndarray, n_tokens: np.ndarray) -> PositionScores:
        _, inverse = np.unique(example_id, return_inverse=True)
        sums = np.bincount(inverse, weights=token_index)
        relative = token_index - (sums / np.bincount(inverse))[inverse]
        return cls(token_index, relative, n_tokens)

    def items(self) -> tuple[tuple[str, np.ndarray], ...]:
        """``(name, score)`` pairs; the control is reported as ``position:NAME``."""
        return (
            ("token_index", self.token_index),
            ("relative_index", self.relative_index),
            ("n_tokens", self.n_tokens),
        )


def position_sign(score: np.ndarray, y: np.ndarray, rows: np.ndarray) -> float:
    """+1 if ``score`` is higher on average for the positive class among ``rows``, else −1."""
    return 1.0 if score[rows & y].mean() >= score[rows & ~y].mean() else -1.0


def oriented_auroc(score: np.ndarray, y: np.ndarray, fit_rows: np.ndarray, eval_rows: np.ndarray) -> float:
    """AUROC on ``eval_rows`` after choosing the score's sign on ``fit_rows`` (a 1-parameter probe)."""
    return auroc(position_sign(score, y, fit_rows) * score[eval_rows], y[eval_rows])


def shuffle_within_group(
    y: np.ndarray, groups: np.ndarray, keep: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Label-shuffled control: permute targets within each group (keeps group class balance).

    A group that holds one class (all of a store's rows, or a rule in one condition) would be left
    unchanged by that, and the control would silently equal the real measurement; such groups
    instead swap whole-group labels among themselves, which keeps the class balance too.
    """
    out = y.copy()
    single: list[np.ndarray] = []
    for g in np.unique(groups[keep]):
        idx = np.flatnonzero(keep & (groups == g))
        if y[idx].all() or not y[idx].any():
            single.append(idx)
        else:
            out[idx] = y[idx][rng.permutation(idx.size)]
    labels = [bool(y[idx[0]]) for idx in single]
    for idx, label in zip(single, rng.permutation(labels) if labels else [], strict=True):
        out[idx] = label
    return out
