"""Readouts shared by the tuning replications: item values, answer choice, random-direction nulls.

    >>> reads = read_items(lm, items, axes, nulls)      # σ scores on each item's tokens
    >>> pick = most_likely_option(lm, prompt_msgs, ["dolphin", "spoon"])   # the option the model would answer

Every reading goes through :func:`valueprobe.activations.capture.capture` (mean of the item's tokens inside
the assistant's answer, ``resid_post`` at the axis's layer); choices use the model's own log
probabilities of each option as the whole assistant answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from valueprobe.activations.capture import CaptureSettings, capture
from valueprobe.datasets.io import Example, Span
from valueprobe.hooks.padding import pad_id_for, pad_rows
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.stats.null import random_directions
from valueprobe.vocab import Positions

__all__ = [
    "LayerDirection",
    "directions_for",
    "item_example",
    "read_items",
    "most_likely_option",
    "hier_boot",
    "ci",
]


@dataclass(frozen=True)
class LayerDirection:
    """A unit direction at one layer with the μ and σ that put its projection in σ units."""

    name: str
    layer: int
    v: torch.Tensor  # [d_model]
    mu: float
    sigma: float

    def score(self, h: torch.Tensor) -> np.ndarray:
        return ((h.double() @ self.v.double() - self.mu) / self.sigma).numpy()


def directions_for(axes: Mapping[str, ValueAxis], *, n_random: int, seed: int) -> list[LayerDirection]:
    """Each axis at its best layer, plus ``n_random`` random unit directions at each of those layers.

    Random directions get μ and σ later from the base model's readings (:func:`calibrate_nulls`).
    They are `valueprobe.stats.null.random_directions` by ``seed``, in one stream: axis ``k``
    takes rows ``k·n_random ...`` of it, so no two axes share a direction. (Results written before
    this drew them from a torch generator by ``seed``: other directions, the same distribution.)
    """
    out: list[LayerDirection] = []
    for k, (name, axis) in enumerate(axes.items()):
        i = axis.layers.index(axis.best_layer)
        out.append(
            LayerDirection(
                name, axis.best_layer, axis.directions[i].float(), float(axis.mu[i]), float(axis.sigma[i])
            )
        )
        if n_random < 1:
            continue
        rows = random_directions(axis.d_model, (k + 1) * n_random, seed=seed)[k * n_random :]
        for r, v in enumerate(torch.from_numpy(rows).float()):
            out.append(LayerDirection(f"{name}/random{r:02d}", axis.best_layer, v, 0.0, 1.0))
    return out


def calibrate_nulls(dirs: Sequence[LayerDirection], acts: Mapping[int, torch.Tensor]) -> list[LayerDirection]:
    """Give each random direction the μ and σ of its projections on the base model's readings."""
    out = []
    for d in dirs:
        if "/random" in d.name:
            p = acts[d.layer].double() @ d.v.double()
            d = LayerDirection(d.name, d.layer, d.v, float(p.mean()), float(p.std()))
        out.append(d)
    return out


def item_example(
    ex_id: str,
    prompt: Sequence[Mapping[str, str]],
    answer: str,
    item: str,
    *,
    group: str = "items",
    label: int = 0,
    meta: dict | None = None,
) -> Example:
    """Prompt + an assistant ``answer``; the span ``item`` covers the item's first occurrence in it.

    The span starts at the space before the item, if any: byte-level tokenizers that keep the space
    in the token's offsets (SmolLM2's) start the token " dolphin" there, and a token belongs to the
    span that holds its first character.
    """
    end = answer.index(item) + len(item)
    start = end - len(item) - (answer[: end - len(item)].endswith(" "))
    return Example(
        id=ex_id,
        label=label,
        group=group,
        messages=(
            *({"role": m["role"], "content": m["content"]} for m in prompt),
            {"role": "assistant", "content": answer},
        ),
        spans=(Span(start, end, "item", message=len(prompt)),),
        meta=meta or {},
    )


def read_items(
    lm: LoadedModel, examples: Sequence[Example], dirs: Sequence[LayerDirection], *, batch_size: int = 16
) -> tuple[dict[str, np.ndarray], dict[int, torch.Tensor]]:
    """σ score of every example's ``item`` span along each direction; also the raw activations."""
    layers = sorted({d.layer for d in dirs})
    settings = CaptureSettings(
        layers=layers, positions=Positions.spans, span_labels=["item"], batch_size=batch_size
    )
    res = capture(lm, examples, settings, progress=False)
    if res.rows.example_id != [e.id for e in examples]:
        raise RuntimeError("capture returned rows out of order")  # one span per example, by construction
    acts = {int(k): v for k, v in res.acts.items() if k != "embed"}
    return {d.name: d.score(acts[d.layer]) for d in dirs}, acts


@torch.no_grad()
def most_likely_option(lm: LoadedModel, prompt: Sequence[Mapping[str, str]], options: Sequence[str]) -> int:
    """Index of the option the model most likely answers: max total log p(option | prompt)."""
    tok = lm.tokenizer
    prefix = tok.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)
    pre_ids = tok(prefix, add_special_tokens=False).input_ids
    seqs = [pre_ids + tok(o, add_special_tokens=False).input_ids for o in options]
    # right padding: each option keeps positions 0..n-1, and no real token attends to a pad
    ids, mask = pad_rows(seqs, pad_id=pad_id_for(tok), side="right")
    ids, mask = ids.to(lm.device), mask.to(lm.device)
    logp = torch.log_softmax(lm.model(input_ids=ids, attention_mask=mask).logits.float(), -1)
    totals = []
    for i, s in enumerate(seqs):
        pos = torch.arange(len(pre_ids), len(s), device=lm.device)
        totals.append(float(logp[i, pos - 1, ids[i, pos]].sum()))
    return int(np.argmax(totals))


def hier_boot(
    per_model: Sequence[np.ndarray], *, n_boot: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """Mean over models of each model's mean, with a 95% CI resampling models, then prompts within each."""
    groups = [np.asarray(g, dtype=np.float64) for g in per_model if len(g)]
    if not groups:
        return float("nan"), float("nan"), float("nan")
    point = float(np.mean([g.mean() for g in groups]))
    rng = np.random.default_rng(seed)
    stats = np.empty(n_boot)
    for b in range(n_boot):
        pick = rng.integers(0, len(groups), len(groups))
        stats[b] = np.mean([groups[i][rng.integers(0, len(groups[i]), len(groups[i]))].mean() for i in pick])
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return point, float(lo), float(hi)


def ci(values: Sequence[float] | np.ndarray) -> dict[str, float]:
    """Mean and percentile range (2.5–97.5) of a null distribution."""
    a = np.asarray(values, dtype=np.float64)
    return {"mean": float(a.mean()), "lo": float(np.percentile(a, 2.5)), "hi": float(np.percentile(a, 97.5))}
