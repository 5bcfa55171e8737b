"""Checkpoint shift on tiny models: zero against itself, a planted bias recovered exactly, CI coverage."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from conftest import run_cli

from valueprobe.activations.capture import CaptureSettings, capture
from valueprobe.datasets.io import Example, write_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.model.load import wrap
from valueprobe.probe.axis import ValueAxis
from valueprobe.report.plots import shift_figure
from valueprobe.tune.shift import ShiftSettings, random_directions, shift

TEXTS = [
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "def add(a, b):\n    return a + b\n",
    "Wait, that's not right. Let me recompute: 12 * 7 = 84.",
    "Do you think your answer is correct? Yes. No.",
    "The quick brown fox jumps over the lazy dog - twice, maybe 3 times?",
]


def examples(n_per_group: int = 6) -> list[Example]:
    out = []
    for g, name in enumerate(["alpha", "beta", "gamma"]):
        for i in range(n_per_group):
            text = f"{TEXTS[(g + i) % len(TEXTS)]} {name} {i}"
            out.append(Example(id=f"{name}-{i}", text=text, label=i % 2, group=name))
    return out


def calibrated_axis(lm, exs, *, seed: int = 0) -> ValueAxis:
    """Random unit directions at every layer, with μ and σ taken over the base model's reading of ``exs``."""
    g = torch.Generator().manual_seed(seed)
    dirs = torch.randn(lm.n_layers, lm.d_model, generator=g)
    dirs = dirs / dirs.norm(dim=1, keepdim=True)
    acts = capture(lm, exs, CaptureSettings(layers="all", positions="mean"), progress=False).acts
    proj = torch.stack([acts[i] @ dirs[i] for i in range(lm.n_layers)])  # [layers, n]
    n = lm.n_layers
    return ValueAxis(
        directions=dirs,
        layers=tuple(range(n)),
        mu=proj.mean(1),
        sigma=proj.std(1, correction=0),
        mean_norm=torch.full((n,), 8.0),
        best_layer=1,
        site="resid_post",
        method="diff_means",
        model_id=lm.model_id,
        fingerprint=lm.fingerprint,
        d_model=lm.d_model,
    )


def test_model_against_itself_shifts_zero(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    exs = examples()
    res = shift(
        calibrated_axis(lm, exs), lm, lm, exs, ShiftSettings(contrast=True, n_boot=200), progress=False
    )
    assert [g.group for g in res.groups] == ["alpha", "beta", "gamma"]
    for g in res.groups:
        assert g.shift == 0.0 and g.ci[0] <= 0.0 <= g.ci[1]
        assert g.d_before == g.d_after and g.quartiles_before == g.quartiles_after
        assert not g.counts  # a zero shift sits inside the random-direction null
    assert all(v == 0.0 for ys in res.shift_by_layer.values() for v in ys)
    assert all(p.d_base == p.d_tuned for p in res.pairs) and len(res.pairs) == 3


def plant(lm, *, layer: int, vector: torch.Tensor):
    """A copy whose block ``layer`` outputs exactly ``vector`` more at every position (MLP output bias)."""
    tuned = copy.deepcopy(lm.model)
    with torch.no_grad():
        tuned.transformer.h[layer].mlp.c_proj.bias.add_(vector)
    return wrap(tuned, lm.tokenizer, model_id="planted")


def test_planted_shift_is_recovered_in_sigma_and_beats_the_null(tiny_lm_factory):
    base = tiny_lm_factory("gpt2")
    exs = examples()
    axis = calibrated_axis(base, exs)
    c = 3.0 * float(axis.sigma[1])  # resid_post[1] moves by exactly 3σ along v̂
    tuned = plant(base, layer=1, vector=c * axis.direction(1))
    with pytest.warns(UserWarning, match="other weights"):  # a descendant: read with a warning
        axis.check(tuned)
    res = shift(axis, base, tuned, exs, ShiftSettings(n_random=64, n_boot=500), progress=False)
    for g in res.groups:
        assert g.shift == pytest.approx(3.0, abs=1e-4)
        assert g.ci[0] - 1e-4 <= 3.0 <= g.ci[1] + 1e-4
        assert not g.null_range[0] <= g.shift_data_sigma <= g.null_range[1]
        assert g.null_percentile == 100.0 and g.counts
        assert g.quartiles_after != g.quartiles_before or g.share in (0.0, 1.0)
    assert all(
        ys[0] == pytest.approx(0.0, abs=1e-6) for ys in res.shift_by_layer.values()
    )  # before the plant


def test_shift_by_layer_has_the_tuned_models_sign_and_size_at_every_layer(tiny_lm_factory):
    """Block 0 planted −2σ₀ along v̂₀ and block 1 +3σ₁ along v̂₁ (σ differs per layer): layer 0 moves
    by exactly −2; every layer's mean shift equals (tuned − base) of the axis scores of captures of
    both models, the trusted reference, so a shift read the other way round (or another layer's σ)
    fails wherever the move is not zero, not only on an untuned model."""
    base = tiny_lm_factory("gpt2")
    exs = examples()
    axis = calibrated_axis(base, exs)
    sigma = [float(s) for s in axis.sigma]
    assert len(set(sigma)) == len(sigma), "the test needs a σ of its own at each layer"
    tuned = copy.deepcopy(base.model)
    with torch.no_grad():
        tuned.transformer.h[0].mlp.c_proj.bias.add_(-2.0 * sigma[0] * axis.direction(0))
        tuned.transformer.h[1].mlp.c_proj.bias.add_(3.0 * sigma[1] * axis.direction(1))
    tuned_lm = wrap(tuned, base.tokenizer, model_id="planted")
    res = shift(axis, base, tuned_lm, exs, ShiftSettings(n_random=8, n_boot=0), progress=False)
    assert res.layers == (0, 1, 2)
    read = {
        name: capture(lm, exs, CaptureSettings(layers="all", positions="mean"), progress=False).acts
        for name, lm in (("base", base), ("tuned", tuned_lm))
    }
    for g in ("alpha", "beta", "gamma"):
        rows = [i for i, ex in enumerate(exs) if ex.group == g]
        want = [
            float((axis.score(read["tuned"][x][rows], x) - axis.score(read["base"][x][rows], x)).mean())
            for x in res.layers
        ]
        assert res.shift_by_layer[g] == pytest.approx(want, abs=1e-4)
        assert res.shift_by_layer[g][0] == pytest.approx(-2.0, abs=1e-4)  # the plant, exactly, with its sign
        assert all(abs(v) > 0.1 for v in res.shift_by_layer[g])  # every layer moved: the sign is tested


def test_data_sigma_shift_and_random_null_match_closed_forms(tiny_lm_factory):
    """An axis whose σ is twice the data's: the plant c·v̂ with c = 3 data σ reads 1.5 axis σ and 3
    data σ; along random direction r the same plant moves c·(r·v̂), which in r's own data σ is
    c·(r·v̂) / std(h·r), the same in every group, so the null range is their 2.5–97.5 percentiles."""
    base = tiny_lm_factory("gpt2")
    exs = examples()
    axis = calibrated_axis(base, exs)
    data_sigma = float(axis.sigma[1])
    wide = ValueAxis(**{**axis.__dict__, "sigma": axis.sigma * 2.0})
    v = axis.direction(1).double()
    c = 3.0 * data_sigma
    tuned = plant(base, layer=1, vector=c * axis.direction(1))
    res = shift(wide, base, tuned, exs, ShiftSettings(n_random=64, n_boot=100, seed=0), progress=False)
    h = (
        capture(base, exs, CaptureSettings(layers=[1], positions="mean"), progress=False).acts[1].double()
    )  # [n, d_model]
    R = torch.as_tensor(random_directions(base.d_model, 64, seed=0)).double()  # the shift's null directions
    null = (c * (R @ v) / (h @ R.T).std(0, correction=0)).numpy()
    lo, hi = np.percentile(null, [2.5, 97.5])
    for g in res.groups:
        assert g.shift == pytest.approx(1.5, abs=1e-4)
        assert g.shift_data_sigma == pytest.approx(3.0, abs=1e-4)
        assert g.null_range == pytest.approx((lo, hi), abs=1e-4)


def test_untargeted_groups_are_the_second_null(tiny_lm_factory):
    """The same planted move in every group: the targeted group does not leave the untargeted range."""
    base = tiny_lm_factory("gpt2")
    exs = examples()
    axis = calibrated_axis(base, exs)
    tuned = plant(base, layer=1, vector=3.0 * float(axis.sigma[1]) * axis.direction(1))
    res = shift(axis, base, tuned, exs, ShiftSettings(targeted=["alpha"], n_boot=100), progress=False)
    alpha = res.groups[0]
    assert alpha.targeted and alpha.null_percentile == 100.0
    assert res.untargeted_range is not None and res.untargeted_range[0] <= alpha.shift + 1e-6
    assert not any(g.counts for g in res.groups)
    with pytest.raises(ValueprobeError, match="not in the data"):
        shift(axis, base, tuned, exs, ShiftSettings(targeted=["delta"]), progress=False)


def test_refit_reports_cosines(tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    exs = examples()
    res = shift(
        calibrated_axis(lm, exs),
        lm,
        lm,
        exs,
        ShiftSettings(refit=True, layers="0:2", n_boot=0),
        progress=False,
    )
    assert res.layers == (0, 1) and res.axis_cosine is not None
    assert res.axis_cosine["refit_base_vs_refit_tuned"] == pytest.approx((1.0, 1.0))


def test_mismatched_models_are_clear_errors(tiny_lm_factory, tiny_tokenizer):
    base = tiny_lm_factory("llama")
    exs = examples()
    axis = calibrated_axis(base, exs)
    with pytest.raises(ValueprobeError, match="d_model 96"):
        shift(axis, base, tiny_lm_factory("llama", d_model=96), exs, progress=False)
    tok = copy.deepcopy(tiny_tokenizer)
    tok.add_tokens(["<|brand_new|>"])
    with pytest.raises(ValueprobeError, match="another tokenizer vocabulary"):
        shift(axis, base, wrap(base.model, tok, model_id="other-vocab"), exs, progress=False)
    with pytest.raises(ValueprobeError, match="another architecture"):
        shift(axis, base, tiny_lm_factory("qwen2"), exs, progress=False)
    one_label = [
        Example(id=e.id, text=e.text, label=1 if e.group == "alpha" else 0, group=e.group) for e in exs
    ]
    with pytest.raises(ValueprobeError, match="every group has one label"):
        shift(axis, base, base, one_label, ShiftSettings(contrast=True), progress=False)


def test_write_is_all_or_nothing(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("llama")
    exs = examples()
    res = shift(calibrated_axis(lm, exs), lm, lm, exs, ShiftSettings(n_boot=50), progress=False)
    out = res.write(tmp_path / "out", figure=shift_figure(res))
    assert sorted(p.name for p in out.iterdir()) == ["examples.csv", "shift.html", "shift.json"]
    assert "plotly" in (out / "shift.html").read_text()[:2_000_000]
    with pytest.raises(ValueprobeError, match="already exists"):
        res.write(tmp_path / "out")
    res.write(tmp_path / "out", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary folder left behind


# ---- the command line -----------------------------------------------------------------------------


def one_line(code: int, err: str) -> str:
    lines = [
        ln for ln in err.strip().splitlines() if ln.strip() and not ln.startswith(("Loading weights", "\r"))
    ]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_lm_factory):
    """A base, its perturbed descendant and a model of another architecture saved to disk, a probe, data."""
    root = tmp_path_factory.mktemp("shift")
    base = tiny_lm_factory("llama")
    tuned = copy.deepcopy(base.model)
    noise = torch.Generator().manual_seed(0)  # its own generator: the same descendant whatever ran before
    with torch.no_grad():
        for p in tuned.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=noise, dtype=p.dtype))
    for name, model in (("base", base.model), ("tuned", tuned), ("other", tiny_lm_factory("qwen2").model)):
        model.save_pretrained(root / name)
        base.tokenizer.save_pretrained(root / name)
    exs = examples()
    calibrated_axis(base, exs).save(root / "probe")
    write_jsonl(root / "data.jsonl", exs)
    one = [Example(id=e.id, text=e.text, label=1 if e.group == "alpha" else 0, group=e.group) for e in exs]
    write_jsonl(root / "one-label.jsonl", one)
    return root


def test_cli_shift_writes_table_json_and_figure(saved, tmp_path, capsys):
    args = [
        "shift",
        "--probe",
        str(saved / "probe"),
        "--base",
        str(saved / "base"),
        "--tuned",
        str(saved / "tuned"),
        "--data",
        str(saved / "data.jsonl"),
        "--targeted",
        "alpha",
        "--contrast",
        "--bootstrap",
        "100",
        "--out",
        str(tmp_path / "out"),
    ]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    assert "data σ" in out and "alpha" in out
    info = json.loads((tmp_path / "out" / "shift.json").read_text())
    assert [g["group"] for g in info["groups"]] == ["alpha", "beta", "gamma"] and info["n_random"] == 32
    assert info["groups"][0]["targeted"] and info["base_fingerprint"] != info["tuned_fingerprint"]
    assert any(g["shift"] != 0.0 for g in info["groups"])  # the perturbed weights moved something
    msg = one_line(*run_cli(args, capsys)[::2])  # the folder exists now
    assert "already exists" in msg and "--overwrite" in msg
    assert run_cli([*args, "--overwrite"], capsys)[0] == 0


def test_cli_shift_bad_input(saved, tmp_path, capsys):
    common = ["--probe", str(saved / "probe"), "--base", str(saved / "base")]
    msg = one_line(
        *run_cli(
            [
                "shift",
                *common,
                "--tuned",
                str(saved / "other"),
                "--data",
                str(saved / "data.jsonl"),
                "--out",
                str(tmp_path / "a"),
            ],
            capsys,
        )[::2]
    )
    assert "another architecture" in msg
    msg = one_line(
        *run_cli(
            [
                "shift",
                *common,
                "--tuned",
                str(saved / "tuned"),
                "--data",
                str(saved / "one-label.jsonl"),
                "--contrast",
                "--out",
                str(tmp_path / "b"),
            ],
            capsys,
        )[::2]
    )
    assert "every group has one label" in msg
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert list(tmp_path.iterdir()) == []  # nothing half-written
