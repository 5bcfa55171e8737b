"""What steering adds to h: α·size·v̂, computed here for every route, engine, export and the axis.

    >>> h + addition(alpha, point.unit_size, point.direction_on(h.device)).to(h.dtype)   # add
    >>> addition(torch.tensor(2.0), axis.unit_size(20, "sigma"), axis.direction(20))   # a vector

Row r of a steered batch moves each cell along the unit direction v̂ by α[r] times a size: for
``add`` (and ``add-norm``, before its rescale) the size of one unit of α at the point
(`valueprobe.probe.axis.ValueAxis.unit_size`); for ``ablate``, ``set`` and ``clamp`` the distance
from the cell's projection to the operator's goal (`valueprobe.steering.hook.operators`). Every
place that turns a spec and α into a change of h calls `addition`: the hook operators (the hooks
route, the hf engine), nnsight's generate graph, the vLLM plugin's resolved vectors, the exported
control vectors, `ValueAxis.vector`, and `steering_delta` (one forward's steered logits, every route,
TransformerLens included). It lives on the hooks floor, the lowest of those callers (the probe
floor sits above it).

α is a float32 tensor (one value, or one per row or cell) and the product α·size is taken in
float32 before it multiplies v̂, so every caller adds the same bits for the same α.
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from valueprobe.errors import ValueprobeError

__all__ = ["addition", "steering_delta"]


def addition(
    alpha: Float[Tensor, "*cells"],
    size: float | Float[Tensor, "*cells"],
    direction: Float[Tensor, " d_model"],
) -> Float[Tensor, "*cells d_model"]:
    """α·size·v̂ at every cell of ``alpha`` (float32, on ``alpha``'s device).

    Args:
        alpha: strengths, one per cell (a 0-d tensor gives one vector ``[d_model]``).
        size: one unit of α there (a float), or a per-cell distance (the moving operators).
        direction: the unit direction v̂, on ``alpha``'s device.

    >>> addition(torch.tensor([1.0, -2.0]), 0.5, torch.tensor([0.0, 1.0]))
    tensor([[ 0.0000,  0.5000],
            [-0.0000, -1.0000]])
    """
    return (alpha * size)[..., None] * direction


def steering_delta(
    vector: Float[Tensor, " d_model"],
    alpha: float | Float[Tensor, " batch"],
    positions: Bool[Tensor, "batch pos"] | None,
    shape: tuple[int, int],
    *,
    dtype: torch.dtype,
    device: torch.device,
) -> Float[Tensor, "batch pos d_model"]:
    """alpha · vector at the chosen (row, position) cells, zero elsewhere: the h += α·v of steering
    (``vector`` taken as given, so its size is 1 unit)."""
    batch, pos = shape
    alpha_t = torch.as_tensor(alpha, dtype=torch.float32).reshape(-1)
    if alpha_t.numel() not in (1, batch):
        raise ValueprobeError(
            f"alpha has {alpha_t.numel()} values for a batch of {batch}: give one or one per row"
        )
    if vector.ndim != 1:
        raise ValueprobeError(f"steering vector must be 1-D [d_model], got shape {tuple(vector.shape)}")
    where = torch.ones(batch, pos) if positions is None else positions.to(torch.float32).cpu()
    if where.shape != (batch, pos):
        raise ValueprobeError(f"positions mask shape {tuple(where.shape)} != input_ids shape {(batch, pos)}")
    cells = alpha_t.expand(batch)[:, None] * where
    return addition(cells, 1.0, vector.detach().float().cpu()).to(device=device, dtype=dtype)
