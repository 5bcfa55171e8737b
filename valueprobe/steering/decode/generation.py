"""A whole steering sweep as batched generation: prompts × samples × strengths, one row each.

    >>> gens = generate(lm, axis, ["Is 7 prime?", "Write a haiku."], alphas=[-2, 0, 2],
    ...                 decoding=Decoding(samples=2, max_new_tokens=48, temperature=0.7))
    >>> gens[0].to_dict()      # {"prompt": 0, "sample": 0, "alpha": -2.0, "seed": ..., "text": ...}

What is steered is one `valueprobe.steering.hook.spec.SteeringSpec` (an axis means every default);
α is the per-row part. Rows are left padded and run in chunks of ``batch_size``, each chunk one
`valueprobe.hooks.decode.Decode` carrying one `valueprobe.steering.hook.handle.Steering` (the
spec and the chunk's α), handed to the route's ``generate`` (plain hooks, or nnsight for NDIF):
this module never asks which route it has. Sampling uses common random numbers
(`valueprobe.steering.decode.sampling`): the seed of a row depends only on (seed, prompt,
sample), so every strength and direction of one (prompt, sample) draws the same uniforms, and a
row draws the same numbers whatever chunk it lands in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor
from tqdm.auto import tqdm
from transformers import GenerationConfig, LogitsProcessorList

from valueprobe.activations.prompts import Prompt, prompt_ids
from valueprobe.errors import ValueprobeError
from valueprobe.hooks.padding import pad_id_for, pad_rows
from valueprobe.hooks.route import Decode, Point, Route, route_for
from valueprobe.read.values import Values
from valueprobe.records import Record
from valueprobe.steering.decode.reading import VALUE_AT, Reading, ValueAt, describe, read_value
from valueprobe.steering.decode.sampling import Decoding, RowSampler, row_seed
from valueprobe.steering.hook.handle import AlphaSource, Specified, Steering, to_host
from valueprobe.steering.hook.spec import SteeringSpec, as_spec
from valueprobe.vocab import HookSite, RouteName

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel

__all__ = ["Generation", "Trace", "Tracing", "encode_prompts", "generate"]


@dataclass(frozen=True)
class Trace(Record):
    """Per-token readout of one row: σ-scores by layer, and the α applied, for every token fed.

    ``values[name]`` has one entry per token of ``tokens`` (prompt then generated), read at that
    token; the last generated token is never fed back, so its entries are NaN (``Generation.values``
    has every generated token's value, read in the forward that produced it). Names are
    ``"resid_post[21]"``. ``steered`` names the read point (the spec's read layer, default the
    steered one), read ``at`` its addition: ``after`` (the default) or ``before`` it; ``read``
    says it in words. Other read layers see the steering upstream.
    """

    OMIT: ClassVar = {"at": "before", "read": ""}  # traces written before the read point was named

    tokens: tuple[str, ...]
    n_prompt: int
    values: dict[str, tuple[float, ...]]
    alpha: tuple[float, ...]
    steered: str  # the name in ``values`` of the read point
    at: ValueAt = "before"
    read: str = ""


@dataclass(frozen=True)
class Generation(Record):
    """One generated row of a sweep.

    Attributes:
        prompt: index into the prompts given; sample: the sample index of that prompt.
        alpha: the strength, in ``unit``; direction: the name of the steered direction.
        seed: the row's sampling seed (None under greedy decoding).
        text: the generated text (no prompt, no EOS); token_ids: its token ids.
        finished: whether the row stopped on EOS before ``max_new_tokens``.
        trace: the per-token readout, when asked for.
        op: the steering operator (`valueprobe.steering.hook.operators.Operator.describe`), e.g. ``ablate``.
        values: with ``trace=True``, each generated token and its value (σ, projection, cos) at
            the read point, read in the forward that produced it (`valueprobe.read.values.Values`).
    """

    OMIT: ClassVar = {"values": None}

    prompt: int
    sample: int
    alpha: float
    unit: str
    direction: str
    seed: int | None
    text: str
    token_ids: tuple[int, ...]
    finished: bool
    trace: Trace | None = field(default=None, compare=False)
    op: str = "add"
    values: Values | None = field(default=None, compare=False)


def encode_prompts(lm: LoadedModel, prompts: Sequence[Prompt], *, chat: bool = True) -> list[list[int]]:
    """Token ids of each prompt, by `valueprobe.activations.prompts.prompt_ids`: a string as a user
    turn through the chat template (``chat=False``: the text as is), a chat through the template,
    token ids as they are."""
    return [prompt_ids(lm, p, chat=chat, where=f"prompt {i}") for i, p in enumerate(prompts)]


@dataclass(frozen=True)
class _Row:
    prompt: int
    sample: int
    alpha: float
    seed: int | None


@dataclass(frozen=True)
class Tracing:
    """What a traced `generate` reads (``trace=True`` is ``trace=Tracing()``).

    ``value_at``: the read point at the spec's read layer (default the steered one), ``after`` the
    addition (as ``valueprobe serve`` reads it) or ``before`` it (what the model carried on its own);
    ``read_layers``: also trace the σ-score at these layers (resid_post, after any steering upstream).

    >>> generate(lm, axis, ["Is 7 prime?"], alphas=[2.0], trace=Tracing(value_at="before", read_layers=(10,)))
    """

    value_at: ValueAt = "after"
    read_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.value_at not in VALUE_AT:
            raise ValueprobeError(f"value_at {self.value_at!r}: use one of {', '.join(VALUE_AT)}")


@dataclass(frozen=True)
class _Run:
    """What every chunk of one `generate` call shares (``tracing`` None: no trace)."""

    config: GenerationConfig
    decoding: Decoding
    spec: SteeringSpec
    tracing: Tracing | None


def _check_sizes(
    prompts: Sequence[Prompt], alphas: Sequence[float], decoding: Decoding, batch_size: int
) -> None:
    if decoding.max_new_tokens < 1:
        raise ValueprobeError(f"max_new_tokens must be >= 1, got {decoding.max_new_tokens}")
    if decoding.samples < 1 or batch_size < 1:
        raise ValueprobeError(f"samples and batch_size must be >= 1, got {decoding.samples} and {batch_size}")
    if not prompts:
        raise ValueprobeError("no prompts to generate from")
    if not alphas:
        raise ValueprobeError("no strengths (alphas) given")


def _rows(n_prompts: int, samples: int, alphas: Sequence[float], *, seed: int, greedy: bool) -> list[_Row]:
    """Every (prompt, sample, α) row in that nested order, each with its common-random-numbers seed."""
    return [
        _Row(p, s, float(a), None if greedy else row_seed(seed, p, s))
        for p in range(n_prompts)
        for s in range(samples)
        for a in alphas
    ]


def _config(lm: LoadedModel, *, max_new_tokens: int, min_new_tokens: int) -> GenerationConfig:
    """Greedy at the model (a `RowSampler` samples), with the pad and EOS ids of the tokenizer."""
    eos = getattr(lm.tokenizer, "eos_token_id", None)
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens,
        do_sample=False,
        pad_token_id=pad_id_for(lm.tokenizer),
        eos_token_id=None if eos is None else int(eos),
    )


def _chunks(rows: Sequence[_Row], size: int) -> Iterator[list[_Row]]:
    for i in range(0, len(rows), size):
        yield list(rows[i : i + size])


def _point_name(p: Point) -> str:
    return f"{HookSite(str(p.site)).value}[{p.layer}]"


def generate(
    lm: LoadedModel,
    spec: Specified,
    prompts: Sequence[Prompt],
    *,
    alphas: Sequence[float] = (0.0,),
    decoding: Decoding = Decoding(),
    trace: bool | Tracing = False,
    batch_size: int = 32,
    route: RouteName | str = RouteName.hooks,
    source: Callable[[int], AlphaSource] | None = None,
    progress: bool = True,
    chat: bool = True,
) -> list[Generation]:
    """Generate every (prompt, sample, α) row, batched; rows come back in that nested order.

    Args:
        lm: the loaded model.
        spec: what to steer (`valueprobe.steering.hook.spec.SteeringSpec`); an axis (``-axis``
            flips it) or a list of axes means every default. An operator but ``add``, a site off
            the residual stream, a window or a condition run on the hooks route only.
        prompts: strings (each a user turn through the chat template; ``chat=False``: the text
            as is), chats (lists of ``{"role", "content"}``) or token ids
            (`valueprobe.activations.prompts.prompt_ids`).
        alphas: strengths in the spec's unit, one row each per (prompt, sample).
        decoding: samples, seed, lengths, greedy or temperature and top-p
            (`valueprobe.steering.decode.sampling.Decoding`); row seeds are ``row_seed(seed, prompt, sample)``.
        trace: read the value as the rows are generated: each `Generation` then carries
            ``values`` (every generated token's value at the read point) and a per-token `Trace`;
            a `Tracing` says where (the read point before or after the addition, more layers).
        batch_size: rows per ``generate`` call (memory grows with it, time falls).
        route: the route that generates (`valueprobe.hooks.route.Route.generate`): ``hooks``, or
            ``nnsight`` (open loop only, no trace: the NDIF route).
        source: closed-loop α (`valueprobe.steering.decode.pid`); given the chunk's row count,
            returns the hook's α source. Hooks route only.
        chat: render string prompts with the chat template (the default, as ``valueprobe trace``).

    Each `Generation` records the spec's unit, operator and ``direction_name`` (default ``axis``).

    >>> (g,) = generate(lm, axis, ["Is 7 prime?"], alphas=[2.0], trace=True)
    >>> g.text, g.values.sigma          # one σ per generated token, read after the +2 σ addition
    """
    spec = as_spec(spec)
    _check_sizes(prompts, alphas, decoding, batch_size)
    impl = route_for(route)
    spec.points(lm)  # every check of the spec against the model, before any work
    tracing = Tracing() if trace is True else (trace or None)
    encoded = encode_prompts(lm, prompts, chat=chat)
    rows = _rows(len(prompts), decoding.samples, alphas, seed=decoding.seed, greedy=decoding.greedy)
    config = _config(lm, max_new_tokens=decoding.max_new_tokens, min_new_tokens=decoding.min_new_tokens)
    run = _Run(config=config, decoding=decoding, spec=spec, tracing=tracing)
    out: list[Generation] = []
    with tqdm(total=len(rows), desc="generate", unit="row", disable=not progress) as bar:
        for chunk in _chunks(rows, batch_size):
            alpha_source = None if source is None else source(len(chunk))
            out.extend(_run_chunk(impl, lm, chunk, encoded, run, alpha_source))
            bar.update(len(chunk))
    return out


@dataclass(frozen=True)
class _Reads:
    """A chunk's readings on the host: σ per forward by point name, α applied, and the read point's
    (σ, ‖h‖) per column, ``[rows, columns, 2]``."""

    by_name: dict[str, list[Tensor]]
    applied: list[Tensor]
    point: Tensor
    name: str
    at: ValueAt
    read: str


def _reads(lm: LoadedModel, steering: Steering, reading: Reading, steered: int) -> _Reads:
    """A chunk's traces by point name, the α applied, and the read point's series (two host copies)."""
    values, applied = steering.traced()
    by_name = {_point_name(p): v for p, v in values.items()}
    series = torch.cat(to_host(reading.series()), dim=1)
    name = _point_name(Point(reading.layer, steering.axis.site))
    by_name[name] = [series[..., 0]]
    read = describe(reading.layer, str(steering.axis.site), reading.at, steered)
    return _Reads(by_name, applied, series, name, reading.at, read)


def _run_chunk(
    impl: Route,
    lm: LoadedModel,
    chunk: list[_Row],
    encoded: list[list[int]],
    run: _Run,
    source: AlphaSource | None,
) -> list[Generation]:
    """Left pad the chunk, hand it to the route as one `Decode`, and read each row back."""
    ids, mask = pad_rows([encoded[r.prompt] for r in chunk], pad_id=run.config.pad_token_id, side="left")
    processors = LogitsProcessorList()
    if chunk[0].seed is not None:
        seeds = [int(r.seed or 0) for r in chunk]
        processors.append(RowSampler(seeds, temperature=run.decoding.temperature, top_p=run.decoding.top_p))
    steering = Steering(
        lm,
        run.spec,
        torch.tensor([r.alpha for r in chunk]),
        prompt_length=ids.shape[1],
        trace=run.tracing is not None,
        source=source,
        read_layers=() if run.tracing is None else run.tracing.read_layers,
    )
    steered = steering.points[0].layer
    reading = (
        None
        if run.tracing is None
        else read_value(lm, steering, layer=run.spec.read_at(lm.n_layers), at=run.tracing.value_at)
    )
    try:
        seqs = impl.generate(
            Decode(lm, ids, mask, config=run.config, processors=processors, steering=steering)
        )
    finally:
        if reading is not None:
            reading.remove()
    reads = None if reading is None else _reads(lm, steering, reading, steered)
    return [
        _row_result(lm, i, r, seqs[i].cpu(), ids.shape[1], mask[i], run, reads) for i, r in enumerate(chunk)
    ]


def _row_result(
    lm: LoadedModel,
    i: int,
    row: _Row,
    seq: Tensor,
    width: int,
    prompt_mask: Tensor,
    run: _Run,
    reads: _Reads | None,
) -> Generation:
    new = seq[width:].tolist()
    eos = run.config.eos_token_id
    finished = eos is not None and eos in new
    kept = new[: new.index(eos)] if finished else new
    text = lm.tokenizer.decode(kept, skip_special_tokens=True)
    trace = values = None
    if reads is not None:
        trace = _trace(lm, i, seq, width, int(prompt_mask.sum()), len(kept), reads)
        # generated token k was produced by the forward at column width - 1 + k (the last prompt
        # token's for k = 0): every kept token has a value, the last one included
        point = reads.point[i, width - 1 : width - 1 + len(kept)]
        values = Values.of(
            run.spec.first_axis(),
            kept,
            [lm.tokenizer.decode([t]) for t in kept],
            point,
            layer=run.spec.read_at(lm.n_layers),
            read=reads.read,
            produced=True,
        )
    return Generation(
        prompt=row.prompt,
        sample=row.sample,
        alpha=row.alpha,
        unit=run.spec.unit.value,
        direction=run.spec.name(),
        seed=row.seed,
        text=text,
        token_ids=tuple(kept),
        finished=finished,
        trace=trace,
        op=run.spec.op.describe(),
        values=values,
    )


def _trace(
    lm: LoadedModel, i: int, seq: Tensor, width: int, n_prompt: int, n_kept: int, reads: _Reads
) -> Trace:
    """Row ``i``'s `Trace`: each token fed (prompt, then generated) with its value at each point."""
    cols = list(range(width - n_prompt, width + n_kept))
    pieces = [lm.tokenizer.decode([t]) for t in seq[width - n_prompt : width + n_kept].tolist()]

    def per_token(parts: list[Tensor]) -> tuple[float, ...]:
        full = torch.cat(parts, dim=1)[i].tolist() if parts else []  # one host read per row
        return tuple(float(full[c]) if c < len(full) else float("nan") for c in cols)

    return Trace(
        tokens=tuple(pieces),
        n_prompt=n_prompt,
        values={name: per_token(parts) for name, parts in reads.by_name.items()},
        alpha=per_token(reads.applied),
        steered=reads.name,
        at=reads.at,
        read=reads.read,
    )
