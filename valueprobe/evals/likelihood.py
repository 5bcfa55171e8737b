"""Steered log-likelihoods of continuations: what a harness's ``loglikelihood`` asks, one α per row.

    >>> rows = [Scored(context=(5, 6, 7), continuation=(8, 9)), Scored(context=(5,), continuation=(4,))]
    >>> continuation_logprobs(lm, SteeringSpec(axis, unit="norm"), rows, alphas=[15.0, 0.0])
    [(-7.21, False), (-3.05, True)]

A batch lays each row out as its context, left padded to the batch's widest context, then its
continuation, right padded: every continuation starts in one column, the width of the contexts.
That width is the steering's ``prompt_length``, so a spec's phase reads as it does while
generating: the context is the prompt, and the continuation the tokens the model would have
generated (``positions="generated"`` and a window steer continuation tokens, as they steer
generated ones). Position ids come from the mask, so padding moves no token's position, and pad
cells are never steered (`valueprobe.steering.hook.handle.Steering.cells`). The steering is one
`Steering` handle per batch with α per row, the handle ``vp.generate`` makes per chunk.

A row longer than ``max_length + 1`` tokens loses tokens from the left of its context, as
lm-evaluation-harness's HFLM cuts it (its last ``max_length + 1`` tokens are kept, the last one
only predicted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from valueprobe.errors import ValueprobeError
from valueprobe.hooks.padding import pad_id_for
from valueprobe.hooks.route import position_ids_from_mask
from valueprobe.model.load import LoadedModel
from valueprobe.steering.hook.handle import Specified, steer
from valueprobe.steering.hook.spec import as_spec

__all__ = ["Scored", "continuation_logprobs", "model_max_length"]


@dataclass(frozen=True)
class Scored:
    """One row to score: its context's token ids (at least one) and its continuation's."""

    context: tuple[int, ...]
    continuation: tuple[int, ...]


def model_max_length(lm: LoadedModel, default: int = 2048) -> int:
    """The longest sequence the model takes: its config's ``max_position_embeddings`` (or
    ``n_positions``), else ``default``."""
    config = lm.model.config
    for key in ("max_position_embeddings", "n_positions", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return default


def _cut(row: Scored, max_length: int) -> Scored:
    """The row's last ``max_length + 1`` tokens (its context cut from the left)."""
    if not row.continuation:
        raise ValueprobeError("a continuation to score needs at least one token")
    if not row.context:
        raise ValueprobeError("a continuation is scored after a context of at least one token")
    keep = max_length + 1 - len(row.continuation)
    if keep < 1:
        raise ValueprobeError(
            f"a continuation of {len(row.continuation)} tokens does not fit the model's {max_length}"
        )
    return Scored(row.context[-keep:], row.continuation)


def _batch(rows: Sequence[Scored], pad: int) -> tuple[Tensor, Tensor, int, int]:
    """ids and mask ``[rows, W + C]``: contexts left padded to W, continuations right padded to C."""
    width = max(len(r.context) for r in rows)
    span = max(len(r.continuation) for r in rows)
    ids = torch.full((len(rows), width + span), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        a, b = width - len(r.context), width + len(r.continuation)
        ids[i, a:b] = torch.tensor([*r.context, *r.continuation], dtype=torch.long)
        mask[i, a:b] = 1
    return ids, mask, width, span


def _score_batch(
    lm: LoadedModel, spec: Specified, rows: Sequence[Scored], alphas: Sequence[float]
) -> list[tuple[float, bool]]:
    ids, mask, width, span = _batch(rows, pad_id_for(lm.tokenizer))
    device = lm.device
    alpha = torch.tensor([float(a) for a in alphas], dtype=torch.float32)
    with torch.no_grad(), steer(lm, spec, alpha, prompt_length=width):
        logits = lm.model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            position_ids=position_ids_from_mask(mask).to(device),
        ).logits
    # column width - 1 + j predicts continuation token j (column width + j)
    logprobs = torch.log_softmax(logits[:, width - 1 : width - 1 + span].float(), dim=-1)
    targets = ids[:, width : width + span].to(device)
    got = logprobs.gather(-1, targets[..., None])[..., 0]  # [rows, span]
    keep = mask[:, width : width + span].to(device).bool()
    total = torch.where(keep, got, torch.zeros_like(got)).sum(dim=1)
    greedy = ((logprobs.argmax(dim=-1) == targets) | ~keep).all(dim=1)
    host = torch.stack([total.double(), greedy.double()], dim=1).cpu().tolist()  # one copy per batch
    return [(float(t), bool(g)) for t, g in host]


def continuation_logprobs(
    lm: LoadedModel,
    spec: Specified,
    rows: Sequence[Scored],
    alphas: Sequence[float],
    *,
    batch_size: int = 16,
    max_length: int | None = None,
) -> list[tuple[float, bool]]:
    """``(log P(continuation | context), whether greedy decoding gives it)`` for every row, steered.

    Args:
        lm: the loaded model.
        spec: what to steer (`valueprobe.steering.hook.spec.SteeringSpec`; an axis: every default).
        rows: the rows, in any order; the result follows it.
        alphas: one strength per row, in the spec's unit (0: the unsteered model, bit for bit).
        batch_size: rows per forward; rows are batched longest first.
        max_length: tokens the model sees at most (default `model_max_length`).
    """
    spec = as_spec(spec)
    if len(alphas) != len(rows):
        raise ValueprobeError(f"{len(rows)} rows but {len(alphas)} strengths: give one α per row")
    if batch_size < 1:
        raise ValueprobeError(f"batch_size must be >= 1, got {batch_size}")
    spec.points(lm)  # every check of the spec against the model, before any work
    limit = model_max_length(lm) if max_length is None else max_length
    cut = [_cut(r, limit) for r in rows]
    order = sorted(range(len(cut)), key=lambda i: -(len(cut[i].context) + len(cut[i].continuation)))
    out: list[tuple[float, bool]] = [(0.0, False)] * len(cut)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        got = _score_batch(lm, spec, [cut[i] for i in chunk], [alphas[i] for i in chunk])
        for i, result in zip(chunk, got, strict=True):
            out[i] = result
    return out
