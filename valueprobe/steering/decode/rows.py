"""One request per row: each row of a batched, steered ``generate`` has its own α, sampling and
length, and every step is reported as it ends (``valueprobe serve --engine hf``).

    >>> rows = [RowSpec(ids, max_new_tokens=20) for _ in range(3)]
    >>> outs = generate_rows(lm, SteeringSpec(axis, read_layer=14), rows, alphas=[-2.0, 0.0, 2.0])
    >>> outs[2].token_ids, outs[2].values          # the +2σ row's tokens and per-token σ-scores

Where `valueprobe.steering.decode.generation.generate` runs a sweep (prompts × strengths, one
sampler), this runs whatever rows arrived together. The rows share one `SteeringSpec` (serving
batches requests by their spec) and each has its own α, the spec's only per-row part: one
`Steering` handle on the route's own ``generate``, so rows with α = 0 are passed through bit for
bit and rows never see each other's steering.

A token's value is the σ-score at the spec's read layer (the first axis's site) in the forward
that produced the token, read in that forward, where `valueprobe.steering.decode.reading.read_value`
says: after the addition (the default, as ``vp.generate`` reads it) or before it. Rows may ask for log-probabilities and vLLM's penalties too.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor
from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from valueprobe.errors import ValueprobeError
from valueprobe.hooks.padding import pad_rows
from valueprobe.hooks.route import Decode, route_for
from valueprobe.model.load import LoadedModel
from valueprobe.steering.decode.generation import _config
from valueprobe.steering.decode.reading import ValueAt, read_value
from valueprobe.steering.decode.sampling import RowSampler
from valueprobe.steering.hook.handle import Specified, Steering
from valueprobe.steering.hook.spec import as_spec
from valueprobe.vocab import RouteName

__all__ = ["RowOutput", "RowSpec", "RowStep", "generate_rows"]

Finish = Literal["stop", "length"]


@dataclass(frozen=True)
class RowSpec:
    """How one row is decoded: its prompt's token ids and its sampling and length (its α is given
    beside it, `generate_rows`).

    Attributes:
        ids: the prompt, tokenized (`valueprobe.steering.decode.generation.encode_prompts`).
        max_new_tokens: >= 1; temperature: 0 is greedy; top_p in (0, 1]; seed: None draws one.
        ignore_eos: run to ``max_new_tokens`` past EOS (fixed-length benchmarks; vLLM's option).
        logprobs: None, or report each token's log-probability and the ``logprobs`` likeliest
            tokens' (0: the token's own only), from the model's logits before any penalty.
        presence_penalty, frequency_penalty: subtracted from a token's logit once it has been
            generated (presence) and per time it was (frequency), as vLLM and OpenAI do; 0: none.
    """

    ids: tuple[int, ...]
    max_new_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


@dataclass(frozen=True)
class RowStep:
    """One row's token at one step: its id, its value (σ), and why the row ends here, if it does;
    with its log-probability and the likeliest tokens' ``(id, logprob)`` when the row asked."""

    token_id: int
    value: float
    finish: Finish | None
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class RowOutput:
    """A row's whole run: tokens (EOS not included), one value per token, and how it ended."""

    token_ids: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    finish: Finish | None = None  # None: cancelled by the caller


# Called after every step with the step index and one RowStep per row (None for a row already
# done); returns the rows to cancel (a client that left): they stop at once, the others go on.
OnStep = Callable[[int, list[RowStep | None]], Collection[int]]


class _RowSampling:
    """Per-row decoding as a logits processor: the row's penalties, then argmax where temperature
    is 0, else the row's own `RowSampler` (its seed, temperature and top-p). Hands ``generate`` a
    one-hot score, and leaves on the device, for `_Steps`'s one copy of the step, each row's
    log-probability of its token and the likeliest ones' (``asked``, when some row asked)."""

    def __init__(self, rows: Sequence[RowSpec], width: int) -> None:
        self.rows = rows
        self.width = width
        self.samplers = [
            None
            if r.temperature == 0
            else RowSampler(
                [secrets.randbits(62) if r.seed is None else r.seed], temperature=r.temperature, top_p=r.top_p
            )
            for r in rows
        ]
        self.top_k = max((r.logprobs or 0 for r in rows), default=0)
        self.asked: Tensor | None = None  # [rows, 1 + 2·top_k]: logprob, top ids, top logprobs
        self.penalties = (
            _Penalties(rows) if any(r.presence_penalty or r.frequency_penalty for r in rows) else None
        )

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        # every pick stays on the device: no host read or copy per step
        logits = scores if self.penalties is None else self.penalties(input_ids, scores, self.width)
        tokens = torch.stack(
            [
                logits[i].argmax()
                if sampler is None
                else sampler.sample(logits[i][None], sampler.next_uniforms(scores.device))[0]
                for i, sampler in enumerate(self.samplers)
            ]
        )
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, tokens[:, None], 0.0)
        if any(r.logprobs is not None for r in self.rows):
            # from the model's logits before any penalty; read with the step's tokens, in one copy
            logprobs = torch.log_softmax(scores.float(), dim=-1)
            top = torch.topk(logprobs, min(self.top_k, logprobs.shape[-1]))
            own = logprobs.gather(1, tokens[:, None])
            self.asked = torch.cat([own, top.indices.to(own.dtype), top.values], dim=1)
        return out

    def last(self, i: int, asked: list[float]) -> tuple[float | None, tuple[tuple[int, float], ...]]:
        """Row ``i``'s log-probability and its likeliest ``(id, logprob)`` from its row of ``asked``
        (on the host), or nothing when it did not ask."""
        row = self.rows[i]
        if row.logprobs is None or not asked:
            return None, ()
        k, width = min(row.logprobs, self.top_k), self.top_k
        return asked[0], tuple((int(asked[1 + j]), asked[1 + width + j]) for j in range(k))


class _Penalties:
    """vLLM's presence and frequency penalties over each row's generated tokens (not the prompt),
    from a count per row and vocabulary entry kept on the device: each step adds its one new token
    (a ``scatter_add_``), where a ``bincount`` of the whole row would make a GPU wait every step."""

    def __init__(self, rows: Sequence[RowSpec]) -> None:
        self.frequency = [r.frequency_penalty for r in rows]
        self.presence = [r.presence_penalty for r in rows]
        self.counts: Tensor | None = None
        self.seen = 0  # generated tokens counted so far
        self.factors: tuple[Tensor, Tensor] | None = None  # the penalties on the device, sent once

    def __call__(self, input_ids: Tensor, scores: Tensor, width: int) -> Tensor:
        if self.counts is None or self.factors is None:
            self.counts = torch.zeros_like(scores)
            penalties = torch.tensor([self.frequency, self.presence], dtype=scores.dtype)
            frequency, presence = penalties.to(scores.device)[:, :, None].unbind(0)
            self.factors = (frequency, presence)
        new = input_ids.shape[1] - width - self.seen
        if new > 0:
            tokens = input_ids[:, -new:].long()
            self.counts.scatter_add_(1, tokens, torch.ones_like(tokens, dtype=self.counts.dtype))
            self.seen += new
        frequency, presence = self.factors
        # a row without penalties subtracts exact zeros: its logits pass through bit for bit
        return scores - frequency * self.counts - presence * (self.counts > 0).to(scores.dtype)


class _Steps(StoppingCriteria):
    """After every step: each live row's token and value, its end (EOS, its own length), and the
    caller's cancellations. Returns the rows that are done, so ``generate`` stops each on time."""

    def __init__(
        self,
        rows: Sequence[RowSpec],
        width: int,
        eos: int | None,
        read: Callable[[], Tensor],
        on_step: OnStep,
        sampling: _RowSampling,
    ) -> None:
        self.rows = rows
        self.width = width
        self.eos = eos
        self.read = read
        self.on_step = on_step
        self.sampling = sampling
        self.done = [False] * len(rows)
        self.outputs = [RowOutput() for _ in rows]
        self._flags: tuple[tuple[bool, ...], Tensor] | None = None  # `done` on the device, as last sent

    def __call__(self, input_ids: Tensor, scores: Tensor, **kwargs: object) -> Tensor:
        k = input_ids.shape[1] - self.width - 1
        # one copy to the host per step for the whole batch: tokens, values and the log-probabilities
        # rows asked for, together (float64 holds every token id and float32 value exactly)
        parts = [input_ids[:, -1:].double(), self.read().double()[:, None]]
        asked = self.sampling.asked
        host = torch.cat([*parts, *([asked.double()] if asked is not None else [])], dim=1).tolist()
        steps: list[RowStep | None] = []
        for i, (row, line) in enumerate(zip(self.rows, host, strict=True)):
            token, value = line[0], line[1]
            if self.done[i]:
                steps.append(None)
                continue
            finish: Finish | None = (
                "stop"
                if token == self.eos and not row.ignore_eos
                else ("length" if k + 1 >= row.max_new_tokens else None)
            )
            logprob, top = self.sampling.last(i, line[2:])
            steps.append(RowStep(int(token), float(value), finish, logprob, top))
            out = self.outputs[i]
            if finish != "stop":
                out.token_ids.append(int(token))
                out.values.append(float(value))
            out.finish = finish
            self.done[i] = finish is not None
        for i in self.on_step(k, steps):
            self.done[i] = True
        return self._done_on(input_ids.device)

    def _done_on(self, device: torch.device) -> Tensor:
        """``done`` as a device tensor, copied there only when a row's state changed."""
        key = tuple(self.done)
        if self._flags is None or self._flags[0] != key:
            self._flags = (key, torch.tensor(key, device=device))
        return self._flags[1]


def generate_rows(
    lm: LoadedModel,
    spec: Specified,
    rows: Sequence[RowSpec],
    alphas: Sequence[float],
    *,
    on_step: OnStep | None = None,
    route: RouteName | str = RouteName.hooks,
    value_at: ValueAt = "after",
) -> list[RowOutput]:
    """Run every row in one batch; report each step through ``on_step``; return each row's run.

    Args:
        lm: the loaded model.
        spec: what the batch steers, and where values are read (``read_layer``: default the
            first steered layer, a layer the axis has).
        rows: one `RowSpec` per request, in any mix of sampling and length.
        alphas: one strength per row, in the spec's unit (0: the row is untouched).
        on_step: called after every step (see `OnStep`); it may cancel rows.
        route: the route; only ``hooks`` runs Python at every step.
        value_at: at the first steered layer, read the value before the addition or after it
            (elsewhere the read is after any steering upstream either way).
    """
    spec = as_spec(spec)
    if not rows:
        raise ValueprobeError("no rows to generate")
    if len(alphas) != len(rows):
        raise ValueprobeError(f"{len(rows)} rows but {len(alphas)} strengths: give one α per row")
    value_layer = spec.read_at(lm.n_layers)
    if value_layer not in spec.first_axis().layers:
        raise ValueprobeError(
            f"the axis has no layer {value_layer}: pick one of its layers {list(spec.first_axis().layers)}"
        )
    config = _config(lm, max_new_tokens=max(r.max_new_tokens for r in rows), min_new_tokens=0)
    # EOS ends each row in _Steps, as the row asks: generate gets an empty EOS list, since None
    # would be filled in from the model's own generation config and stop every row at EOS
    eos, config.eos_token_id = config.eos_token_id, []
    ids, mask = pad_rows([list(r.ids) for r in rows], pad_id=config.pad_token_id, side="left")
    width = ids.shape[1]
    alpha = torch.tensor([float(a) for a in alphas], dtype=torch.float32)
    first_layer = spec.steered_layers(lm.n_layers)[0]
    trace = value_layer == first_layer and value_at == "before"
    steering = Steering(lm, spec, alpha, prompt_length=width, trace=trace)
    reading = read_value(lm, steering, layer=value_layer, at=value_at)
    sampling = _RowSampling(rows, width)
    steps = _Steps(rows, width, eos, reading.latest, on_step or (lambda k, s: ()), sampling)
    decode = Decode(
        lm,
        ids,
        mask,
        config=config,
        processors=LogitsProcessorList([sampling]),
        steering=steering,
        stopping=StoppingCriteriaList([steps]),
    )
    try:
        route_for(route).generate(decode)
    finally:
        reading.remove()
    return steps.outputs
