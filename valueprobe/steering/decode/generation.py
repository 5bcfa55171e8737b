"""A whole steering sweep as batched generation: prompts × samples × strengths, one row each.

    >>> gens = generate(lm, axis, ["Is 7 prime?", "Write a haiku."], alphas=[-2, 0, 2], samples=2,
    ...                 max_new_tokens=48, temperature=0.7, seed=0)
    >>> gens[0].to_dict()      # {"prompt": 0, "sample": 0, "alpha": -2.0, "seed": ..., "text": ...}

Every row carries its own α (`valueprobe.steering.hook.handle.Steering`), rows are left padded and run in chunks
of ``batch_size``, each chunk one `valueprobe.hooks.decode.Decode` handed to the route's ``generate``
(plain hooks, or nnsight for NDIF): this module never asks which route it has. Sampling uses common random numbers (`valueprobe.steering.decode.sampling`): the seed of a row
depends only on (seed, prompt, sample), so every strength and direction of one (prompt, sample)
draws the same uniforms, and a row draws the same numbers whatever chunk it lands in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from tqdm.auto import tqdm
from transformers import GenerationConfig, LogitsProcessorList

from valueprobe.errors import ValueprobeError
from valueprobe.files import record_from_dict
from valueprobe.hooks.padding import pad_id_for, pad_rows
from valueprobe.hooks.route import Decode, Point, Route, route
from valueprobe.steering.decode.sampling import RowSampler, row_seed
from valueprobe.steering.hook.condition import Condition
from valueprobe.steering.hook.handle import (
    AlphaSource,
    Attach,
    Steering,
    SteerPoint,
    Where,
    check_phase,
    steer_plan,
)
from valueprobe.steering.hook.operators import Operator, as_operator
from valueprobe.vocab import Backend, HookSite, LayerSpec, Site, Unit

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel
    from valueprobe.probe.axis import ValueAxis

__all__ = ["Generation", "Trace", "encode_prompts", "generate"]

Prompt = str | Sequence[dict[str, str]]  # raw text, or a chat (rendered with the chat template)


@dataclass(frozen=True)
class Trace:
    """Per-token readout of one row: σ-scores by layer, and the α applied, for every token fed.

    ``values[name]`` has one entry per token of ``tokens`` (prompt then generated); the last
    generated token is never fed back, so its entries are NaN. Names are ``"resid_post[21]"``;
    at the steered point the value is read *before* the addition.
    """

    tokens: tuple[str, ...]
    n_prompt: int
    values: dict[str, tuple[float, ...]]
    alpha: tuple[float, ...]
    steered: str  # the name in ``values`` of the steered point

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Trace:
        """The record again from its ``to_dict()`` (or the JSON of it)."""
        return record_from_dict(cls, d)


@dataclass(frozen=True)
class Generation:
    """One generated row of a sweep.

    Attributes:
        prompt: index into the prompts given; sample: the sample index of that prompt.
        alpha: the strength, in ``unit``; direction: the name of the steered direction.
        seed: the row's sampling seed (None under greedy decoding).
        text: the generated text (no prompt, no EOS); token_ids: its token ids.
        finished: whether the row stopped on EOS before ``max_new_tokens``.
        trace: the per-token readout, when asked for.
        op: the steering operator (`valueprobe.steering.hook.operators.Operator.describe`), e.g. ``ablate``.
    """

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

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["trace"] = None if self.trace is None else self.trace.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Generation:
        """The record again from its ``to_dict()`` (or the JSON of it)."""
        return record_from_dict(cls, d)


def encode_prompts(lm: LoadedModel, prompts: Sequence[Prompt]) -> list[list[int]]:
    """Token ids of each prompt: text as is, a chat list through the chat template (with the
    assistant turn opened)."""
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            text, special = p, True
        else:
            text = lm.tokenizer.apply_chat_template(list(p), tokenize=False, add_generation_prompt=True)
            special = False
        ids = lm.tokenizer(text, add_special_tokens=special)["input_ids"]
        if not ids:
            raise ValueprobeError(f"prompt {i} is empty: give at least one token of text")
        out.append(list(ids))
    return out


@dataclass(frozen=True)
class _Row:
    prompt: int
    sample: int
    alpha: float
    seed: int | None


@dataclass(frozen=True)
class _Settings:
    """What every chunk of one `generate` call shares."""

    config: GenerationConfig
    temperature: float
    top_p: float
    unit: Unit
    where: Where
    direction_name: str
    read_layers: Sequence[int]
    trace: bool
    op: Operator
    window: tuple[int, int] | None
    condition: Condition | None


def _check_sizes(
    prompts: Sequence[Prompt], alphas: Sequence[float], *, max_new_tokens: int, samples: int, batch_size: int
) -> None:
    if max_new_tokens < 1:
        raise ValueprobeError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if samples < 1 or batch_size < 1:
        raise ValueprobeError(f"samples and batch_size must be >= 1, got {samples} and {batch_size}")
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
    axis: ValueAxis | Sequence[ValueAxis],
    prompts: Sequence[Prompt],
    *,
    alphas: Sequence[float] = (0.0,),
    samples: int = 1,
    seed: int = 0,
    max_new_tokens: int = 48,
    min_new_tokens: int = 0,
    greedy: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    unit: Unit | str = Unit.sigma,
    layers: LayerSpec = None,
    site: HookSite | Site | str | None = None,
    positions: Where = "all",
    direction: Tensor | None = None,
    direction_name: str = "axis",
    read_layers: Sequence[int] = (),
    trace: bool = False,
    batch_size: int = 32,
    backend: Backend | str = Backend.hooks,
    source: Callable[[int], AlphaSource] | None = None,
    progress: bool = True,
    op: Operator | str | None = None,
    window: tuple[int, int] | None = None,
    condition: Condition | None = None,
) -> list[Generation]:
    """Generate every (prompt, sample, α) row, batched; rows come back in that nested order.

    Args:
        lm: the loaded model; axis: the axis to steer along (``-axis`` flips it), or several, each
            with its own strength (``[2 * a, -b]``; `valueprobe.steering.hook.handle.steer_plan`).
        prompts: raw strings, or chats (lists of ``{"role", "content"}``) rendered with the template.
        alphas: strengths in ``unit``; samples: samples per (prompt, α).
        seed: base seed; row seeds are `valueprobe.steering.decode.sampling.row_seed(seed, prompt, sample)`.
        max_new_tokens: > 0. min_new_tokens: EOS is blocked before this many (benchmarks: fixed length).
        greedy: argmax decoding (then samples are identical).
        temperature, top_p: sampling settings.
        unit, layers, site, positions, direction, op, window, condition: as in
            `valueprobe.steering.hook.handle.steer`; an ``op`` but ``add``, a site off the residual
            stream, a window or a condition run on the hooks route only.
        direction_name: recorded in each `Generation` (e.g. ``"random-3"``).
        read_layers: also trace the σ-score at these layers (resid_post, after any steering upstream).
        trace: return a per-token `Trace` with each row.
        batch_size: rows per ``generate`` call (memory grows with it, time falls).
        backend: the route that generates (`valueprobe.hooks.route.Route.generate`): ``hooks``, or
            ``nnsight`` (open loop only, no trace: the NDIF route).
        source: closed-loop α (`valueprobe.steering.decode.pid`); given the chunk's row count, returns the
            hook's α source. Hooks route only.

    >>> gens = generate(lm, axis, prompts, alphas=[-50, 0, 50], unit="norm", greedy=True)
    """
    _check_sizes(prompts, alphas, max_new_tokens=max_new_tokens, samples=samples, batch_size=batch_size)
    impl = route(backend)
    check_phase(positions, window, 0)
    first, points = steer_plan(lm, axis, layers=layers, site=site, unit=unit, direction=direction, op=op)
    encoded = encode_prompts(lm, prompts)
    rows = _rows(len(prompts), samples, alphas, seed=seed, greedy=greedy)
    run = _Settings(
        config=_config(lm, max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens),
        temperature=temperature,
        top_p=top_p,
        unit=Unit(unit),
        where=positions,
        direction_name=direction_name,
        read_layers=read_layers,
        trace=trace,
        op=as_operator(op),
        window=window,
        condition=condition,
    )
    out: list[Generation] = []
    with tqdm(total=len(rows), desc="generate", unit="row", disable=not progress) as bar:
        for chunk in _chunks(rows, batch_size):
            alpha_source = None if source is None else source(len(chunk))
            out.extend(_run_chunk(impl, lm, first, points, chunk, encoded, run, alpha_source))
            bar.update(len(chunk))
    return out


def _reads(steering: Steering | None) -> tuple[dict[str, list[Tensor]], list[Tensor]]:
    """A chunk's traces by point name, and the α applied; none when the route ran the steering as data."""
    if steering is None:
        return {}, []
    values, applied = steering.traced()
    return {_point_name(p): v for p, v in values.items()}, applied


def _run_chunk(
    impl: Route,
    lm: LoadedModel,
    axis: ValueAxis,
    plan: Sequence[SteerPoint],
    chunk: list[_Row],
    encoded: list[list[int]],
    run: _Settings,
    source: AlphaSource | None,
) -> list[Generation]:
    """Left pad the chunk, hand it to the route as one `Decode`, and read each row back."""
    ids, mask = pad_rows([encoded[r.prompt] for r in chunk], pad_id=run.config.pad_token_id, side="left")
    processors = LogitsProcessorList()
    if chunk[0].seed is not None:
        seeds = [int(r.seed or 0) for r in chunk]
        processors.append(RowSampler(seeds, temperature=run.temperature, top_p=run.top_p))
    alpha = torch.tensor([r.alpha for r in chunk])
    hooks = Attach(
        partial(
            Steering,
            lm,
            axis,
            plan,
            alpha=alpha,
            where=run.where,
            prompt_length=ids.shape[1],
            trace=run.trace,
            source=source,
            read_layers=run.read_layers,
            op=run.op,
            window=run.window,
            condition=run.condition,
        )
    )
    live = run.trace or bool(run.read_layers) or source is not None
    decode = Decode(
        lm,
        ids,
        mask,
        config=run.config,
        processors=processors,
        additions=plan,
        alpha=alpha,
        where=run.where,
        hooks=hooks,
        live=live,
        beyond=_beyond(run, plan),
    )
    seqs = impl.generate(decode)
    reads, applied = _reads(hooks.handle) if run.trace else (None, [])
    steered = _point_name(plan[0].point)
    return [
        _row_result(
            lm,
            i,
            r,
            seqs[i].cpu(),
            ids.shape[1],
            mask[i],
            run,
            reads,
            applied,
            steered,
        )
        for i, r in enumerate(chunk)
    ]


def _beyond(run: _Settings, plan: Sequence[SteerPoint]) -> str:
    """What the chunk's hooks steer beyond the additions a data-only route takes (empty: nothing)."""
    sites = {str(t.point.site) for t in plan} - {Site.resid_pre.value, Site.resid_post.value}
    why = [
        *([f"--op {run.op.op.value}"] if run.op.op != "add" else []),
        *[f"site {s}" for s in sorted(sites)],
        *(["a window of generated tokens"] if run.window is not None else []),
        *(["a condition"] if run.condition is not None else []),
    ]
    return " with ".join(why)


def _row_result(
    lm: LoadedModel,
    i: int,
    row: _Row,
    seq: Tensor,
    width: int,
    prompt_mask: Tensor,
    run: _Settings,
    reads: dict[str, list[Tensor]] | None,
    applied: list[Tensor],
    steered: str,
) -> Generation:
    new = seq[width:].tolist()
    eos = run.config.eos_token_id
    finished = eos is not None and eos in new
    kept = new[: new.index(eos)] if finished else new
    text = lm.tokenizer.decode(kept, skip_special_tokens=True)
    trace = None
    if reads is not None:
        n_prompt = int(prompt_mask.sum())
        cols = list(range(width - n_prompt, width + len(kept)))
        pieces = [lm.tokenizer.decode([t]) for t in seq[width - n_prompt : width + len(kept)].tolist()]

        def per_token(parts: list[Tensor]) -> tuple[float, ...]:
            full = torch.cat(parts, dim=1)[i] if parts else torch.empty(0)
            return tuple(float(full[c]) if c < full.numel() else float("nan") for c in cols)

        trace = Trace(
            tokens=tuple(pieces),
            n_prompt=n_prompt,
            values={name: per_token(parts) for name, parts in reads.items()},
            alpha=per_token(applied),
            steered=steered,
        )
    return Generation(
        prompt=row.prompt,
        sample=row.sample,
        alpha=row.alpha,
        unit=run.unit.value,
        direction=run.direction_name,
        seed=row.seed,
        text=text,
        token_ids=tuple(kept),
        finished=finished,
        trace=trace,
        op=run.op.describe(),
    )
