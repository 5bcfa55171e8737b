"""The one-command axis build runs end to end on a tiny model and a slice of the committed data."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from valueprobe.datasets.io import read_jsonl, write_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.probe.axis import ValueAxis
from valueprobe.replicate.axis import FAMILIES, matched_control, replicate_axis

DATA = Path(__file__).resolve().parents[1] / "data"


def _slice_data(dest: Path, per_group: int = 2) -> None:
    """A few examples of every group (pairs kept whole through meta.pair / ids)."""
    dest.mkdir()
    for spec in FAMILIES.values():
        examples = read_jsonl(DATA / spec.file)
        seen: dict[str, int] = {}
        keep_pairs: set[str] = set()
        for ex in examples:
            pair = str(ex.meta.get("pair", ex.id))
            if seen.get(ex.group, 0) < per_group and pair not in keep_pairs:
                seen[ex.group] = seen.get(ex.group, 0) + 1
                keep_pairs.add(pair)
        picked = [
            ex for ex in examples if str(ex.meta.get("pair", ex.id)) in keep_pairs or ex.id in keep_pairs
        ]
        write_jsonl(dest / spec.file, picked)


def test_replicate_axis_end_to_end(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("llama")
    _slice_data(tmp_path / "data")
    report = replicate_axis(
        lm,
        data_dir=tmp_path / "data",
        runs_dir=tmp_path / "runs",
        out=tmp_path / "probe",
        n_splits=2,
        train_groups=30,
        history_out=tmp_path / "history",
        progress=False,
    )
    history = ValueAxis.load(tmp_path / "history", lm=lm)
    assert set(history.metrics["evaluated_on"]) == {"icrl", "code", "backtracking", "confidence", "refusal"}
    # Main and control final paragraphs are identical text: at the embedding output nothing separates them.
    assert history.metrics["sweep"]["controls"]["embed"]["mean"] == pytest.approx(0.5)
    # evaluate_axis against a hand computation on the refusal store (labels: benign 1, harmful 0).
    from valueprobe.activations.store import ActivationStore
    from valueprobe.stats.metrics import auroc

    refusal = ActivationStore.open(tmp_path / "runs" / "refusal")
    proj = refusal.acts(history.best_layer) @ history.direction().numpy()
    want = auroc(proj, refusal.rows().label)
    assert history.metrics["evaluated_on"]["refusal"]["auroc"] == pytest.approx(want, abs=1e-6)
    axis = ValueAxis.load(tmp_path / "probe", lm=lm)
    assert axis.method == "span_diff" and axis.layers == (0, 1, 2)
    info = json.loads((tmp_path / "probe" / "probe.json").read_text())
    assert set(info["metrics"]["transfer"]["families"]) == {
        "icrl",
        "code",
        "backtracking",
        "confidence",
        "refusal",
    }
    assert len(info["metrics"]["logit_lens"]["promoted"]) == 20
    control = info["metrics"]["icrl_matched_control"]
    # Identical final paragraphs have identical token embeddings: the embed control must be exactly 0.5.
    assert control["embed_main_post_vs_control_post"]["auroc"] == pytest.approx(0.5)
    assert 0.0 <= control["post_vs_pre_main"]["auroc"] <= 1.0
    assert report.transfer is not None and report.transfer.layer == axis.best_layer
    # The backtracking store read only the prefix spans, never the marker text.
    rows = json.loads((tmp_path / "runs" / "backtracking" / "manifest.json").read_text())
    assert rows["span_labels"] == ["prefix"] and rows["group_by"] == "meta.pair"


def test_matched_control_matches_hand_computation(tiny_lm_factory, tmp_path):
    """Each contrast of matched_control is the AUROC of the stated rows' projections, computed by hand."""
    import torch

    from valueprobe.activations.store import ActivationStore
    from valueprobe.stats.metrics import auroc

    lm = tiny_lm_factory("llama")
    _slice_data(tmp_path / "data", per_group=1)
    report = replicate_axis(
        lm,
        data_dir=tmp_path / "data",
        runs_dir=tmp_path / "runs",
        n_splits=1,
        train_groups=40,
        progress=False,
    )
    main = ActivationStore.open(tmp_path / "runs" / "icrl")
    control = ActivationStore.open(tmp_path / "runs" / "icrl_control")
    layer = report.axis.best_layer
    main_span, control_span = np.array(main.rows().span), np.array(control.rows().span)
    # Plant the direction that best separates main from control post spans.
    diff = main.acts(layer)[main_span == "post"].mean(0) - control.acts(layer)[control_span == "post"].mean(0)
    one = report.axis[layer]
    planted = replace(one, directions=torch.tensor(diff / np.linalg.norm(diff))[None].float())
    got = matched_control(planted, main, control)
    v = diff.astype(np.float64) / np.linalg.norm(diff)
    m, c = main.acts(layer) @ v, control.acts(layer) @ v

    def by_hand(pos: np.ndarray, neg: np.ndarray) -> float:
        return auroc(np.concatenate([pos, neg]), np.r_[np.ones(len(pos)), np.zeros(len(neg))])

    want = by_hand(m[main_span == "post"], c[control_span == "post"])
    assert got.main_post_vs_control_post.auroc == pytest.approx(want, abs=1e-6) and want > 0.5
    want_pre = by_hand(c[control_span == "post"], c[control_span == "pre"])
    assert got.post_vs_pre_control.auroc == pytest.approx(want_pre, abs=1e-6)


def test_missing_data_file_is_one_line(tiny_lm_factory, tmp_path):
    (tmp_path / "data").mkdir()
    with pytest.raises(ValueprobeError, match="datasets build --family all"):
        replicate_axis(tiny_lm_factory("llama"), data_dir=tmp_path / "data", runs_dir=tmp_path / "runs")
