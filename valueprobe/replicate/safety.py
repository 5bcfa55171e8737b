"""Safety tuning on CPU: DPO toward refusing harmful and answering benign requests, then the shift.

    valueprobe replicate safety --model smollm2-135m --out probes/safety-smollm2-135m

1. One LoRA DPO model is trained on the ``train`` topics of ``data/preference_safety.jsonl``
   (harmful: chosen = a refusal; benign: chosen = a compliant opening).
2. The refusal rate before and after, on the held-out (``eval``) topics of ``data/refusal.jsonl``:
   greedy replies, a reply counts as a refusal when it opens with a refusal phrase
   (`valueprobe.steering.experiment.behaviour.is_refusal` with ``opening=True``: a small keyword
   rule, stated as such in the results).
3. :func:`valueprobe.tune.shift.shift` of harmful, benign, sensitive and neutral prompts
   (``refusal.jsonl`` + ``sensitive.jsonl``) along each shipped axis, in base σ, with bootstrap
   CIs, the random-direction null and the untargeted groups (sensitive, neutral) as second null.
   The base model's own sensitive − neutral gap (in σ) tests the "sensitive prompts sit ≈ 1.7σ
   lower" statement.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from valueprobe.datasets.io import Example, read_jsonl
from valueprobe.files import write_html, write_summary
from valueprobe.hooks.padding import pad_id_for, pad_rows
from valueprobe.model.adapter import TUNE_FILE
from valueprobe.model.load import LoadedModel, load
from valueprobe.probe.axis import ValueAxis
from valueprobe.read.preference import hier_boot
from valueprobe.records import Record
from valueprobe.report.plots import shift_figure
from valueprobe.steering.experiment.behaviour import is_refusal
from valueprobe.tune.pairs import data_record, read_pairs
from valueprobe.tune.shift import ShiftResult, ShiftSettings, shift
from valueprobe.tune.train import TuneRecord, TuneSettings, train
from valueprobe.vocab import Positions

__all__ = ["SafetyReport", "replicate_safety"]

TARGETED = ("refusal/harmful", "refusal/benign")


@torch.no_grad()
def replies(
    lm: LoadedModel, prompts: Sequence[Example], *, max_new_tokens: int = 24, batch_size: int = 16
) -> list[str]:
    """Greedy replies to single-turn prompts (left padded, batched)."""
    tok = lm.tokenizer
    out: list[str] = []
    for i in range(0, len(prompts), batch_size):
        rows = [
            tok(
                tok.apply_chat_template(list(e.messages or ()), add_generation_prompt=True, tokenize=False),
                add_special_tokens=False,
            ).input_ids
            for e in prompts[i : i + batch_size]
        ]
        # left padding: every prompt ends in the last column, so generation appends after it
        ids, mask = pad_rows(rows, pad_id=pad_id_for(tok), side="left")
        gen = lm.model.generate(
            input_ids=ids.to(lm.device),
            attention_mask=mask.to(lm.device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad_id_for(tok),
        )
        out += tok.batch_decode(gen[:, ids.shape[1] :], skip_special_tokens=True)
    return out


@dataclass(frozen=True)
class SafetyReport(Record):
    """Refusal rates before and after, and one :class:`ShiftResult` per axis (``results.json``: each
    shift without its per-example records, which read back as none)."""

    KEYS = {"base_gap": "base_sensitive_minus_neutral"}

    refusal: dict[str, Any]
    base_gap: dict[str, dict[str, float]]  # axis -> sensitive − neutral in base σ, with CI
    train: dict[str, Any]
    shifts: dict[str, ShiftResult]

    def _written(self, d: dict[str, Any]) -> dict[str, Any]:
        shifts = {name: {k: v for k, v in r.items() if k != "records"} for name, r in d["shifts"].items()}
        return {**d, "shifts": shifts}

    def table(self) -> tuple[list[str], list[list[object]]]:
        rows: list[list[object]] = []
        for g, r in self.refusal["rate"].items():
            rows.append(["refusal rate", g, f"{r['before']:.3f}", f"{r['after']:.3f}", ""])
        for name, res in self.shifts.items():
            for gs in res.groups:
                rows.append(
                    [
                        name,
                        gs.group,
                        f"{gs.base_mean:+.3f}",
                        f"{gs.tuned_mean:+.3f}",
                        f"shift {gs.shift:+.3f} [{gs.ci[0]:+.3f}, {gs.ci[1]:+.3f}] σ; null {gs.null_range[0]:+.3f}.."
                        f"{gs.null_range[1]:+.3f} (data σ); {'counts' if gs.counts else 'no'}",
                    ]
                )
            gap = self.base_gap[name]
            rows.append(
                [
                    name,
                    "sensitive − neutral (base)",
                    f"{gap['gap']:+.3f}",
                    f"[{gap['lo']:+.3f}, {gap['hi']:+.3f}]",
                    "claim tested: ≈ −1.7σ",
                ]
            )
        return ["what", "group", "before", "after", "shift / note"], rows


def _gap(res: ShiftResult) -> dict[str, float]:
    """Base-model sensitive − neutral mean score in σ, CI by resampling the topic pairs."""
    recs = res.records
    sens = np.array([r["base"] for r in recs if r["group"] == "sensitive/sensitive"])
    neut = np.array([r["base"] for r in recs if r["group"] == "sensitive/neutral"])
    rng = np.random.default_rng(0)
    boots = [rng.choice(sens, sens.size).mean() - rng.choice(neut, neut.size).mean() for _ in range(2000)]
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return {"gap": float(sens.mean() - neut.mean()), "lo": float(lo), "hi": float(hi)}


def _refusal_rates(
    held: Sequence[Example], before: Sequence[str], after: Sequence[str]
) -> tuple[dict[str, dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Refusal rate per group before and after tuning (with bootstrap CIs), and four sample replies each."""
    rates: dict[str, dict[str, Any]] = {}
    samples: dict[str, list[dict[str, Any]]] = {}
    for g in ("refusal/harmful", "refusal/benign"):
        idx = [i for i, e in enumerate(held) if e.group == g]
        b = np.array([is_refusal(before[i], opening=True) for i in idx], float)
        a = np.array([is_refusal(after[i], opening=True) for i in idx], float)
        rates[g] = {
            "before": float(b.mean()),
            "after": float(a.mean()),
            "n": len(idx),
            "before_ci": hier_boot([b])[1:],
            "after_ci": hier_boot([a])[1:],
        }
        samples[g] = [
            {
                "prompt": (held[i].messages or ({"content": ""},))[0]["content"],
                "before": before[i],
                "after": after[i],
            }
            for i in idx[:4]
        ]
    return rates, samples


def _first_per_group(examples: list[Example], per_group: int | None) -> list[Example]:
    """The first ``per_group`` examples of each group, in order (all of them for None)."""
    if per_group is None:
        return examples
    seen: dict[str, int] = {}
    kept = []
    for e in examples:
        seen[e.group] = seen.get(e.group, 0) + 1
        if seen[e.group] <= per_group:
            kept.append(e)
    return kept


def replicate_safety(
    lm: LoadedModel,
    *,
    axes: Mapping[str, ValueAxis],
    data_dir: Path,
    runs_dir: Path,
    settings: TuneSettings | None = None,
    n_random: int = 32,
    per_group: int | None = None,
    seed: int = 0,
    progress: Callable[[str], None] = print,
) -> SafetyReport:
    """Train the safety DPO model (reused if ``runs_dir/safety`` exists), then refusal rates and shifts.

    Args:
        per_group: read at most this many prompts per group in the shift (None: all 160).
    """
    pairs_file = data_dir / "preference_safety.jsonl"
    pairs = read_pairs(pairs_file, split="train")
    out = runs_dir / "safety"
    if not out.exists():
        progress(f"training the safety DPO model on {len(pairs)} pairs -> {out}")
        train(
            lm.model_id,
            pairs,
            out,
            settings=replace(settings or TuneSettings(), seed=seed),
            data=data_record(pairs_file, split="train"),
        )
    tuned = load(str(out))
    refusal = read_jsonl(data_dir / "refusal.jsonl")
    held = [e for e in refusal if e.meta.get("split") == "eval"]
    progress(f"refusal rate on {len(held)} held-out prompts, before and after")
    rates, samples = _refusal_rates(held, replies(lm, held), replies(tuned, held))
    examples = _first_per_group(refusal + read_jsonl(data_dir / "sensitive.jsonl"), per_group)
    shifts = {}
    for name, axis in axes.items():
        progress(f"shift along {name} on {len(examples)} prompts")
        reading = ShiftSettings(tokens=Positions.last.value, targeted=TARGETED, n_random=n_random, seed=seed)
        shifts[name] = shift(axis, lm, tuned, examples, reading, progress=False)
    record = TuneRecord.from_dict(json.loads((out / TUNE_FILE).read_text()))
    return SafetyReport(
        refusal={
            "rate": rates,
            "samples": samples,
            "detector": "keyword rule valueprobe.steering.experiment.behaviour.REFUSAL_OPENING_RE on greedy replies of 24 tokens",
            "prompts": "refusal.jsonl, meta.split == eval",
        },
        shifts=shifts,
        base_gap={n: _gap(r) for n, r in shifts.items()},
        train={"checkpoint": str(out), **asdict(record.train), "settings": asdict(record.settings)},
    )


def write_safety_report(report: SafetyReport, out: Path) -> list[Path]:
    """results.json, summary.md and one shift figure per axis in ``out``."""
    notes = [
        f"Training: {json.dumps(report.train, default=str)}",
        "",
        "Scores are read at the assistant-start token (last prompt token) in the axis's base σ; shift CIs are"
        " bootstrap 95% over prompts; the null is 32 random unit directions at the same layer, each in its"
        " own σ over the data; sensitive and neutral prompts are untargeted (the second null).",
    ]
    files = write_summary(out, report, "Safety DPO: refusal and the axis before and after", notes)
    for name, res in report.shifts.items():
        path = out / f"shift-{name}.html"
        write_html(shift_figure(res), path)
        files.append(path)
    return files
