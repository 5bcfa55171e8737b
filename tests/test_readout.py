"""val(s), σ scores, dataset scoring and the logit lens, against hand computations on tiny models."""

from __future__ import annotations

import csv
import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from valueprobe.datasets.io import Example
from valueprobe.errors import ValueprobeError
from valueprobe.probe.axis import ValueAxis
from valueprobe.read.readout import ScoreSettings, logit_lens, score_dataset, token_cos, val
from valueprobe.stats.metrics import auroc


def test_val_is_mean_token_cosine():
    h = torch.randn(7, 12)
    v = torch.randn(12)
    want = torch.nn.functional.cosine_similarity(h, v[None], dim=1).mean().item()
    assert val(h, v) == pytest.approx(want, rel=1e-6)
    assert val(h.numpy(), v.numpy()) == pytest.approx(want, rel=1e-6)
    assert token_cos(np.zeros((2, 12)), v)[0] == 0.0  # a zero residual reads as 0, not NaN
    with pytest.raises(ValueprobeError, match="empty"):
        val(np.zeros((0, 12)), v)


def tiny_axis(lm, layer: int = 1, *, seed: int = 0) -> ValueAxis:
    g = torch.Generator().manual_seed(seed)
    dirs = torch.randn(lm.n_layers, lm.d_model, generator=g)
    n = lm.n_layers
    return ValueAxis(
        directions=dirs / dirs.norm(dim=1, keepdim=True),
        layers=tuple(range(n)),
        mu=torch.full((n,), 0.1),
        sigma=torch.full((n,), 2.0),
        mean_norm=torch.full((n,), 8.0),
        best_layer=layer,
        site="resid_post",
        method="diff_means",
        model_id=lm.model_id,
        fingerprint=lm.fingerprint,
        d_model=lm.d_model,
    )


def examples() -> list[Example]:
    texts = [
        "The capital of France is Paris.",
        "def add(a, b): return a + b",
        "Wait, that's not right.",
        "Do you think your answer is correct? Yes.",
        "The quick brown fox jumps.",
        "Rewrite the sentence.",
    ]
    return [
        Example(id=f"e{i}", label=float(i % 2), group="ab"[i // 4] if i < 5 else "c", text=t)
        for i, t in enumerate(texts)
    ]


def test_score_dataset_matches_hidden_states(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("llama")
    axis = tiny_axis(lm, layer=1)
    exs = examples()
    res = score_dataset(axis, lm, exs, ScoreSettings(bootstrap=50, batch_size=4), progress=False)
    v = axis.direction(1)
    for ex, rec in zip(exs, res.records, strict=True):
        ids = lm.tokenizer(ex.text, return_tensors="pt")
        with torch.no_grad():
            h = lm.model(**ids, output_hidden_states=True).hidden_states[2][0]  # resid_post[1]
        assert rec["n_readout_tokens"] == h.shape[0]
        assert rec["val"] == pytest.approx(val(h, v), abs=1e-5)
        assert rec["score"] == pytest.approx(((h @ v).mean().item() - 0.1) / 2.0, abs=1e-4)
        assert axis.score(h.double().numpy()).mean() == pytest.approx(rec["score"], abs=1e-4)
    summary = {r["group"]: r for r in res.summary}
    assert set(summary) == {"all", "a", "b", "c"}
    s = summary["all"]
    assert s["n"] == 6 and s["n_pos"] == 3
    lo, hi = s["val_auroc_ci"]
    assert lo <= s["val_auroc"] <= hi and 0.5 <= s["length_auroc"] <= 1.0
    assert summary["a"]["contrast"] == "within group"
    # A one-class group is contrasted with the opposite-class rows (no meta.pair here: all of them).
    b = [r for r in res.records if r["group"] == "b"]
    others = [r for r in res.records if (r["label"] >= 0.5) != (b[0]["label"] >= 0.5)]
    assert summary["b"]["contrast"] == "vs all opposite-class rows"
    want = auroc([r["val"] for r in b + others], [r["label"] for r in b + others])
    assert summary["b"]["val_auroc"] == pytest.approx(want)
    assert res.table()[1][2][2].startswith(f"{want:.3f} [")
    headers, rows = res.table()
    assert rows[0][0] == "all" and len(rows[0]) == len(headers)
    paths = res.write(tmp_path / "out")
    with open(paths["scores"]) as f:
        got = list(csv.DictReader(f))
    assert [r["id"] for r in got] == [e.id for e in exs]
    assert float(got[2]["val"]) == pytest.approx(res.records[2]["val"])
    assert json.loads(paths["summary"].read_text())["layer"] == 1


def test_score_dataset_refuses_another_model(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    other = tiny_lm_factory("qwen2")
    axis = tiny_axis(other)
    with pytest.raises(ValueprobeError, match="fingerprint"):
        score_dataset(axis, lm, examples(), progress=False)
    wide = tiny_lm_factory("llama", d_model=96)
    with pytest.raises(ValueprobeError, match="d_model 64 .* d_model 96"):
        score_dataset(tiny_axis(lm), wide, examples(), ScoreSettings(force=True), progress=False)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_logit_lens_matches_manual_unembedding(tiny_lm_factory, arch):
    lm = tiny_lm_factory(arch)
    axis = tiny_axis(lm)
    out = logit_lens(axis, lm, k=5)
    x = axis.direction() * 8.0
    with torch.no_grad():
        logits = lm.unembed(lm.final_norm(x[None, None]))[0, 0]
    top = torch.topk(logits, 5).indices.tolist()
    bottom = torch.topk(-logits, 5).indices.tolist()
    assert [t for t, _ in out["promoted"]] == [lm.tokenizer.decode([i]) for i in top]
    assert [t for t, _ in out["suppressed"]] == [lm.tokenizer.decode([i]) for i in bottom]
    assert out["promoted"][0][1] == pytest.approx(logits[top[0]].item(), rel=1e-5)
    flipped = logit_lens(-axis, lm, k=5)
    assert [t for t, _ in flipped["promoted"]] == [t for t, _ in out["suppressed"]]


def test_score_dataset_streams_in_chunks_with_same_result(tiny_lm_factory):
    """batch_size=1 reads 32-example chunks (several here); the records equal one big batch."""
    lm = tiny_lm_factory("llama")
    axis = tiny_axis(lm)
    many = [replace(ex, id=f"{ex.id}-{k}") for k in range(7) for ex in examples()]  # 42 examples
    small = score_dataset(axis, lm, many, ScoreSettings(batch_size=1, bootstrap=0), progress=False)
    big = score_dataset(axis, lm, many, ScoreSettings(batch_size=64, bootstrap=0), progress=False)
    assert [r["id"] for r in small.records] == [ex.id for ex in many]
    for a, b in zip(small.records, big.records, strict=True):
        assert a["n_readout_tokens"] == b["n_readout_tokens"]
        assert a["val"] == pytest.approx(b["val"], abs=1e-5)
