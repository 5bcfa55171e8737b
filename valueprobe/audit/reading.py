"""One forward per sequence: the residual at one layer on the tokens a test reads, projected on the
axis and on random directions, each in its own neutral σ.

    from valueprobe.audit.reading import Directions, read_spans
    dirs = Directions.of(axis, lm, layer=20, n_random=64, seed=0)   # reads the neutral reference once
    reads = read_spans(lm, examples, layer=20, site=axis.site, labels=["tail"])
    p = dirs.in_reference(reads.hidden)                             # [tokens, 1 + 64] in neutral σ

Every test of the audit compares the axis with random unit directions (`valueprobe.stats.null`) on
the same tokens. A raw projection is not comparable across directions: a direction along the
residual's high-variance dimensions moves more on any text. So each direction's projections are
divided by that direction's spread over one neutral reference (the shipped ``neutral_text``, read
as plain text, every token but position 0, the attention sink: the reference σ is measured on),
and the axis is set among the random directions in those units. The axis's own figures are also
given in its recorded σ (``axis.sigma_at(layer)``); where that σ was measured on the same
reference the two agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from valueprobe.activations.capture import run_encoded
from valueprobe.activations.encode import encode
from valueprobe.datasets.io import Example, read_jsonl
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.stats.null import random_directions
from valueprobe.vocab import ChatTemplate, PaddingSide, Positions, Site

__all__ = ["NEUTRAL", "Directions", "SpanReads", "neutral_hidden", "read_spans"]

NEUTRAL = "neutral_text"  # the shipped plain-text paragraphs every direction's σ is measured over


@dataclass(frozen=True)
class SpanReads:
    """The residual at one layer on every token of the spans read, one row per token.

    ``example`` indexes the examples given, ``span`` is the span's label, ``position`` the token's
    absolute position in its sequence; ``n_tokens`` is each example's sequence length."""

    example: np.ndarray  # int64 [rows]
    span: list[str]
    position: np.ndarray  # int64 [rows]
    hidden: np.ndarray  # float32 [rows, d_model]
    n_tokens: np.ndarray  # int64 [examples]

    def rows(self, example: int, span: str) -> np.ndarray:
        """Row indices of ``example``'s tokens in ``span``, in position order."""
        idx = np.flatnonzero((self.example == example) & (np.asarray(self.span) == span))
        return idx[np.argsort(self.position[idx], kind="stable")]


def read_spans(
    lm: LoadedModel,
    examples: Sequence[Example],
    *,
    layer: int,
    site: Site,
    labels: Sequence[str] | None,
    positions: Positions = Positions.span_tokens,
    chat_template: ChatTemplate = ChatTemplate.model,
    batch_size: int = 8,
    on_batch: Callable[[int], object] | None = None,
) -> SpanReads:
    """Run each example once and keep the residual at ``layer`` on every token of its spans labelled
    ``labels`` (``positions="all"``: every token, span ``""``)."""
    encoded = encode(
        lm, examples, positions=positions, span_labels=labels, chat_template=chat_template, warn=False
    )
    res = run_encoded(
        lm,
        encoded,
        layers=[layer],
        site=site,
        include_embed=False,
        batch_size=batch_size,
        padding_side=PaddingSide.right,
        on_batch=on_batch,
    )
    index = {ex.id: i for i, ex in enumerate(examples)}
    return SpanReads(
        example=np.array([index[x] for x in res.rows.example_id], dtype=np.int64),
        span=list(res.rows.span),
        position=res.rows.token_index.astype(np.int64),
        hidden=res.acts[layer].float().numpy(),
        n_tokens=np.array([len(e.input_ids) for e in encoded], dtype=np.int64),
    )


def neutral_hidden(
    lm: LoadedModel,
    *,
    layer: int,
    site: Site,
    batch_size: int = 8,
    on_batch: Callable[[int], object] | None = None,
) -> np.ndarray:
    """The residual at ``layer`` on every token of ``neutral_text`` but position 0 (the attention
    sink, tens of times the others' norm), read as plain text: [tokens, d_model]."""
    neutral = [ex for ex in read_jsonl(NEUTRAL) if ex.text is not None]
    reads = read_spans(
        lm,
        neutral,
        layer=layer,
        site=site,
        labels=None,
        positions=Positions.all,
        chat_template=ChatTemplate.plain,
        batch_size=batch_size,
        on_batch=on_batch,
    )
    return reads.hidden[reads.position > 0]


@dataclass(frozen=True)
class Directions:
    """The axis's unit direction (row 0) and ``k`` random unit directions at one layer, each with
    its spread over the neutral reference.

    ``reference_sigma[j]`` is the population sd of the projection on direction ``j`` over every
    token of ``neutral_text`` but position 0; ``axis_sigma`` and ``axis_mu`` are the axis's recorded
    units at the layer, in which its own effects are also reported."""

    layer: int
    matrix: np.ndarray  # float64 [1 + k, d_model], unit rows
    reference_sigma: np.ndarray  # float64 [1 + k]
    reference_tokens: int
    axis_sigma: float
    axis_mu: float

    @property
    def n_random(self) -> int:
        return self.matrix.shape[0] - 1

    @classmethod
    def of(
        cls,
        axis: ValueAxis,
        lm: LoadedModel,
        *,
        layer: int,
        n_random: int,
        seed: int,
        batch_size: int = 8,
        on_batch: Callable[[int], object] | None = None,
    ) -> Directions:
        """The axis at ``layer`` and ``n_random`` random directions, their σ read on ``lm``."""
        bare = cls.build(
            axis, layer=layer, n_random=n_random, seed=seed, reference_sigma=np.ones(n_random + 1)
        )
        neutral = neutral_hidden(lm, layer=layer, site=axis.site, batch_size=batch_size, on_batch=on_batch)
        sigma = bare.project(neutral).std(axis=0)
        return replace(bare, reference_sigma=sigma, reference_tokens=len(neutral))

    @classmethod
    def build(
        cls,
        axis: ValueAxis,
        *,
        layer: int,
        n_random: int,
        seed: int,
        reference_sigma: np.ndarray,
        reference_tokens: int = 0,
    ) -> Directions:
        """The directions with σ already measured (a resumed audit reads them back)."""
        matrix = np.concatenate(
            [
                axis.direction(layer).double().numpy()[None],
                random_directions(axis.d_model, n_random, seed=seed),
            ]
        )
        return cls(
            layer=layer,
            matrix=matrix,
            reference_sigma=np.asarray(reference_sigma, dtype=np.float64),
            reference_tokens=reference_tokens,
            axis_sigma=axis.sigma_at(layer) if axis.calibrated(layer) else float("nan"),
            axis_mu=float(axis.mu[axis.layers.index(layer)]),
        )

    def project(self, hidden: np.ndarray) -> np.ndarray:
        """Raw projections ``h·v̂`` on every direction: [rows, d_model] -> [rows, 1 + k]."""
        return np.asarray(hidden, dtype=np.float64) @ self.matrix.T

    def in_reference(self, hidden: np.ndarray) -> np.ndarray:
        """Projections in each direction's neutral σ: [rows, d_model] -> [rows, 1 + k]."""
        return self.project(hidden) / self.reference_sigma

    def axis_units(self) -> float:
        """How many of the axis's recorded σ make one neutral σ of the axis (1 when they agree;
        NaN when the axis has no σ)."""
        return float(self.reference_sigma[0] / self.axis_sigma)
