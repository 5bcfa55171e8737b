"""Attribution patching: each component's patching effect estimated by gradient × activation difference.

    >>> from valueprobe.attribute.gradient import attrib_pair
    >>> effects, grid, base = attrib_pair(lm, read, pair, plan, runs, dest=1)   # shapes as patch_pair's

The first-order estimate of patching component c's activation ``a`` from the source row into the
destination: ``(a_src − a_dest) · ∂m/∂a``, the gradient taken on the destination run (Nanda's
"attribution patching"; Syed et al. 2023). One forward and one backward per metric (the read σ,
and the yes/no behaviour where asked) replace a forward per component. A head's activation is its
slice of ``attn_z`` (the output projection is linear, so this equals its output's), an MLP's its
output, a residual cell ``resid_post[l]`` at one position. It is exact for what enters the metric
linearly and drifts where attention patterns or norms move: `valueprobe attribute --method patch`
measures the truth, and the replication reports their agreement.
"""

from __future__ import annotations

import torch
from torch import Tensor

from valueprobe.attribute.pairs import PatchPair
from valueprobe.attribute.patching import PairRuns, PatchPlan
from valueprobe.attribute.readout import Readout
from valueprobe.hooks.patch import Point, record
from valueprobe.model.load import LoadedModel
from valueprobe.vocab import HookSite, PartSite

__all__ = ["attrib_pair"]


def _metrics(
    lm: LoadedModel, read: Readout, pair: PatchPair, plan: PatchPlan, dest: int
) -> tuple[list[Tensor], dict[tuple[str, int], Tensor]]:
    """The destination row run with its graph kept: the metrics and the activations they depend on."""
    row = pair.corrupt if dest else pair.clean
    points = {
        **{("z", b): Point(b, PartSite.attn_z) for b in plan.blocks},
        **{("mlp", b): Point(b, HookSite.mlp_out) for b in plan.blocks},
        **{("resid", b): Point(b, HookSite.resid_post) for b in {*plan.resid_layers, plan.layer}},
    }
    device = lm.device
    ids = torch.tensor([row.input_ids], device=device)
    with record(lm, list(points.values()), reduce=lambda h: h) as rec, torch.enable_grad():
        out = lm.model(input_ids=ids, use_cache=False, logits_to_keep=1)
        acts = {key: rec[p] for key, p in points.items()}
        w = read.weights(pair.clean).to(device)
        proj = acts[("resid", plan.layer)][0].double() @ read.direction.to(device).double()
        metrics = [read.sigma_of(proj @ w)]
        if read.behaviour:
            metrics.append(read.yes_no(out.logits[:, -1])[0])
    return metrics, acts


def attrib_pair(
    lm: LoadedModel, read: Readout, pair: PatchPair, plan: PatchPlan, runs: PairRuns, *, dest: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Estimated effects of patching every component and residual cell of ``plan`` into row ``dest``.

    Returns what `valueprobe.attribute.patching.patch_pair` returns, estimated: ``effects``
    ``[components, 2]``, ``grid`` ``[resid_layers, suffix, 2]`` and ``base`` ``[2]`` (the
    destination's read σ and behaviour).
    """
    f, src = pair.first_diff, 1 - dest
    metrics, acts = _metrics(lm, read, pair, plan, dest)
    keys = list(acts)
    k, width = len(plan.components), plan.d_head
    effects = torch.full((k, 2), float("nan"), dtype=torch.float64)
    grid = torch.full((len(plan.resid_layers), pair.n_tokens - f, 2), float("nan"), dtype=torch.float64)
    for m, metric in enumerate(metrics):
        grads = torch.autograd.grad(
            metric, [acts[key] for key in keys], retain_graph=m + 1 < len(metrics), allow_unused=True
        )
        g = {
            key: (torch.zeros_like(acts[key]) if gr is None else gr)[0, f:].double().cpu()
            for key, gr in zip(keys, grads, strict=True)
        }
        for i, c in enumerate(plan.components):
            if c.kind == "head":
                cols = slice(c.head * width, (c.head + 1) * width)
                delta = runs.z[c.layer][src, :, cols] - runs.z[c.layer][dest, :, cols]
                effects[i, m] = (delta.double() * g[("z", c.layer)][:, cols]).sum()
            else:
                delta = runs.mlp[c.layer][src] - runs.mlp[c.layer][dest]
                effects[i, m] = (delta.double() * g[("mlp", c.layer)]).sum()
        for j, layer in enumerate(plan.resid_layers):
            delta = runs.resid[layer][src] - runs.resid[layer][dest]
            grid[j, :, m] = (delta.double() * g[("resid", layer)]).sum(-1)
    base = torch.tensor(
        [float(x.detach()) for x in metrics] + [float("nan")] * (2 - len(metrics)), dtype=torch.float64
    )
    return effects, grid, base
