"""The ablate row of ``replicate steer``: the axis removed vs random directions removed, run alone.

Run: ``HF_HUB_OFFLINE=1 python -m pytest -q tests/test_replicate_steer.py``
Reference: P(yes) recomputed with a plain forward hook that sets block ``L``'s output to
h − (h·v̂)v̂ (the definition of ablation) and read from the files the row wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import run_cli
from test_cli_faults import one_line
from test_steer_sweep import tiny_axis

from valueprobe.datasets.io import read_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.replicate.steer import (
    BENCHMARKS,
    ReplicateSteer,
    ReplicateSteerSettings,
    parse_benchmarks,
    parse_rows,
    replicate_steer,
)
from valueprobe.steering.decode.generation import encode_prompts
from valueprobe.steering.experiment.sweep import GENERATIONS
from valueprobe.steering.experiment.yes_no import answer_tokens

DATA = Path(__file__).resolve().parents[1] / "data"


def _run(lm, tmp_path: Path, rows: tuple[str, ...], **kw) -> ReplicateSteer:
    more = {"benchmarks": kw.pop("benchmarks")} if "benchmarks" in kw else {}
    run = ReplicateSteerSettings(
        probe=kw.pop("probe", Path("p/value")),
        other_probe=Path("p/history"),
        data_dir=DATA,
        runs_dir=tmp_path / "runs",
        prompts=2,
        alphas=(-1.0, 1.0),
        unit="sigma",
        controls=2,
        tokens=0.05,
        rows=rows,
        **more,
    )
    axis = kw.pop("axis", tiny_axis(lm))
    return replicate_steer(lm, run, axis=axis, other=tiny_axis(lm, seed=1), out=tmp_path / "out")


def _p_yes_ablated(lm, ids: torch.Tensor, *, layer: int, v: torch.Tensor, ablate: bool) -> float:
    """P(yes) of the next token with block ``layer``'s output ablated along ``v`` (or left intact)."""

    def hook(_m, _i, out):
        h = out[0] if isinstance(out, tuple) else out
        h = h - (h @ v)[..., None] * v
        return (h, *out[1:]) if isinstance(out, tuple) else h

    handle = lm.layers[layer].register_forward_hook(hook) if ablate else None
    try:
        with torch.no_grad():
            logits = lm.model(input_ids=ids).logits
    finally:
        if handle is not None:
            handle.remove()
    yes, no = answer_tokens(lm.tokenizer)
    probs = torch.softmax(logits[0, -1].double(), dim=-1)
    return float(probs[yes].sum() / (probs[yes].sum() + probs[no].sum()))


def test_ablate_row_alone_keeps_the_add_row_and_reads_back(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("llama")
    added = _run(lm, tmp_path, ("add",))
    before = json.loads((tmp_path / "out" / "results.json").read_text())
    report = _run(lm, tmp_path, ("ablate",))
    after = json.loads((tmp_path / "out" / "results.json").read_text())
    assert after["sweeps"] == before["sweeps"]  # the add row, untouched
    assert report.sweeps == added.sweeps
    assert list(report.ablations) == [b.name for b in BENCHMARKS]
    settings = report.ablations["confidence"].settings
    assert settings is not None
    assert settings.spec.op.op == "ablate" and settings.alphas == (0.0, 1.0) and settings.other_probe is None
    assert ReplicateSteer.from_dict(after) == report
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "## Necessity: the axis ablated" in summary and "null 95% range (random ablated)" in summary
    headers, rows = report.ablation_table()
    assert len(rows) == sum(len(s.effects) for s in report.ablations.values()) and len(headers) == 8


def test_ablate_row_value_is_the_ablated_p_yes_by_hand(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("llama")
    axis = tiny_axis(lm)
    report = _run(lm, tmp_path, ("ablate",), axis=axis)
    first = read_jsonl(DATA / "steer_confidence.jsonl")[0]
    (prompt,) = encode_prompts(lm, [list(first.messages or ())])
    ids = torch.tensor([prompt])
    v = axis.direction(axis.best_layer)
    p = {a: _p_yes_ablated(lm, ids, layer=axis.best_layer, v=v, ablate=bool(a)) for a in (0.0, 1.0)}
    rows = [
        json.loads(x)
        for x in (tmp_path / "runs" / "confidence-ablate" / GENERATIONS).read_text().splitlines()
    ]
    got = {
        r["alpha"]: r["metrics"]["p_yes"]
        for r in rows
        if r["prompt_id"] == first.id and r["direction"] == "axis"
    }
    assert got == pytest.approx(p, abs=1e-5)
    assert abs(p[1.0] - p[0.0]) > 1e-4  # ablation moved it, so the figure below is not a trivial 0
    # the first prompt is alone in its group (direct): the figure is p(ablated) − p(intact)
    (effect,) = [
        e for e in report.ablations["confidence"].effects if e.metric == "p_yes" and e.subset == first.group
    ]
    assert effect.axis.slope == pytest.approx(p[1.0] - p[0.0], abs=1e-5)


def test_benchmarks_run_one_at_a_time_add_up(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("llama")
    _run(lm, tmp_path, ("ablate",), benchmarks=("length",))
    report = _run(lm, tmp_path, ("ablate",), benchmarks=("confidence",))
    assert list(report.ablations) == ["confidence", "length"] and not report.sweeps  # BENCHMARKS order
    again = _run(lm, tmp_path, ("ablate",), benchmarks=("length",))  # resumed: the same figures
    assert again.ablations == report.ablations
    assert parse_benchmarks("all") == tuple(b.name for b in BENCHMARKS)
    assert parse_benchmarks("length, code") == ("code", "length")
    for bad in ("", "lengths", "all,code"):
        with pytest.raises(ValueprobeError, match="--benchmarks"):
            parse_benchmarks(bad)


def test_rows_are_checked_before_any_work(tiny_lm_factory, tmp_path, capsys, monkeypatch):
    for bad in ("", "add,remove", "ablation"):
        with pytest.raises(ValueprobeError, match="--rows"):
            parse_rows(bad)
    assert parse_rows("ablate,add") == ("add", "ablate")
    monkeypatch.setattr("valueprobe.model.load.load", lambda *a, **k: pytest.fail("loaded the model"))
    code, _, err = run_cli(["replicate", "steer", "--rows", "ablation", "--out", str(tmp_path / "o")], capsys)
    assert "--rows 'ablation'" in one_line(code, err)
    # results of another axis are not mixed in
    lm = tiny_lm_factory("llama")
    _run(lm, tmp_path, ("add",), probe=Path("p/other"))
    with pytest.raises(ValueprobeError, match="holds results for p/other"):
        _run(lm, tmp_path, ("ablate",))
