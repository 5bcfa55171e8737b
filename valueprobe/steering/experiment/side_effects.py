"""What steering breaks, beside what random directions break: side effects at every strength.

    valueprobe steer --probe probes/smollm2-135m-value --prompts data/steer_open.jsonl --side-effects --out runs/s
    valueprobe replicate steer --out probes/steering-smollm2-135m      # adds the five sets' off-target metrics

    >>> side = measure_side_effects(lm, settings, texts=read_jsonl("data/neutral_text.jsonl"),
    ...                             tasks={"arithmetic": read_tasks("data/task_arithmetic.jsonl")[:12]})
    >>> side.metric("kl").values["axis"]                       # one mean KL per α

For each α of a sweep (`SweepSettings`; α = 0 added when it lacks it) and each of its steered
directions (the axis and the sweep's random directions, all with the same vector length per unit
of α), steering with the sweep's spec whole: its layers, site, unit, operator, phase or window,
condition and read layer, the direction alone replaced (as the sweep steers each direction):

- **kl**: the mean KL(p₀ ‖ p_α) of the next-token distribution from the unsteered model's, in nats
  per token, over the continuation of each paragraph of ``neutral_text/kl`` (its first
  ``PREFIX`` tokens are the "prompt", so ``--positions prompt|generated`` steer as in generation);
- **perplexity**: exp of the mean per-paragraph negative log-likelihood of ``neutral_text/heldout``
  continuations under the steered model;
- **accuracy** on the checkable task sets (``data/task_arithmetic.jsonl``, ``data/task_code.jsonl``),
  greedy, checked by `valueprobe.datasets.answers.check`;
- (in ``replicate steer``) each steering set's target metric, off target for the others.

The axis's figures carry a 95% bootstrap CI over paragraphs or tasks; the random directions give
the null: their central 95% at each α. α = 0 leaves every cell bit for bit, so it is measured once
and shared by all directions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from tqdm.auto import tqdm

from valueprobe.datasets.answers import Task, check
from valueprobe.datasets.io import Example
from valueprobe.errors import ValueprobeError
from valueprobe.hooks.padding import pad_id_for
from valueprobe.model.load import LoadedModel
from valueprobe.records import Record
from valueprobe.stats.null import mean_ci, null_range
from valueprobe.steering.decode.generation import generate
from valueprobe.steering.decode.sampling import Decoding
from valueprobe.steering.experiment.dose import AXIS, RANDOM_PREFIX
from valueprobe.steering.experiment.settings import SweepSettings
from valueprobe.steering.experiment.sweep import sweep_directions
from valueprobe.steering.hook.handle import steer
from valueprobe.steering.hook.spec import SteeringSpec

__all__ = ["PREFIX", "SideEffects", "SideMetric", "measure_side_effects", "text_side_effects"]

PREFIX = 8  # tokens of each neutral paragraph read as its "prompt"; the rest is the continuation


def _alphas(sweep: SweepSettings) -> tuple[float, ...]:
    """The sweep's strengths, α = 0 first when it lacks it (the reference every metric is read against)."""
    return sweep.alphas if 0.0 in sweep.alphas else (0.0, *sweep.alphas)


def _directions(sweep: SweepSettings, n_layers: int) -> list[tuple[str, torch.Tensor | None]]:
    """The sweep's axis and its random directions (not the other axis)."""
    return sweep_directions(sweep, None, n_layers)


def _along(sweep: SweepSettings, name: str, v: torch.Tensor | None) -> SteeringSpec:
    """The sweep's spec along ``v`` (None: the axis's own direction), as the sweep steers it."""
    return replace(sweep.spec, direction=v, direction_name=name)


@dataclass(frozen=True)
class SideMetric(Record):
    """One side-effect metric: its value per α for each direction, the axis's 95% CI per α."""

    name: str
    label: str  # what it is, for tables and figures
    alphas: tuple[float, ...]
    values: dict[str, tuple[float, ...]]  # direction -> one value per α
    axis_ci: tuple[tuple[float, float], ...]
    n: int  # paragraphs or tasks it is a mean over

    def null(self, i: int) -> tuple[float, float]:
        """The random directions' central 95% at the ``i``-th α."""
        return null_range(np.array([v[i] for d, v in self.values.items() if d.startswith(RANDOM_PREFIX)]))


@dataclass(frozen=True)
class SideEffects(Record):
    """Every side-effect metric of one steering setting (see the module doc)."""

    unit: str
    layer: int
    alphas: tuple[float, ...]
    metrics: tuple[SideMetric, ...]

    def metric(self, name: str) -> SideMetric:
        for m in self.metrics:
            if m.name == name:
                return m
        raise ValueprobeError(
            f"no side-effect metric {name!r}; have {', '.join(m.name for m in self.metrics)}"
        )

    def with_metrics(self, more: Sequence[SideMetric]) -> SideEffects:
        return SideEffects(self.unit, self.layer, self.alphas, (*self.metrics, *more))

    def table(self) -> tuple[list[str], list[list[object]]]:
        """One row per (metric, α): the axis with its CI, the random directions' 95% range."""
        headers = ["metric", f"α ({self.unit})", "axis", "95% CI", "random 95% range", "axis outside"]
        rows: list[list[object]] = []
        for m in self.metrics:
            for i, a in enumerate(m.alphas):
                lo, hi = m.null(i)
                v = m.values[AXIS][i]
                outside = "-" if not math.isfinite(lo) or a == 0 else ("yes" if v < lo or v > hi else "no")
                ci = m.axis_ci[i]
                rows.append(
                    [m.label, f"{a:g}", v, f"[{ci[0]:.4g}, {ci[1]:.4g}]", f"[{lo:.4g}, {hi:.4g}]", outside]
                )
        return headers, rows


def _text_batch(lm: LoadedModel, texts: Sequence[Example]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded token ids [texts, T] and mask of plain-text paragraphs (each > PREFIX tokens)."""
    ids = []
    for ex in texts:
        if ex.text is None:
            raise ValueprobeError(
                f"neutral text {ex.id!r} is a chat: side effects read plain text paragraphs"
            )
        got = lm.tokenizer(ex.text, add_special_tokens=True)["input_ids"]
        if len(got) <= PREFIX + 1:
            raise ValueprobeError(
                f"neutral text {ex.id!r} has {len(got)} tokens: give more than {PREFIX + 1}"
            )
        ids.append(list(got))
    width = max(len(r) for r in ids)
    pad = pad_id_for(lm.tokenizer)  # right padding: real tokens keep positions 0..n-1
    tensor = torch.tensor([r + [pad] * (width - len(r)) for r in ids])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in ids])
    return tensor, mask


def _log_probs(
    lm: LoadedModel, spec: SteeringSpec, ids: torch.Tensor, mask: torch.Tensor, alpha: float
) -> torch.Tensor:
    """Next-token log-probabilities [texts, T-1, vocab] at the continuation's predicting positions
    (PREFIX-1 .. T-2), steered by ``alpha`` along ``spec``."""
    with torch.no_grad(), steer(lm, spec, alpha, prompt_length=PREFIX):
        logits = lm.model(input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device)).logits
    return torch.log_softmax(logits[:, PREFIX - 1 : -1].float(), dim=-1).cpu()


def _per_text(values: torch.Tensor, keep: torch.Tensor) -> np.ndarray:
    """Mean of ``values`` [texts, positions] over each text's kept positions."""
    return ((values * keep).sum(dim=1) / keep.sum(dim=1)).double().numpy()


def text_side_effects(
    lm: LoadedModel, sweep: SweepSettings, texts: Sequence[Example], *, progress: bool = True
) -> tuple[SideMetric, SideMetric]:
    """KL on ``neutral_text/kl`` and perplexity on ``neutral_text/heldout`` (see the module doc)."""
    alphas = _alphas(sweep)
    axis_spec = _along(sweep, AXIS, None)
    kl_texts = [t for t in texts if t.group.endswith("/kl")] or list(texts)
    held = [t for t in texts if t.group.endswith("/heldout")] or list(texts)
    (kl_ids, kl_mask), (h_ids, h_mask) = _text_batch(lm, kl_texts), _text_batch(lm, held)
    kl_keep = kl_mask[:, PREFIX:].float()  # a predicting position counts where its next token is real
    h_keep = h_mask[:, PREFIX:].float()
    ref = _log_probs(lm, axis_spec, kl_ids, kl_mask, 0.0)
    targets = h_ids[:, PREFIX:].unsqueeze(-1)
    kl: dict[str, list[np.ndarray]] = {}
    nll: dict[str, list[np.ndarray]] = {}
    zero_nll = _per_text(-_log_probs(lm, axis_spec, h_ids, h_mask, 0.0).gather(-1, targets)[..., 0], h_keep)
    for name, v in tqdm(_directions(sweep, lm.n_layers), desc="side effects: text", disable=not progress):
        spec = _along(sweep, name, v)
        for a in alphas:
            if a == 0:
                kl.setdefault(name, []).append(np.zeros(len(kl_texts)))
                nll.setdefault(name, []).append(zero_nll)
                continue
            lp = _log_probs(lm, spec, kl_ids, kl_mask, a)
            div = (ref.exp() * (ref - lp)).sum(dim=-1)  # KL(p0 || pα) per position
            kl.setdefault(name, []).append(_per_text(div, kl_keep))
            lp_h = _log_probs(lm, spec, h_ids, h_mask, a)
            nll.setdefault(name, []).append(_per_text(-lp_h.gather(-1, targets)[..., 0], h_keep))
    kl_ci = tuple(mean_ci(x) for x in kl[AXIS])
    ppl_ci = tuple((float(np.exp(lo)), float(np.exp(hi))) for lo, hi in (mean_ci(x) for x in nll[AXIS]))
    return (
        SideMetric("kl", "KL from unsteered (nats/token, neutral text)", alphas,
                   {d: tuple(float(x.mean()) for x in xs) for d, xs in kl.items()}, kl_ci, len(kl_texts)),
        SideMetric("perplexity", "perplexity (held-out neutral text)", alphas,
                   {d: tuple(float(np.exp(x.mean())) for x in xs) for d, xs in nll.items()},
                   ppl_ci, len(held)),
    )  # fmt: skip


def task_accuracy(
    lm: LoadedModel,
    sweep: SweepSettings,
    tasks: Sequence[Task],
    *,
    max_new_tokens: int,
    batch_size: int = 32,
    progress: bool = True,
) -> SideMetric:
    """Greedy accuracy on ``tasks`` (one kind) at every α along every direction of ``sweep``."""
    if not tasks:
        raise ValueprobeError("no tasks to measure accuracy on")
    kind = tasks[0].kind
    prompts = [list(t.messages) for t in tasks]

    alphas = _alphas(sweep)
    decoding = Decoding(greedy=True, max_new_tokens=max_new_tokens)

    def run(spec: SteeringSpec, strengths: Sequence[float]) -> list:
        return generate(
            lm, spec, prompts, alphas=strengths, batch_size=batch_size, progress=False, decoding=decoding
        )

    base = run(_along(sweep, AXIS, None), (0.0,))
    right0 = np.array([check(t, g.text).correct for t, g in zip(tasks, base, strict=True)], dtype=float)
    moved = tuple(a for a in alphas if a != 0)
    values: dict[str, tuple[float, ...]] = {}
    axis_ci: list[tuple[float, float]] = []
    directions = _directions(sweep, lm.n_layers)
    for name, v in tqdm(directions, desc=f"side effects: {kind} tasks", disable=not progress):
        gens = run(_along(sweep, name, v), moved) if moved else []
        right = {a: np.zeros(len(tasks)) for a in moved}
        for g in gens:
            right[g.alpha][g.prompt] = float(check(tasks[g.prompt], g.text).correct)
        per = [right0 if a == 0 else right[a] for a in alphas]
        values[name] = tuple(float(x.mean()) for x in per)
        if name == AXIS:
            axis_ci = [mean_ci(x) for x in per]
    label = f"accuracy, {kind} tasks (greedy, {max_new_tokens} new tokens)"
    return SideMetric(f"accuracy_{kind}", label, alphas, values, tuple(axis_ci), len(tasks))


def measure_side_effects(
    lm: LoadedModel,
    sweep: SweepSettings,
    *,
    texts: Sequence[Example],
    tasks: Mapping[str, Sequence[Task]] | None = None,
    max_new_tokens: Mapping[str, int] | None = None,
    batch_size: int = 32,
    progress: bool = True,
) -> SideEffects:
    """KL and perplexity on ``texts``, and accuracy on each kind of ``tasks`` (see the module doc).

    Args:
        sweep: the sweep whose steering is measured: its spec whole, its α (α = 0 first when it
            lacks it), its random directions.
        texts: the rows of ``data/neutral_text.jsonl`` (groups ``neutral_text/kl`` and ``/heldout``).
        tasks: task kind -> tasks (`valueprobe.datasets.answers.read_tasks`); max_new_tokens per kind.
    """  # fmt: skip
    metrics: list[SideMetric] = list(text_side_effects(lm, sweep, texts, progress=progress))
    for kind, chosen in (tasks or {}).items():
        budget = (max_new_tokens or {}).get(kind, 96)
        metrics.append(
            task_accuracy(lm, sweep, chosen, max_new_tokens=budget, batch_size=batch_size, progress=progress)
        )
    spec = sweep.spec
    return SideEffects(spec.unit.value, spec.steered_layers(lm.n_layers)[0], _alphas(sweep), tuple(metrics))
