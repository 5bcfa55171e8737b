"""What patching and ablation measure on a run: the axis's σ at the read layer, and a yes/no behaviour.

    >>> from valueprobe.attribute.readout import Readout
    >>> read = Readout.of(lm, axis, layer=22, behaviour=True)
    >>> w = read.weights(encoded, n_tokens)        # [pos]: the read as a weighted sum over tokens
    >>> read.sigma_of(h_L @ read.direction @ w)    # (h·v̂ − μ) / σ, averaged over the read rows

The read is the mean, over an example's read rows (the token rows capture selects: the last token,
a span's tokens...), of the σ-score ``(h_L·v̂ − μ)/σ``: a fixed weighted sum of per-token
projections, so a run that recomputes only some positions adds the rest as a constant. The
behaviour is ``log P(yes) − log P(no)`` at the last token, each word's single-token forms pooled
(`valueprobe.steering.experiment.yes_no.answer_tokens`): the yes/no logit difference, for data whose rows end
on a yes/no question (``meta.behaviour = "yes_no"``).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from valueprobe.activations.encode import Encoded
from valueprobe.datasets.io import Example
from valueprobe.errors import ValueprobeError
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.steering.experiment.yes_no import answer_tokens

__all__ = ["Readout", "cache_kwargs", "wants_behaviour"]


@dataclass(frozen=True)
class Readout:
    """The axis at ``layer`` (unit ``direction``, ``mu``, ``sigma``) and, if asked, the yes/no token ids."""

    layer: int
    direction: Float[Tensor, " d_model"]
    mu: float
    sigma: float
    yes: tuple[int, ...] = ()
    no: tuple[int, ...] = ()

    @classmethod
    def of(cls, lm: LoadedModel, axis: ValueAxis, *, layer: int, behaviour: bool) -> Readout:
        yes, no = answer_tokens(lm.tokenizer) if behaviour else ([], [])
        if behaviour and not (yes and no):
            raise ValueprobeError(
                f"{lm.model_id}'s tokenizer has no single-token yes or no: use --behaviour none"
            )
        i = axis.layers.index(layer)
        return cls(
            layer,
            axis.directions[i].float(),
            float(axis.mu[i]),
            float(axis.sigma[i]),
            tuple(yes),
            tuple(no),
        )

    @property
    def behaviour(self) -> bool:
        return bool(self.yes)

    def weights(self, enc: Encoded) -> Float[Tensor, " pos"]:
        """Per-token weights of an example's read: each row's tokens share 1/rows equally."""
        w = torch.zeros(len(enc.input_ids), dtype=torch.float64)
        for _, toks in enc.selections:
            w[toks] += 1.0 / (len(toks) * len(enc.selections))
        return w

    def sigma_of(self, projection: Tensor) -> Tensor:
        """σ-score of a (weighted) mean projection ``h·v̂``."""
        return (projection - self.mu) / self.sigma

    def yes_no(self, logits: Float[Tensor, "batch vocab"]) -> Float[Tensor, " batch"]:
        """``log P(yes) − log P(no)`` per row, float64."""
        lg = logits.double()
        return torch.logsumexp(lg[:, list(self.yes)], -1) - torch.logsumexp(lg[:, list(self.no)], -1)


def wants_behaviour(examples: Sequence[Example], mode: str) -> bool:
    """Whether to read the yes/no behaviour: ``yes-no``, ``none``, or ``auto`` (every row's
    ``meta.behaviour`` is ``"yes_no"``, as in data/icrl_pairs.jsonl)."""
    if mode == "auto":
        return bool(examples) and all(ex.meta.get("behaviour") == "yes_no" for ex in examples)
    return mode == "yes-no"


def cache_kwargs(lm: LoadedModel, cache: Any) -> dict[str, Any]:
    """The forward's keyword for a KV cache (transformers 5.24 renamed ``past_key_values`` to ``cache``)."""
    key = "cache" if "cache" in inspect.signature(lm.model.forward).parameters else "past_key_values"
    return {key: cache, "use_cache": True}
