"""An axis orthogonal to the end of the turn by construction, scored on held-out value contrasts
beside the shipped axes, each with its controls.

    valueprobe replicate orthogonal --out probes/orthogonal-smollm2-135m

Two routes, at each shipped axis's layer:

* **fit on the 2×2** (`valueprobe.audit.turns`, conversations of a seed of their own, rules 0–23):
  the value contrast within each end-of-turn level, (high − low) averaged over near and far, with
  the same data's end-of-turn contrast (near − far) projected out. The tails are identical in every
  arm, so the embedding output cannot separate them: the embedding control of this fit is 0.5 by
  construction;
* **project out**: the shipped axis with that end-of-turn direction removed.

Each is scored, without refitting, on the value contrasts as the shipped figures read them: ICRL
with the rules the fit never saw (the identical final paragraph after a rewarded vs a
never-rewarded history, the ``post`` span), confidence and refusal (last token), code (mean over
the function); and on a held-out 2×2 (another seed), whose value and end-of-turn effects say
whether the construction did what it claims. Every AUROC has a bootstrap CI and stands beside 64
random directions on the same rows. A fit "holds its controls" when its held-out ICRL AUROC has its
CI above 0.5 and lies beyond the random directions, and on the held-out 2×2 its value effect holds
and its end-of-turn effect does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from valueprobe.activations.capture import CaptureSettings, capture
from valueprobe.audit.effects import mean_effect
from valueprobe.audit.reading import Directions, neutral_hidden
from valueprobe.audit.records import Effect
from valueprobe.audit.turns import ARMS, TAIL_LABEL, build_turns
from valueprobe.datasets.icrl import RULE_IDS
from valueprobe.datasets.io import Example, read_jsonl
from valueprobe.model.load import LoadedModel
from valueprobe.probe.axis import ValueAxis
from valueprobe.probe.calibrate import calibrate
from valueprobe.probe.reference import SigmaReference
from valueprobe.records import Record
from valueprobe.stats.metrics import auroc, bootstrap_ci
from valueprobe.stats.null import null_range, percentile_in, random_directions
from valueprobe.vocab import Positions

__all__ = [
    "Contrast",
    "DirectionScore",
    "OrthogonalFit",
    "as_axis",
    "evaluate",
    "fit_routes",
    "value_contrasts",
]

FIT_SEED, HELD_OUT_SEED = 1, 2
ROUTE_ONE = "2×2 value contrast ⊥ end of turn"
ROUTE_TWO = "shipped axis ⊥ end of turn"
END = "end of turn (2×2, near − far)"
FIT_RULES = 24  # the fit's conversations take rules 0..23 (round-robin); ICRL is scored on the rest
FIT_DATA = {
    "name": "the audit's 2×2 (valueprobe.audit.turns.build_turns)",
    "seed": FIT_SEED,
    "conversations": FIT_RULES,
    "rules": "the first 24 of valueprobe.datasets.icrl_rules (round-robin)",
    "positions": "tail tokens, mean per arm",
}


@dataclass(frozen=True)
class Contrast:
    """A held-out value contrast as its shipped figure reads it."""

    name: str
    examples: tuple[Example, ...]
    positions: Positions
    span_labels: tuple[str, ...] | None = None


def _every(examples: Sequence[Example], n: int) -> list[Example]:
    """``n`` rows drawn without replacement by a fixed seed, in file order (a file's groups come in
    blocks and its labels may alternate, so an even stride could take one class only)."""
    pick = np.sort(np.random.default_rng(0).choice(len(examples), min(n, len(examples)), replace=False))
    return [examples[i] for i in pick]


def value_contrasts(*, per_rule: int = 2, n: int = 64) -> list[Contrast]:
    """ICRL with the fit's rules left out (rewarded vs never-rewarded history, identical text),
    confidence, refusal and code."""
    held = set(RULE_IDS[FIT_RULES:])
    icrl = []
    for name in ("icrl", "icrl_control"):
        seen: dict[str, int] = {}
        for ex in read_jsonl(name):
            if ex.meta["rule"] in held and seen.get(ex.meta["rule"], 0) < per_rule:
                seen[ex.meta["rule"]] = seen.get(ex.meta["rule"], 0) + 1
                icrl.append(ex)
    return [
        Contrast("icrl (held-out rules)", tuple(icrl), Positions.spans, ("post",)),
        Contrast("confidence", tuple(_every(read_jsonl("confidence"), n)), Positions.last),
        Contrast("refusal", tuple(_every(read_jsonl("refusal"), n)), Positions.last),
        Contrast("code", tuple(_every(read_jsonl("code"), n)), Positions.mean),
    ]


def _tails(lm: LoadedModel, layers: list[int], *, n: int, seed: int) -> dict[int, np.ndarray]:
    """Mean tail residual [conversations, 4 arms, d_model] of a fresh 2×2, per layer."""
    sets, _ = build_turns(lm, n=n, seed=seed)
    arms = [a for s in sets for a in s.arms]
    res = capture(
        lm, arms, CaptureSettings(layers=layers, positions=Positions.spans, span_labels=[TAIL_LABEL])
    )
    return {layer: res.acts[layer].double().numpy().reshape(len(sets), len(ARMS), -1) for layer in layers}


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def fit_routes(tails: np.ndarray, axis_direction: np.ndarray) -> dict[str, np.ndarray]:
    """The two routes' unit directions from a 2×2's tails [conversations, 4, d_model]."""
    hn, hf, ln, lf = (tails[:, a] for a in range(4))
    end = _unit(((hn + ln - hf - lf) / 2).mean(axis=0))
    value = ((hn + hf - ln - lf) / 2).mean(axis=0)
    axis = np.asarray(axis_direction, dtype=np.float64)
    return {
        ROUTE_ONE: _unit(value - (value @ end) * end),
        ROUTE_TWO: _unit(axis - (axis @ end) * end),
        END: end,
    }


@dataclass(frozen=True)
class DirectionScore(Record):
    """One direction at one layer: AUROC [CI] (random null) per contrast, and its held-out 2×2."""

    name: str
    layer: int
    auroc: dict[str, float]
    ci: dict[str, tuple[float, float]]
    null: dict[str, tuple[float, float]]
    percentile: dict[str, float]
    value_2x2: Effect
    end_2x2: Effect
    cosine_with_axis: float
    holds: bool


@dataclass(frozen=True)
class OrthogonalFit(Record):
    """Every direction scored, and which (if any) holds its controls."""

    model_id: str
    scores: tuple[DirectionScore, ...]
    n_fit: int
    n_held_out: int
    n_random: int

    def table(self) -> tuple[list[str], list[list[str]]]:
        names = list(self.scores[0].auroc)
        headers = [
            "direction",
            "layer",
            *(f"{n} AUROC [CI] (null)" for n in names),
            "2×2 value / end (σ)",
            "holds",
        ]
        rows = []
        for s in self.scores:
            cells = [
                f"{s.auroc[n]:.3f} [{s.ci[n][0]:.3f}, {s.ci[n][1]:.3f}] ({s.null[n][0]:.2f}–{s.null[n][1]:.2f})"
                for n in names
            ]
            both = f"{s.value_2x2.estimate:+.3f} / {s.end_2x2.estimate:+.3f}"
            rows.append([s.name, str(s.layer), *cells, both, "yes" if s.holds else "no"])
        return headers, rows


def _read(
    lm: LoadedModel, contrasts: Sequence[Contrast], layers: list[int]
) -> dict[str, tuple[dict, np.ndarray]]:
    out = {}
    for c in contrasts:
        res = capture(
            lm, c.examples, CaptureSettings(layers=layers, positions=c.positions, span_labels=c.span_labels)
        )
        out[c.name] = ({layer: res.acts[layer].double().numpy() for layer in layers}, res.rows.label)
    return out


def _score(
    name: str,
    v: np.ndarray,
    *,
    axis: np.ndarray,
    layer: int,
    reads: dict,
    held: np.ndarray,
    rand: np.ndarray,
    neutral: np.ndarray,
) -> DirectionScore:
    aurocs, cis, nulls, pct = {}, {}, {}, {}
    for cname, (acts, labels) in reads.items():
        h = acts[layer]
        aurocs[cname] = auroc(h @ v, labels)
        cis[cname] = bootstrap_ci(auroc, h @ v, labels, n_boot=1000, seed=0)
        null = np.array([auroc(h @ r, labels) for r in rand])
        nulls[cname], pct[cname] = null_range(null), percentile_in(aurocs[cname], null)
    matrix = np.vstack([v, rand])
    sigma = (neutral @ matrix.T).std(axis=0)  # each direction in its own neutral σ, as the audit reads
    dirs = Directions(layer, matrix, sigma, len(neutral), axis_sigma=float(sigma[0]), axis_mu=0.0)
    p = dirs.in_reference(held.reshape(-1, held.shape[-1])).reshape(*held.shape[:2], -1)  # [conv, 4, 1 + k]
    hn, hf, ln, lf = (p[:, a] for a in range(4))
    value = mean_effect("2×2 value (held out)", "value", "+", (hn + hf - ln - lf) / 2, dirs=dirs)
    end = mean_effect("2×2 end of turn (held out)", "rival", "±", (hn + ln - hf - lf) / 2, dirs=dirs)
    icrl = next(iter(reads))
    holds = cis[icrl][0] > 0.5 and pct[icrl] > 97.5 and value.holds and not end.holds
    return DirectionScore(
        name=name, layer=layer, auroc=aurocs, ci=cis, null=nulls, percentile=pct, value_2x2=value, end_2x2=end,
        cosine_with_axis=float(v @ axis), holds=bool(holds),
    )  # fmt: skip


def evaluate(
    lm: LoadedModel,
    axes: Sequence[tuple[str, ValueAxis]],
    *,
    n_fit: int = FIT_RULES,
    n_held_out: int = 16,
    n_random: int = 64,
) -> tuple[OrthogonalFit, dict[str, np.ndarray]]:
    """Fit both routes at each axis's best layer and score them beside the axes (see the module doc);
    also returns each axis's route-one direction (the 2×2 fit) by the axis's name."""
    layers = sorted({axis.best_layer for _, axis in axes})
    fit, held = (
        _tails(lm, layers, n=n_fit, seed=FIT_SEED),
        _tails(lm, layers, n=n_held_out, seed=HELD_OUT_SEED),
    )
    reads = _read(lm, value_contrasts(), layers)
    neutral = {
        layer: neutral_hidden(lm, layer=layer, site=axes[0][1].site).astype(np.float64) for layer in layers
    }
    scores, fitted = [], {}
    for name, axis in axes:
        layer = axis.best_layer
        a = axis.direction(layer).double().numpy()
        rand = random_directions(lm.d_model, n_random, seed=layer)
        routes = fit_routes(fit[layer], a)
        fitted[name] = routes[ROUTE_ONE]
        named = {
            name: a,
            f"{ROUTE_ONE} (at {name}'s layer)": routes[ROUTE_ONE],
            f"{name} ⊥ end of turn": routes[ROUTE_TWO],
            f"{END} (at {name}'s layer)": routes[END],
        }
        for shown, v in named.items():
            scores.append(_score(shown, v, axis=a, layer=layer, reads=reads, held=held[layer], rand=rand,
                                 neutral=neutral[layer]))  # fmt: skip
    result = OrthogonalFit(
        model_id=lm.model_id, scores=tuple(scores), n_fit=n_fit, n_held_out=n_held_out, n_random=n_random
    )
    return result, fitted


def as_axis(
    direction: np.ndarray, axis: ValueAxis, lm: LoadedModel, *, method: str, metrics: dict
) -> ValueAxis:
    """``direction`` as a one-layer axis at ``axis``'s best layer, calibrated as every fitted axis is
    (`valueprobe.probe.calibrate`): σ, μ and the mean norm over the one neutral reference."""
    layer = axis.best_layer
    nan = torch.tensor([float("nan")])
    raw = ValueAxis(
        directions=torch.from_numpy(direction).float()[None], layers=(layer,), mu=nan, sigma=nan,
        mean_norm=nan, best_layer=layer, site=axis.site, method=method, model_id=axis.model_id,
        fingerprint=axis.fingerprint, d_model=axis.d_model,
        sigma_reference=SigmaReference(f"uncalibrated ({method})"), metrics=metrics, datasets=(FIT_DATA,),
    )  # fmt: skip
    return calibrate(raw, lm)
