"""Project a store's layer onto directions: the one projection loop of sweep, transfer, replicate.

    from valueprobe.probe.project import project_layer
    (p,) = project_layer(src, 18, axis.direction(18).double().numpy())     # [n_rows]
    full, per_split = project_layer(src, 18, unit, fitted.T)             # [n_rows], [n_rows, n_splits]

One pass over the layer's shards serves every direction given, so adding a control direction costs
a column, not a re-read of the store.
"""

from __future__ import annotations

import numpy as np

from valueprobe.probe.source import Source
from valueprobe.vocab import LayerKey

__all__ = ["project_layer"]


def project_layer(src: Source, layer: LayerKey, *directions: np.ndarray) -> tuple[np.ndarray, ...]:
    """``x @ w`` for every row x of ``layer`` in ``src`` (all rows, kept or not), for each ``w``.

    Args:
        src: the stores, as one table.
        layer: a stored layer key.
        directions: each ``[d_model]`` or ``[d_model, k]``.

    Returns:
        one array per direction, ``[n_rows]`` or ``[n_rows, k]``, float64, in ``src``'s row order.
    """
    mats = [np.asarray(w, dtype=np.float64).reshape(src.d_model, -1) for w in directions]
    w = np.concatenate(mats, axis=1)  # [d_model, total columns]: one pass serves them all
    proj = np.empty((len(src.y), w.shape[1]))
    for x, sl in src.iter_layer(layer):
        proj[sl] = x @ w
    out, start = [], 0
    for given, m in zip(directions, mats, strict=True):
        part = proj[:, start : start + m.shape[1]]
        out.append(part[:, 0] if np.ndim(given) == 1 else part)
        start += m.shape[1]
    return tuple(out)
