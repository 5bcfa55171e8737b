"""CAA on the seven behaviours: a vector per behaviour from valueprobe's own fitter, steered at
multipliers −1 / 0 / +1, read as A/B probabilities on held-out items beside CAA's 7B figures, the
random-direction null and the prompting baseline.

    valueprobe replicate caa --out probes/caa-smollm2-135m

Per behaviour (`valueprobe.datasets.caa`), items are split once by a seeded shuffle into test,
validation and training items. The vector is CAA's: the difference of means
(`valueprobe.probe.fitters.DiffMeans`) of the residual at the answer letter (the last token of the
assistant's ``(A`` or ``(B``; `valueprobe.activations.capture.capture`) between the answer that
matches the behaviour and the one that does not, at every layer. One layer serves every behaviour,
as CAA's layer 13 does: the one whose vectors move p(match) most between multipliers −1 and +1,
averaged over behaviours, on the validation items. On the test items
(`valueprobe.steering.experiment.ab.ab_match`):

- multipliers −1 / 0 / +1 in CAA's units (the vector's own length) and in σ (the spread of the
  training items' projections on it), the vector added to the answer's tokens as CAA adds it;
- the same for ``controls`` random unit directions (`valueprobe.stats.null.random_directions`) at
  the same lengths: the null;
- prompt conditions stated in ``data/caa/conditions.jsonl`` (CAA's own system prompts asking for
  the behaviour or its opposite; a second wording), each at every multiplier;
- off target: each behaviour's vector on every other behaviour's items, beside random directions
  of its length.

Each behaviour's rows are summarised by `valueprobe.steering.experiment.dose.summarize_rows` (slopes, CIs over
items, the null's range), `valueprobe.steering.experiment.baseline.prompt_baseline` and
`valueprobe.steering.experiment.reliability.item_reliability`. Writes ``results.json`` and ``summary.md``.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from valueprobe.activations.capture import CaptureSettings, capture
from valueprobe.datasets.caa import BEHAVIOURS, CaaItem, read_caa
from valueprobe.datasets.io import Example
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_text, jsonable, markdown_table, write_json
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.probe.fitters import DiffMeans
from valueprobe.probe.reference import SigmaReference
from valueprobe.stats.null import mean_ci, null_range, random_directions
from valueprobe.steering.experiment.ab import Setting, ab_match, caa_spec
from valueprobe.steering.experiment.baseline import prompt_baseline
from valueprobe.steering.experiment.caa_result import MULTIPLIERS, PUBLISHED, CaaBehaviour, CaaReplication
from valueprobe.steering.experiment.dose import AXIS, RANDOM_PREFIX, SteerSweep, SweepRow, summarize_rows
from valueprobe.steering.experiment.prompting import NONE, Goal, PromptCondition, read_conditions
from valueprobe.steering.experiment.reliability import item_reliability
from valueprobe.steering.experiment.side_effects import SideMetric
from valueprobe.vocab import Positions, Site

__all__ = [
    "PUBLISHED",
    "CaaBehaviour",
    "CaaReplication",
    "CaaSizes",
    "fit_caa_vectors",
    "replicate_caa",
    "split_items",
]

METRIC = "p_match"
TARGET = Goal(METRIC, "all", 1)  # the vector points to the matching answer: p(match) should rise


@dataclass(frozen=True)
class CaaSizes:
    """How many items of each behaviour go to each split (fewer when a file has fewer)."""

    test: int = 50
    val: int = 25
    train: int = 100


def split_items(items: Sequence[CaaItem], sizes: CaaSizes, *, seed: int = 0) -> tuple[list[CaaItem], ...]:
    """(test, val, train): a seeded shuffle of ``items`` cut in that order.

    >>> test, val, train = split_items(read_caa("data/caa", "refusal"), CaaSizes())
    """
    order = list(items)
    random.Random(f"caa-split:{order[0].behaviour if order else ''}:{seed}").shuffle(order)
    a, b = sizes.test, sizes.test + sizes.val
    test, val, train = order[:a], order[a:b], order[b : b + sizes.train]
    if not test or not val or not train:  # every training item gives both answers: two classes
        raise ValueprobeError(
            f"too few CAA items ({len(order)}) for {sizes.test} test, {sizes.val} validation and training items"
        )
    return test, val, train


def _chat(item: CaaItem) -> list[dict[str, str]]:
    return [{"role": "user", "content": item.question}]


def _answered(item: CaaItem, letter: str) -> Example:
    messages = ({"role": "user", "content": item.question}, {"role": "assistant", "content": f"({letter}"})
    return Example(id=f"{item.behaviour}-{item.index}-{letter}", label=int(letter == item.matching),
                   group=f"{item.behaviour}-{item.index}", messages=messages)  # fmt: skip


def fit_caa_vectors(
    lm: LoadedModel, behaviour: str, train: Sequence[CaaItem], *, batch_size: int = 8
) -> ValueAxis:
    """The CAA vector of ``behaviour`` at every layer, as an axis: unit directions (DiffMeans over the
    answer letter's residual), μ and σ of the training rows' projections, mean residual norms, and
    the vectors' own lengths in ``metrics["caa_norm"]`` (one per layer)."""
    examples = [_answered(item, x) for item in train for x in ("A", "B")]
    settings = CaptureSettings(layers="all", positions=Positions.last, batch_size=batch_size)
    got = capture(lm, examples, settings, progress=False)
    y = got.rows.label
    layers = sorted(k for k in got.acts if isinstance(k, int))
    units, mus, sigmas, norms, lengths = [], [], [], [], []
    for layer in layers:
        x = got.acts[layer].double().numpy()
        d = DiffMeans().update(x, y).fit()
        proj = x @ d.unit
        units.append(d.unit)
        mus.append(proj.mean())
        sigmas.append(proj.std(ddof=1))
        norms.append(float(np.linalg.norm(x, axis=1).mean()))
        lengths.append(float(np.linalg.norm(d.raw)))
    t = lambda xs: torch.tensor(np.asarray(xs), dtype=torch.float32)  # noqa: E731
    return ValueAxis(
        directions=t(units), layers=tuple(layers), mu=t(mus), sigma=t(sigmas), mean_norm=t(norms),
        best_layer=layers[len(layers) // 2], site=Site.resid_post, method="caa_diff_means", model_id=lm.model_id,
        fingerprint=lm.fingerprint, d_model=lm.d_model,
        sigma_reference=SigmaReference(f"{behaviour}: {len(train)} training items, both answers"),
        metrics={"caa_norm": lengths, "train_items": [i.index for i in train]},
    )  # fmt: skip


def _settings(
    axis: ValueAxis, layer: int, lengths: Sequence[float], random: np.ndarray
) -> list[tuple[str, Setting]]:
    """(direction name, setting) for the axis (None) and each random row at ±each length, and α = 0."""
    out: list[tuple[str, Setting]] = [(AXIS, (caa_spec(axis, layer), 0.0))]
    dirs = [
        (AXIS, None),
        *((f"{RANDOM_PREFIX}{k}", torch.from_numpy(r).float()) for k, r in enumerate(random)),
    ]
    for name, v in dirs:
        spec = caa_spec(axis, layer, v)
        out += [(name, (spec, sign * length)) for length in lengths for sign in (-1.0, 1.0)]
    return out


def _rows(
    items: Sequence[CaaItem],
    named: Sequence[tuple[str, Setting]],
    p: np.ndarray,
    unit_of: Mapping[float, float],
    condition: str,
) -> list[SweepRow]:
    """p(match) [settings, items] as sweep rows: α in the unit ``unit_of`` maps a raw length to."""
    out = []
    for (name, (_, raw)), row in zip(named, p, strict=True):
        sign = float(np.sign(raw))
        key = unit_of.get(abs(raw))
        if raw == 0:
            alpha = 0.0
        elif key is None:
            continue
        else:
            alpha = sign * float(key)
        names = (
            [name] if raw != 0 else [AXIS, *sorted({n for n, _ in named if n != AXIS})]
        )  # α = 0 is every direction's
        out += [SweepRow(f"{it.behaviour}-{it.index}", it.behaviour, alpha, d, 0, None, "", {METRIC: float(v)}, condition)
                for d in names for it, v in zip(items, row, strict=True)]  # fmt: skip
    return out


def choose_layer(
    lm: LoadedModel, axes: Mapping[str, ValueAxis], val: Mapping[str, Sequence[CaaItem]], *, batch_size: int
) -> dict[int, float]:
    """Layer -> mean over behaviours of the validation items' p(match) at +1 − at −1 (CAA units)."""
    effects: dict[int, list[float]] = {}
    for b, axis in axes.items():
        lengths = axis.metrics["caa_norm"]
        settings = [
            (caa_spec(axis, layer), s * lengths[i])
            for i, layer in enumerate(axis.layers)
            for s in (-1.0, 1.0)
        ]
        p = ab_match(
            lm,
            [_chat(i) for i in val[b]],
            [i.matching for i in val[b]],
            settings,
            batch_size=batch_size,
        )
        for i, layer in enumerate(axis.layers):
            effects.setdefault(layer, []).append(float((p[2 * i + 1] - p[2 * i]).mean()))
    return {layer: float(np.mean(v)) for layer, v in effects.items()}


def _p_by_item(items: Sequence[CaaItem], p: np.ndarray) -> dict[str, np.ndarray]:
    return {f"{it.behaviour}-{it.index}": p[:, k] for k, it in enumerate(items)}


def _off_target(
    lm: LoadedModel,
    axes: Mapping[str, ValueAxis],
    b: str,
    items: Sequence[CaaItem],
    layer: int,
    random: np.ndarray,
    batch_size: int,
) -> dict[str, SideMetric]:
    """Every other behaviour's vector on ``b``'s items at −1 / 0 / +1 CAA units, with random
    directions of its length: vector -> the metric of p(match) on ``b``."""  # fmt: skip
    others = [v for v in axes if v != b]
    named: list[tuple[str, str, Setting]] = [("", AXIS, (caa_spec(axes[b], layer), 0.0))]
    for v in others:
        i = axes[v].layers.index(layer)
        length, unit = axes[v].metrics["caa_norm"][i], axes[v].direction(layer)
        dirs = [
            (AXIS, unit),
            *((f"{RANDOM_PREFIX}{k}", torch.from_numpy(r).float()) for k, r in enumerate(random)),
        ]
        named += [(v, d, (caa_spec(axes[b], layer, vec), s * length)) for d, vec in dirs for s in (-1.0, 1.0)]
    p = ab_match(lm, [_chat(i) for i in items], [i.matching for i in items], [s for _, _, s in named],
                 batch_size=batch_size)  # fmt: skip
    base = p[0]
    out = {}
    for v in others:
        values: dict[str, list[float]] = {}
        axis_rows: list[np.ndarray] = []
        for (owner, d, (_, raw)), row in zip(named, p, strict=True):
            if owner == v:
                values.setdefault(d, [np.nan, float(base.mean()), np.nan])[0 if raw < 0 else 2] = float(
                    row.mean()
                )
                if d == AXIS:
                    axis_rows.append(row)
        ci = tuple(mean_ci(x) for x in (axis_rows[0], base, axis_rows[1]))
        out[v] = SideMetric(
            f"on_{b}",
            f"p(match) on {b}",
            MULTIPLIERS,
            {d: tuple(x) for d, x in values.items()},
            ci,
            len(items),
        )
    return out


def _behaviour_rows(
    lm: LoadedModel,
    axis: ValueAxis,
    items: Sequence[CaaItem],
    layer: int,
    random: np.ndarray,
    conditions: Sequence[PromptCondition | None],
    batch_size: int,
) -> tuple[list[SweepRow], list[SweepRow]]:
    """p(match) rows of one behaviour's test items, in CAA units and in σ, under each condition."""  # fmt: skip
    i = axis.layers.index(layer)
    length, sigma = float(axis.metrics["caa_norm"][i]), float(axis.sigma[i])
    named = _settings(axis, layer, [length, sigma], random)
    caa_rows: list[SweepRow] = []
    sigma_rows: list[SweepRow] = []
    for cond in conditions:
        chats = [_chat(it) if cond is None else cond.apply(_chat(it)) for it in items]
        p = ab_match(lm, chats, [it.matching for it in items], [s for _, s in named], batch_size=batch_size)
        name = NONE if cond is None else cond.name
        caa_rows += _rows(items, named, p, {length: 1.0}, name)
        sigma_rows += _rows(items, named, p, {sigma: 1.0}, name)
    return caa_rows, sigma_rows


def _summary(rows: Sequence[SweepRow], unit: str, conditions: Sequence[str], seed: int) -> SteerSweep:
    sweep = summarize_rows(rows, unit=unit, metrics=(METRIC,), seed=seed)
    prompted = {
        c: summarize_rows(rows, unit=unit, metrics=(METRIC,), seed=seed, condition=c).effects
        for c in conditions
    }
    return SteerSweep(unit, sweep.effects, len(rows), prompted=prompted)


def _axes(
    lm: LoadedModel, train: Mapping[str, Sequence[CaaItem]], folder: Path, batch_size: int
) -> dict[str, ValueAxis]:
    """Each behaviour's vectors, fitted once: kept in ``folder/<behaviour>`` with the training items'
    key, refitted when those (or the model) change."""
    axes = {}
    for b, items in train.items():
        key = hashlib.sha256(json.dumps([lm.fingerprint, [i.index for i in items]]).encode()).hexdigest()
        path = folder / b
        if (path / "probe.json").is_file():
            axis = ValueAxis.load(path, lm=lm)
            if axis.metrics.get("key") == key:
                axes[b] = axis
                continue
        axis = fit_caa_vectors(lm, b, items, batch_size=batch_size)
        axis = ValueAxis(**{**axis.__dict__, "metrics": {**axis.metrics, "key": key}})
        axis.save(path)
        axes[b] = axis
    return axes


def replicate_caa(
    lm: LoadedModel,
    *,
    data_dir: Path,
    runs_dir: Path,
    out: Path,
    behaviours: Sequence[str] = BEHAVIOURS,
    sizes: CaaSizes = CaaSizes(),
    controls: int = 8,
    conditions: Sequence[str] = ("toward", "away", "reworded"),
    seed: int = 0,
    batch_size: int = 16,
    progress: bool = True,
) -> CaaReplication:
    """Run the module doc's experiment and write ``results.json`` and ``summary.md`` into ``out``.

    Args:
        data_dir: holds ``<behaviour>.json`` and ``conditions.jsonl`` (``data/caa``).
        runs_dir: where the fitted vectors are kept between runs.
        sizes: test, validation and training items per behaviour; controls: random directions.
        conditions: prompt conditions stated in ``data_dir/conditions.jsonl``.
    """  # fmt: skip
    splits = {b: split_items(read_caa(data_dir, b), sizes, seed=seed) for b in behaviours}
    conds = {b: (None, *read_conditions(data_dir / "conditions.jsonl", b, conditions)) for b in behaviours}
    # three stages: fit every vector, choose the layer on validation, then each behaviour's test items
    bar = tqdm(total=2 + len(behaviours), desc="CAA: fitting vectors", unit="stage", disable=not progress)
    axes = _axes(lm, {b: s[2] for b, s in splits.items()}, runs_dir / "axes", batch_size)
    bar.set_description("CAA: choosing the layer")
    bar.update()
    validation = choose_layer(lm, axes, {b: s[1] for b, s in splits.items()}, batch_size=batch_size)
    bar.update()
    layer = max(validation, key=lambda x: validation[x])
    random = random_directions(lm.d_model, controls, seed=seed)
    off: dict[str, list[SideMetric]] = {b: [] for b in behaviours}
    results = {}
    for b in behaviours:
        bar.set_description(f"CAA: {b}, test items")
        test = splits[b][0]
        caa_rows, sigma_rows = _behaviour_rows(lm, axes[b], test, layer, random, conds[b], batch_size)
        for v, metric in _off_target(lm, axes, b, test, layer, random, batch_size).items():
            off[v].append(metric)
        i = axes[b].layers.index(layer)
        caa = _summary(caa_rows, "caa", conditions, seed)
        results[b] = CaaBehaviour(b, float(axes[b].metrics["caa_norm"][i]), float(axes[b].sigma[i]), len(splits[b][2]),
                                  caa, _summary(sigma_rows, "sigma", conditions, seed), prompt_baseline(caa, TARGET),
                                  item_reliability(caa_rows, TARGET), ())  # fmt: skip
        bar.update()
    bar.close()
    final = {b: CaaBehaviour(**{**r.__dict__, "off_target": tuple(off[b])}) for b, r in results.items()}
    rep = CaaReplication(
        model=lm.model_id,
        layer=layer,
        validation=validation,
        controls=controls,
        n_test=sizes.test,
        behaviours=final,
    )
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", jsonable(rep.to_dict()), allow_nan=False)
    atomic_write_text(out / "summary.md", caa_markdown(rep))
    return rep


def _three(xs: Sequence[float]) -> str:
    return " / ".join("-" if not np.isfinite(x) else f"{x:.2f}" for x in xs)


def caa_table(rep: CaaReplication) -> tuple[list[str], list[list[object]]]:
    """One row per behaviour: CAA's 7B figures beside these, the slope against the null, σ units,
    and the prompting baseline."""
    headers = ["behaviour", "CAA 7B −1/0/+1", "here −1/0/+1 (CAA units)", "slope [95% CI]", "random slopes (95%)",
               "outside null", "here −1/0/+1 σ", "prompt toward/away, α=0", "CAA 7B prompt pos/neg", "steering vs asking"]  # fmt: skip
    rows: list[list[object]] = []
    for b, r in rep.behaviours.items():
        e = r.caa.effects[0]
        published, prompts = PUBLISHED.get(b, ((np.nan,) * 3, None))
        towards = [r.means(r.caa, c)[1] for c in ("toward", "away")]
        rows.append([b, _three(published), _three(r.means(r.caa)), f"{e.axis.slope:+.3f} [{e.axis.ci[0]:+.3f}, {e.axis.ci[1]:+.3f}]",
                     f"[{e.null_range[0]:+.3f}, {e.null_range[1]:+.3f}]", {True: "yes", False: "no", None: "-"}[e.outside],
                     _three(r.means(r.sigma_units)), _three(towards), "-" if prompts is None else _three(prompts),
                     r.baseline[0].verdict if r.baseline else "-"])  # fmt: skip
    return headers, rows


def off_target_table(rep: CaaReplication) -> tuple[list[str], list[list[object]]]:
    """One row per (vector, other behaviour's items): p(match) at +1 − at −1 against random directions."""
    headers = ["vector", "items of", "+1 − (−1)", "random 95%", "outside null"]
    rows: list[list[object]] = []
    for b, r in rep.behaviours.items():
        for m in r.off_target:
            move = {d: v[2] - v[0] for d, v in m.values.items()}
            lo, hi = null_range(np.array([x for d, x in move.items() if d.startswith(RANDOM_PREFIX)]))
            rows.append([b, m.name.removeprefix("on_"), move[AXIS], f"[{lo:+.3f}, {hi:+.3f}]",
                         "yes" if not lo <= move[AXIS] <= hi else "no"])  # fmt: skip
    return headers, rows


def reliability_rows(rep: CaaReplication) -> tuple[list[str], list[list[object]]]:
    headers = [
        "behaviour",
        "items",
        "with",
        "against",
        "random: against",
        "reworded − plain slope [CI]",
        "sign flips",
        "rank corr.",
    ]
    rows: list[list[object]] = []
    for b, r in rep.behaviours.items():
        x, sh = r.reliability, r.reliability.shift
        rows.append([b, x.n_items, f"{x.with_:.0%}", f"{x.against:.0%}", f"[{x.null_against[0]:.0%}, {x.null_against[1]:.0%}]",
                     "-" if sh is None else f"{sh.change:+.3f} [{sh.change_ci[0]:+.3f}, {sh.change_ci[1]:+.3f}]",
                     "-" if sh is None else f"{sh.sign_flips:.0%}", "-" if sh is None else f"{sh.rank_correlation:+.2f}"])  # fmt: skip
    return headers, rows


def caa_markdown(rep: CaaReplication) -> str:
    """``summary.md``: the tables with what they mean."""
    fmt = lambda v: f"{v:+.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    best = sorted(rep.validation.items(), key=lambda kv: -kv[1])[:3]
    lines = [
        f"# CAA's seven behaviours on {rep.model}", "",
        f"Vectors: difference of means at the answer letter (valueprobe's DiffMeans), one per layer; layer"
        f" {rep.layer} chosen on validation items (mean p(match) at +1 − at −1 over behaviours; best three:"
        f" {', '.join(f'{layer}: {v:+.3f}' for layer, v in best)}). Test: {rep.n_test} held-out items per behaviour;"
        f" p(match) = P(matching letter) / (P(A) + P(B)) after the assistant's '(', the vector added to that"
        f" token as CAA adds it. Null: {rep.controls} random unit directions at the same lengths. CAA 7B:"
        " Llama-2-7b-chat at layer 13 (nrimsky/CAA analysis files). Slopes are OLS per multiplier with 95%"
        " bootstrap CIs over items.", "",
        *markdown_table(*caa_table(rep), fmt), "",
        "## Per-item reliability", "",
        "Items whose p(match) falls as the multiplier rises (against), beside random directions; the prompt"
        " shift rewords every question (data/caa/conditions.jsonl).", "",
        *markdown_table(*reliability_rows(rep), fmt), "",
        "## Off target: each vector on the other behaviours' items", "",
        *markdown_table(*off_target_table(rep), fmt),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"
