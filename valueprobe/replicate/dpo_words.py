"""The paper's preference experiment on CPU: DPO a model toward (or away from) one word, read the axis.

    valueprobe replicate dpo-words --model smollm2-135m --k 6 --avoid 2 --out probes/dpo-words-smollm2-135m

For each of ``k`` target words a LoRA DPO model is trained on that word's pairs
(``data/preference_words.jsonl``, chosen = the word); ``avoid`` more models get the same pairs
flipped (the word is always rejected). On the held-out prompts (``preference_words_eval.jsonl``:
unseen wordings and distractors) before and after tuning it measures:

- selection accuracy: the model's most likely answer (total log-probability of each option as the
  whole assistant answer) is the target. Chance = mean of 1 / number of options;
- axis ranking: the share of trials where the axis ranks the target highest among the options,
  each read on the item's tokens as the assistant's answer (same chance);
- the target's and the control words' (the other options) change in σ, and the same on natural
  sentences that mention the target or a control word (preferred − control delta);

for each shipped axis at its best layer and for ``n_random`` random unit directions at the same
layer (the null). CIs: bootstrap over models, then prompts within each model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go

from valueprobe.datasets.io import Example, read_jsonl
from valueprobe.datasets.preference import TARGETS
from valueprobe.files import write_html, write_summary
from valueprobe.model.adapter import TUNE_FILE
from valueprobe.model.load import LoadedModel, load
from valueprobe.probe.axis import ValueAxis
from valueprobe.read.preference import (
    LayerDirection,
    calibrate_nulls,
    ci,
    directions_for,
    hier_boot,
    item_example,
    most_likely_option,
    read_items,
)
from valueprobe.records import Record
from valueprobe.tune.pairs import data_record, read_pairs
from valueprobe.tune.train import TuneRecord, TuneSettings, train

__all__ = ["SENTENCES", "WordsReport", "replicate_dpo_words"]

SENTENCES: tuple[str, ...] = (
    "Yesterday I saw a {w} on my way home.",
    "She wrote a short story about a {w}.",
    "There was a picture of a {w} on the wall.",
    "My friend asked me what a {w} looks like.",
    "We talked about the {w} for a while.",
)


@dataclass(frozen=True)
class WordsReport(Record):
    """Per model and pooled results of :func:`replicate_dpo_words` (``results.json``: its fields)."""

    summary: dict[str, Any]
    models: list[dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)

    def table(self) -> tuple[list[str], list[list[object]]]:
        rows: list[list[object]] = []
        for kind in ("prefer", "avoid"):
            s = self.summary.get(kind)
            if not s:
                continue
            acc = s["selection_accuracy"]
            rows.append(
                [
                    kind,
                    "selection accuracy",
                    _fmt(acc["before"]),
                    _fmt(acc["after"]),
                    f"chance {s['chance']:.3f}",
                ]
            )
            for name, a in s["axes"].items():
                rows.append(
                    [
                        kind,
                        f"{name}: target ranked top",
                        _fmt(a["top_before"]),
                        _fmt(a["top_after"]),
                        f"null Δ {_rng(a['null_top_change'])}",
                    ]
                )
                rows.append(
                    [
                        kind,
                        f"{name}: Δσ target − control (items)",
                        "",
                        _fmt(a["item_delta"]),
                        f"null {_rng(a['null_item_delta'])}",
                    ]
                )
                rows.append(
                    [
                        kind,
                        f"{name}: Δσ target / control (sentences)",
                        _fmt(a["sent_target"]),
                        _fmt(a["sent_control"]),
                        f"Δ {_fmt(a['sent_delta'])}, null {_rng(a['null_sent_delta'])}",
                    ]
                )
        return ["models", "measure", "before", "after", "reference"], rows

    def figure(self) -> Any:
        fig = go.Figure()
        for kind in ("prefer", "avoid"):
            for name, a in self.summary.get(kind, {}).get("axes", {}).items():
                for when in ("before", "after"):
                    p, lo, hi = a[f"top_{when}"]
                    fig.add_bar(
                        name=f"{kind} · {name} · {when}",
                        x=[f"{kind} · {name}"],
                        y=[p],
                        error_y={
                            "type": "data",
                            "symmetric": False,
                            "array": [hi - p],
                            "arrayminus": [p - lo],
                        },
                    )
        chance = self.summary.get("prefer", {}).get("chance")
        if chance:
            fig.add_hline(y=chance, line_dash="dot", annotation_text="chance")
        fig.update_layout(
            title="Share of held-out trials where the axis ranks the target highest (95% CI)",
            barmode="group",
            yaxis_title="share",
        )
        return fig


def _fmt(t: Any) -> str:
    return f"{t[0]:.3f} [{t[1]:.3f}, {t[2]:.3f}]" if isinstance(t, list | tuple) else f"{t:.3f}"


def _rng(d: Mapping[str, float]) -> str:
    return f"[{d['lo']:+.3f}, {d['hi']:+.3f}]"


def _items(evals: list[Example]) -> list[Example]:
    out = []
    for e in evals:
        for o in e.meta["options"]:
            out.append(
                item_example(
                    f"{e.id}|{o}",
                    e.messages or (),
                    o,
                    o,
                    group=e.group,
                    label=int(o == e.meta["target"]),
                    meta={"prompt": e.id, "option": o, "target": e.meta["target"]},
                )
            )
    return out


def _sentences(words: list[str]) -> list[Example]:
    msgs = ({"role": "user", "content": "Write one sentence."},)
    return [
        item_example(f"s{i}|{w}", msgs, t.format(w=w), w, meta={"word": w})
        for w in words
        for i, t in enumerate(SENTENCES)
    ]


def _measure(
    lm: LoadedModel,
    evals: list[Example],
    items: list[Example],
    sents: list[Example],
    dirs: list[LayerDirection],
) -> dict[str, Any]:
    """Choices, item scores and sentence scores of one model."""
    scores, _ = read_items(lm, items, dirs)
    sent_scores, _ = read_items(lm, sents, dirs)
    picks = {
        e.id: e.meta["options"][most_likely_option(lm, e.messages or (), e.meta["options"])] for e in evals
    }
    return {"scores": scores, "sent_scores": sent_scores, "picks": picks}


def _model_stats(
    target: str,
    evals: list[Example],
    items: list[Example],
    sents: list[Example],
    before: dict,
    after: dict,
    dirs: list[LayerDirection],
) -> dict[str, Any]:
    """Per-prompt arrays for one tuned model against the base."""
    mine = [e for e in evals if e.meta["target"] == target]
    idx = {it.id: i for i, it in enumerate(items)}
    sidx = [i for i, s in enumerate(sents) if s.meta["word"] == target]
    cidx = [i for i, s in enumerate(sents) if s.meta["word"] != target]
    out: dict[str, Any] = {
        "target": target,
        "prompts": [e.id for e in mine],
        "chance": [1 / len(e.meta["options"]) for e in mine],
        "picked_before": [before["picks"][e.id] == target for e in mine],
        "picked_after": [after["picks"][e.id] == target for e in mine],
        "dirs": {},
    }
    for d in dirs:
        top_b, top_a, item_delta = [], [], []
        for e in mine:
            rows = [idx[f"{e.id}|{o}"] for o in e.meta["options"]]
            t = rows[e.meta["options"].index(target)]
            b, a = before["scores"][d.name], after["scores"][d.name]
            top_b.append(float(np.argmax(b[rows]) == rows.index(t)))
            top_a.append(float(np.argmax(a[rows]) == rows.index(t)))
            ctrl = [r for r in rows if r != t]
            item_delta.append(float((a[t] - b[t]) - np.mean(a[ctrl] - b[ctrl])))
        sb, sa = before["sent_scores"][d.name], after["sent_scores"][d.name]
        out["dirs"][d.name] = {
            "top_before": top_b,
            "top_after": top_a,
            "item_delta": item_delta,
            "sent_target": (sa[sidx] - sb[sidx]).tolist(),
            "sent_control": float(np.mean(sa[cidx] - sb[cidx])),
        }
    return out


def _pool(models: list[dict[str, Any]], axes: list[str], n_random: int) -> dict[str, Any]:
    def stat(name: str, key: str) -> tuple[float, float, float]:
        return hier_boot([np.asarray(m["dirs"][name][key], dtype=float) for m in models])

    chance = float(np.mean([c for m in models for c in m["chance"]]))
    pooled: dict[str, Any] = {
        "n_models": len(models),
        "chance": chance,
        "selection_accuracy": {
            "before": hier_boot([np.asarray(m["picked_before"], float) for m in models]),
            "after": hier_boot([np.asarray(m["picked_after"], float) for m in models]),
        },
        "axes": {},
    }
    for name in axes:
        nulls = [f"{name}/random{r:02d}" for r in range(n_random)]

        def change(n: str, key_a: str = "top_after", key_b: str = "top_before") -> float:
            return float(
                np.mean([np.mean(m["dirs"][n][key_a]) - np.mean(m["dirs"][n][key_b]) for m in models])
            )

        def sent_delta(n: str) -> float:
            return float(
                np.mean([np.mean(m["dirs"][n]["sent_target"]) - m["dirs"][n]["sent_control"] for m in models])
            )

        item = stat(name, "item_delta")
        sent_t = stat(name, "sent_target")
        sent_c = float(np.mean([m["dirs"][name]["sent_control"] for m in models]))
        null_item = [float(np.mean([np.mean(m["dirs"][n]["item_delta"]) for m in models])) for n in nulls]
        pooled["axes"][name] = {
            "top_before": stat(name, "top_before"),
            "top_after": stat(name, "top_after"),
            "top_change": change(name),
            "null_top_change": ci([change(n) for n in nulls]),
            "item_delta": item,
            "null_item_delta": ci(null_item),
            "item_delta_outside_null": not (ci(null_item)["lo"] <= item[0] <= ci(null_item)["hi"]),
            "sent_target": sent_t,
            "sent_control": sent_c,
            "sent_delta": sent_delta(name),
            "sent_ratio": abs(sent_t[0]) / abs(sent_c) if sent_c else float("inf"),
            "null_sent_delta": ci([sent_delta(n) for n in nulls]),
        }
    return pooled


def replicate_dpo_words(
    lm: LoadedModel,
    *,
    axes: Mapping[str, ValueAxis],
    data_dir: Path,
    runs_dir: Path,
    k: int = 6,
    avoid: int = 2,
    n_random: int = 32,
    settings: TuneSettings | None = None,
    seed: int = 0,
    progress: Callable[[str], None] = print,
) -> WordsReport:
    """Train ``k`` prefer-word and ``avoid`` avoid-word LoRA DPO models and read every axis before and after.

    Trained checkpoints go to ``runs_dir/<kind>-<word>`` and are reused when a rerun finds them
    (an interrupted training resumes from its ``.partial`` folder).
    """
    if k + avoid > len(TARGETS):
        raise ValueError(f"k + avoid = {k + avoid} exceeds the {len(TARGETS)} target words")
    train_file, eval_file = data_dir / "preference_words.jsonl", data_dir / "preference_words_eval.jsonl"
    jobs = [("prefer", w) for w in TARGETS[:k]] + [("avoid", w) for w in TARGETS[k : k + avoid]]
    evals = [e for e in read_jsonl(eval_file) if e.meta["target"] in {w for _, w in jobs}]
    items, sents = _items(evals), _sentences(list(TARGETS))
    dirs = directions_for(axes, n_random=n_random, seed=seed)
    _, base_acts = read_items(lm, items + sents, dirs)
    dirs = calibrate_nulls(dirs, base_acts)
    progress(f"base model: reading {len(items)} items and {len(sents)} sentences on {len(dirs)} directions")
    before = _measure(lm, evals, items, sents, dirs)
    models = []
    for kind, word in jobs:
        group = f"preference_words/{word}"
        pairs = read_pairs(train_file, groups=[group])
        pairs = pairs if kind == "prefer" else [p.flipped() for p in pairs]
        out = runs_dir / f"{kind}-{word}"
        if not out.exists():
            progress(f"training {kind}-{word} on {len(pairs)} pairs -> {out}")
            train(
                lm.model_id,
                pairs,
                out,
                settings=replace(settings or TuneSettings(), seed=seed),
                data=data_record(train_file, groups=[group], flipped=kind == "avoid"),
            )
        tuned = load(str(out))
        after = _measure(tuned, evals, items, sents, dirs)
        stats = _model_stats(word, evals, items, sents, before, after, dirs)
        stats.update(
            kind=kind,
            checkpoint=str(out),
            train=asdict(TuneRecord.from_dict(json.loads((out / TUNE_FILE).read_text())).train),
        )
        models.append(stats)
        del tuned
    summary = {
        kind: _pool([m for m in models if m["kind"] == kind], list(axes), n_random)
        for kind in ("prefer", "avoid")
        if any(m["kind"] == kind for m in models)
    }
    return WordsReport(
        models=models,
        summary=summary,
        settings={
            "k": k,
            "avoid": avoid,
            "n_random": n_random,
            "seed": seed,
            "tune": (settings or TuneSettings()).__dict__,
            "axes": list(axes),
        },
    )


def write_words_report(report: WordsReport, out: Path) -> list[Path]:
    """results.json, summary.md and figure.html in ``out``."""
    notes = [
        f"Settings: {json.dumps(report.settings, default=str)}",
        "",
        "Intervals are 95% bootstrap CIs over models, then prompts; null ranges are the 2.5–97.5 percentiles"
        " over random unit directions at the same layer (σ from the base model's readings).",
    ]
    files = write_summary(out, report, "DPO word preference: the axis before and after", notes)
    files.append(out / "figure.html")
    fig = report.figure()
    write_html(fig, files[2])
    return files
