"""Read the value axis: the paper's val(s), σ-unit scores, dataset scoring, and the logit lens.

``valueprobe score --probe probes/value --model smollm2-135m --data data/code.jsonl --out runs/score``
calls :func:`score_dataset`::

    from valueprobe.read.readout import score_dataset, val
    res = score_dataset(axis, lm, examples, ScoreSettings(bootstrap=1000))
    res.write("runs/score")            # scores.csv + summary.json
    val(h_tokens, axis.direction(18))  # mean over tokens of cos(h_t, v)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from valueprobe.activations.capture import run_encoded
from valueprobe.activations.encode import encode
from valueprobe.datasets.io import Example, linked_groups
from valueprobe.errors import ValueprobeError
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ProbeRef, ValueAxis
from valueprobe.read.scores import ScoreResult
from valueprobe.records import Record
from valueprobe.stats.metrics import auroc, bootstrap_ci, cohens_d
from valueprobe.stats.null import direction_null, random_directions
from valueprobe.vocab import ChatTemplate, PaddingSide, Positions, Tokens, choice


def token_cos(h_tokens: torch.Tensor | np.ndarray, v: torch.Tensor | np.ndarray) -> np.ndarray:
    """cos(h_t, v) for each token: h_tokens [pos, d_model], v [d_model] -> [pos] float64."""
    h = np.asarray(h_tokens, dtype=np.float64).reshape(-1, np.shape(v)[-1])
    v = np.asarray(v, dtype=np.float64)
    norms = np.linalg.norm(h, axis=1) * np.linalg.norm(v)
    return np.divide(h @ v, norms, out=np.zeros(len(h)), where=norms > 0)  # a zero residual has cos 0


def val(h_tokens: torch.Tensor | np.ndarray, v: torch.Tensor | np.ndarray) -> float:
    """The paper's readout val(s): the mean over the tokens of s of cos(h_t, v).

    >>> val(np.array([[1.0, 0.0], [1.0, 1.0]]), np.array([1.0, 0.0]))  # (1 + 0.707) / 2
    0.853...
    """
    cos = token_cos(h_tokens, v)
    if cos.size == 0:
        raise ValueprobeError("val(s) of an empty token sequence is undefined; select at least one token")
    return float(cos.mean())


_METRICS = {"auroc": auroc, "cohens_d": cohens_d}


def _with_partners(sel: list[dict], scored: list[dict], pair_key: dict[str, str]) -> tuple[list[dict], str]:
    """A one-class group (e.g. ``code/shuffled``) is contrasted with the opposite-class rows it is
    paired with through ``meta.pair`` (its originals); failing that, with every opposite-class row."""
    labels = {r["label"] >= 0.5 for r in sel}
    if len(labels) != 1:
        return sel, "within group"
    (side,) = labels
    keys = {pair_key[r["id"]] for r in sel}
    others = [r for r in scored if (r["label"] >= 0.5) != side]
    partners = [r for r in others if pair_key[r["id"]] in keys]
    if partners:
        return sel + partners, "vs paired opposite-class rows (meta.pair)"
    return sel + others, "vs all opposite-class rows"


def _group_metrics(
    name: str,
    vals: np.ndarray,
    scores: np.ndarray,
    labels: np.ndarray,
    length: np.ndarray,
    *,
    bootstrap: int,
    seed: int,
) -> dict:
    y = labels >= 0.5
    row: dict = {"group": name, "n": int(len(y)), "n_pos": int(y.sum())}
    if y.all() or not y.any():
        return row  # one class: no AUROC, reported as n/a
    for readout, x in (("val", vals), ("score", scores)):
        if not np.isfinite(x).all():
            continue  # score without σ calibration
        for metric, fn in _METRICS.items():
            row[f"{readout}_{metric}"] = fn(x, y)
            if bootstrap:
                row[f"{readout}_{metric}_ci"] = list(bootstrap_ci(fn, x, y, n_boot=bootstrap, seed=seed))
    a = auroc(length, y)
    row["length_auroc"] = max(a, 1 - a)
    return row


@dataclass(frozen=True)
class Readouts:
    """The projection step of :func:`score_dataset`: one entry per captured row (token or example)."""

    example_id: list[str]
    cos: np.ndarray  # [rows] cos(h, v̂)
    proj: np.ndarray  # [rows] h @ v̂
    n_tokens: np.ndarray  # [rows] the example's sequence length
    random: np.ndarray | None = None  # [rows, k] projections on the null's random directions, if asked


def read_examples(
    axis: ValueAxis,
    lm: LoadedModel,
    examples: Sequence[Example],
    *,
    layer: int,
    tokens: Tokens,
    batch_size: int = 8,
    max_length: int | None = None,
    chat_template: ChatTemplate = ChatTemplate.model,
    random_dirs: np.ndarray | None = None,
    progress: bool = True,
) -> Readouts:
    """Capture ``tokens`` of every example at ``layer`` and project them on the axis.

    Every example is checked (and warned about) first; then the examples stream in chunks, so
    only one chunk's token activations (one layer) are held at a time. ``random_dirs`` [k, d_model]
    are projected on the same rows, for the random-direction null.
    """
    v = axis.direction(layer).double().numpy()
    positions = Positions(tokens)
    encode(lm, examples, positions=positions, max_length=max_length, chat_template=chat_template)
    cos, proj, ids, n_tokens, random = [], [], [], [], []
    chunk = 32 * batch_size
    with tqdm(total=len(examples), desc="score", unit="ex", disable=not progress) as bar:
        for start in range(0, len(examples), chunk):
            part = encode(
                lm,
                examples[start : start + chunk],
                positions=positions,
                max_length=max_length,
                chat_template=chat_template,
                warn=False,
            )
            res = run_encoded(
                lm,
                part,
                layers=[layer],
                site=axis.site,
                include_embed=False,
                batch_size=batch_size,
                padding_side=PaddingSide.right,
                on_batch=bar.update,
            )
            h = res.acts[layer].double().numpy()  # [rows, d_model]
            cos.append(token_cos(h, v))
            proj.append(axis.project(h, layer))
            if random_dirs is not None:
                random.append(h @ random_dirs.T)
            ids.extend(res.rows.example_id)
            n_tokens.append(res.rows.n_tokens)
    rand = np.concatenate(random) if random else None
    return Readouts(ids, np.concatenate(cos), np.concatenate(proj), np.concatenate(n_tokens), rand)


def per_example(
    axis: ValueAxis, examples: Sequence[Example], readouts: Readouts, *, layer: int
) -> list[dict]:
    """The aggregation step: per example, val(s) (mean cos over its rows) and the σ-score of its mean
    projection (NaN when the axis has no σ at ``layer``, or the example no row)."""
    by_id: dict[str, list[int]] = {}
    for row, ex_id in enumerate(readouts.example_id):
        by_id.setdefault(ex_id, []).append(row)
    seq_len = dict(zip(readouts.example_id, readouts.n_tokens.tolist(), strict=True))
    calibrated = axis.calibrated(layer)
    records = []
    for ex in examples:
        rows = by_id.get(ex.id, [])
        records.append(
            {
                "id": ex.id,
                "group": ex.group,
                "label": float(ex.label),
                "val": float(readouts.cos[rows].mean()) if rows else float("nan"),
                "score": float(axis.standardize(readouts.proj[rows].mean(), layer))
                if rows and calibrated
                else float("nan"),
                "n_readout_tokens": len(rows),
                "n_tokens": int(seq_len.get(ex.id, 0)),
            }
        )
    return records


def _mean_by_example(readouts: Readouts) -> dict[str, np.ndarray] | None:
    """Each example's mean projection on the null directions [k], or None without a null."""
    if readouts.random is None:
        return None
    rows: dict[str, list[int]] = {}
    for row, ex_id in enumerate(readouts.example_id):
        rows.setdefault(ex_id, []).append(row)
    return {ex_id: readouts.random[r].mean(0) for ex_id, r in rows.items()}


def group_summary(
    records: Sequence[dict],
    examples: Sequence[Example],
    *,
    bootstrap: int,
    seed: int,
    random: dict[str, np.ndarray] | None = None,
) -> list[dict]:
    """The metrics step: AUROC / Cohen's d of val and score, per group and for ``all``.

    ``random`` maps an example id to its mean projection on each null direction [k]; each group then
    gets the directions' AUROC and d ranges and the axis's percentile among them.
    """
    scored = [r for r in records if r["n_readout_tokens"]]
    groups: list[str] = ["all", *sorted({str(r["group"]) for r in scored})]
    pair_key = linked_groups(examples, "pair")
    summary = []
    for g in groups:
        sel = [r for r in scored if g == "all" or r["group"] == g]
        sel, contrast = _with_partners(sel, scored, pair_key)
        metrics = _group_metrics(
            g,
            np.array([r["val"] for r in sel]),
            np.array([r["score"] for r in sel]),
            np.array([r["label"] for r in sel]),
            np.array([r["n_tokens"] for r in sel], dtype=np.float64),
            bootstrap=bootstrap,
            seed=seed,
        )
        if random and "score_auroc" in metrics:
            P = np.stack([random[str(r["id"])] for r in sel])  # [n, k]: the same mean over tokens
            labels = np.array([r["label"] for r in sel])
            metrics |= direction_null(
                P, labels, auroc_axis=metrics["score_auroc"], d_axis=metrics["score_cohens_d"]
            )
        summary.append({**metrics, "contrast": contrast})
    return summary


@dataclass(frozen=True)
class ScoreSettings:
    """The options of one score (`score_dataset`), shared by every part of a sharded one.

    Attributes:
        layer: axis layer to read (default: its best layer).
        tokens: which tokens make up s: ``all`` tokens of the example, the tokens inside its
            spans (``span_tokens``), or the ``last`` token.
        batch_size: examples per forward.
        bootstrap: resamples for the 95% CIs (0 to skip); seed: theirs and the null's.
        null: random unit directions read at the same layer and tokens (0 to skip; ≥ 32 to use):
            each group gets their AUROC and d ranges and the axis's percentile among them.
        force: read a probe of another architecture (d_model is always checked); a fine-tune of the
            probe's model only warns.
        max_length: truncate longer texts (with a warning); without it, a text over the model's
            context is an error naming the example.
        chat_template: ``model`` or ``plain`` (a transcript, for base models without a template).
    """

    layer: int | None = None
    tokens: Tokens = Tokens.all
    batch_size: int = 8
    bootstrap: int = 1000
    seed: int = 0
    null: int = 0
    force: bool = False
    max_length: int | None = None
    chat_template: ChatTemplate = ChatTemplate.model


def score_dataset(
    axis: ValueAxis,
    lm: LoadedModel,
    examples: Sequence[Example],
    settings: ScoreSettings = ScoreSettings(),
    *,
    progress: bool = True,
) -> ScoreResult:
    """Per-example val(s) and σ-score of ``axis`` on ``examples``, with per-group AUROC / Cohen's d.

    Three steps: :func:`read_examples` (capture and project), :func:`per_example` (aggregate),
    :func:`group_summary` (metrics). ``settings`` says which layer and tokens, and the bootstrap,
    null, truncation and chat template (`ScoreSettings`).

    >>> res = score_dataset(ValueAxis.load("probes/value", lm=lm), lm, read_jsonl("data/code.jsonl"))
    >>> res = score_dataset(axis, lm, examples, ScoreSettings(layer=12, null=32))
    """
    layer, tokens, records, random = read_scored(axis, lm, examples, settings, progress=progress)
    return summarize_scores(
        axis.ref(layer),
        records,
        examples,
        layer=layer,
        tokens=tokens,
        bootstrap=settings.bootstrap,
        seed=settings.seed,
        random=random,
    )


def read_scored(
    axis: ValueAxis, lm: LoadedModel, examples: Sequence[Example], settings: ScoreSettings, *, progress: bool
) -> tuple[int, Tokens, list[dict], dict[str, np.ndarray] | None]:
    """The layer and tokens ``settings`` resolve to, each example's records and null means: what
    `score_dataset` summarises, and what a score part (`valueprobe.read.score_parts`) keeps."""
    s = settings
    tokens = choice(Tokens, s.tokens, what="tokens")
    layer = axis.best_layer if s.layer is None else s.layer
    records, random = read_records(
        axis,
        lm,
        examples,
        layer=layer,
        tokens=tokens,
        batch_size=s.batch_size,
        null=s.null,
        seed=s.seed,
        force=s.force,
        max_length=s.max_length,
        chat_template=s.chat_template,
        progress=progress,
    )
    return layer, tokens, records, random


def read_records(
    axis: ValueAxis,
    lm: LoadedModel,
    examples: Sequence[Example],
    *,
    layer: int,
    tokens: Tokens,
    batch_size: int,
    null: int,
    seed: int,
    force: bool,
    max_length: int | None,
    chat_template: ChatTemplate,
    progress: bool,
) -> tuple[list[dict], dict[str, np.ndarray] | None]:
    """The per-example part of :func:`score_dataset`: its records, and each example's mean
    projection on the ``null`` random directions (None without a null). Depends on nothing but the
    example itself, so a sharded score reads each shard's examples alone."""
    axis.check(lm, force=force)
    readouts = read_examples(
        axis,
        lm,
        examples,
        layer=layer,
        tokens=tokens,
        batch_size=batch_size,
        max_length=max_length,
        chat_template=chat_template,
        random_dirs=random_directions(lm.d_model, null, seed=seed) if null else None,
        progress=progress,
    )
    return per_example(axis, examples, readouts, layer=layer), _mean_by_example(readouts)


def axis_record(axis: ValueAxis, layer: int) -> dict:
    """The probe as ``summary.json`` (and a score part) records it: `ValueAxis.ref` as JSON."""
    return axis.ref(layer).to_dict()


def summarize_scores(
    probe: ProbeRef | Mapping[str, Any],
    records: Sequence[dict],
    examples: Sequence[Example],
    *,
    layer: int,
    tokens: Tokens,
    bootstrap: int,
    seed: int,
    random: dict[str, np.ndarray] | None,
) -> ScoreResult:
    """The per-group step of :func:`score_dataset` over every example's records."""
    if not any(r["n_readout_tokens"] for r in records):
        raise ValueprobeError(f"no example had any {str(tokens)!r} tokens to read; use tokens='all'")
    summary = group_summary(records, examples, bootstrap=bootstrap, seed=seed, random=random)
    ref = probe if isinstance(probe, ProbeRef) else ProbeRef.from_dict(probe)
    return ScoreResult(tuple(records), tuple(summary), ref, layer, tokens)


@dataclass(frozen=True)
class LogitLens(Record):
    """What :func:`logit_lens` returns, as a record: the layer, and (token, logit) pairs, most extreme first."""

    layer: int
    promoted: tuple[tuple[str, float], ...]
    suppressed: tuple[tuple[str, float], ...]


@torch.no_grad()
def logit_lens(
    axis: ValueAxis, lm: LoadedModel, *, layer: int | None = None, k: int = 20, force: bool = False
) -> dict:
    """Tokens the direction promotes and suppresses through the final norm and the unembedding.

    The unit direction is first scaled to the layer's mean residual norm, so the final norm
    (RMSNorm/LayerNorm: nearly scale-invariant, but its epsilon is not) sees a residual-sized
    input; the unembedding bias, if any, is subtracted so only the direction's effect ranks tokens.

    Returns ``{"layer", "promoted": [(token, logit), ...], "suppressed": [...]}``, most extreme first.

    >>> logit_lens(axis, lm, k=10)["promoted"][:3]
    """
    axis.check(lm, force=force)
    layer = axis.best_layer if layer is None else layer
    norm = float(axis.mean_norm[axis.layers.index(layer)])
    if not (math.isfinite(norm) and norm > 0):
        norm = math.sqrt(axis.d_model)  # a unit-RMS residual
    param = next(lm.unembed.parameters())
    x = (axis.direction(layer) * norm).to(device=param.device, dtype=param.dtype)[
        None, None
    ]  # [1, 1, d_model]
    if lm.final_norm is not None:
        x = lm.final_norm(x)
    logits = (lm.unembed(x) - lm.unembed(torch.zeros_like(x)))[0, 0].float().cpu()  # [vocab]
    k = min(k, logits.numel())
    top, bottom = torch.topk(logits, k), torch.topk(-logits, k)

    def decode(ids: torch.Tensor, vals: torch.Tensor) -> list[tuple[str, float]]:
        decode_one = lm.tokenizer.decode
        return [(decode_one([int(i)]), float(v)) for i, v in zip(ids, vals, strict=True)]

    return {
        "layer": layer,
        "promoted": decode(top.indices, top.values),
        "suppressed": decode(bottom.indices, -bottom.values),
    }
