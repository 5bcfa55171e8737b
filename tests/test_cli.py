"""The CLI end to end on a tiny model saved to disk; bad input gives one line and exit 2."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import run_cli as run

from valueprobe.activations.encode import render
from valueprobe.datasets.io import read_jsonl, write_jsonl
from valueprobe.model.load import load
from valueprobe.probe.axis import ValueAxis
from valueprobe.read.readout import ScoreSettings, score_dataset

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def icrl_small(tmp_path_factory):
    examples = read_jsonl(DATA / "icrl.jsonl")
    per_rule: dict[str, int] = {}
    keep = []
    for ex in examples:
        if per_rule.get(ex.group, 0) < 2:
            per_rule[ex.group] = per_rule.get(ex.group, 0) + 1
            keep.append(ex)
    path = tmp_path_factory.mktemp("data") / "icrl.jsonl"
    write_jsonl(path, keep)
    return path


def test_capture_fit_score(tiny_dir, icrl_small, tmp_path, capsys):
    store = tmp_path / "store"
    code, out, err = run(
        [
            "capture",
            "--model",
            tiny_dir,
            "--data",
            str(icrl_small),
            "--out",
            str(store),
            "--positions",
            "spans",
            "--layers",
            "all",
        ],
        capsys,
    )
    assert code == 0, err
    assert "capture ->" in out and json.loads((store / "manifest.json").read_text())["complete"]

    probe = tmp_path / "probe"
    code, out, err = run(
        ["fit", "--store", str(store), "--method", "span_diff", "--out", str(probe), "--splits", "2"], capsys
    )
    assert code == 0, err
    assert "best layer" in out and "margin" in out
    info = json.loads((probe / "probe.json").read_text())
    assert info["method"] == "span_diff" and (probe / "sweep.html").stat().st_size > 1000

    scores = tmp_path / "scores"
    code, out, err = run(
        [
            "score",
            "--probe",
            str(probe),
            "--model",
            tiny_dir,
            "--data",
            str(icrl_small),
            "--out",
            str(scores),
            "--tokens",
            "span_tokens",
            "--bootstrap",
            "50",
        ],
        capsys,
    )
    assert code == 0, err
    with open(scores / "scores.csv") as f:
        written = list(csv.DictReader(f))
    examples = read_jsonl(icrl_small)
    assert len(written) == len(examples)

    # Values, from the files written: every scores.csv row equals the library's score_dataset on the
    # saved probe, and one example's val and score are recomputed by hand from the residual at the
    # probe's best layer (a forward hook on that decoder block): val = mean over the tokens of its
    # spans of cos(h_t, v̂), score = (mean h_t·v̂ − μ) / σ.
    lm = load(tiny_dir)
    axis = ValueAxis.load(probe, lm=lm)
    want = score_dataset(
        axis, lm, examples, ScoreSettings(tokens="span_tokens", bootstrap=0), progress=False
    ).records
    for row, rec in zip(written, want, strict=True):
        assert row["id"] == rec["id"] and int(row["n_readout_tokens"]) == rec["n_readout_tokens"]
        assert float(row["val"]) == pytest.approx(rec["val"], abs=1e-6)
        assert float(row["score"]) == pytest.approx(rec["score"], abs=1e-5)
    ex, layer = examples[0], axis.best_layer
    text, starts = render(lm.tokenizer, ex)
    enc = lm.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    toks = [
        t
        for sp in ex.spans
        for t, (a, b) in enumerate(enc["offset_mapping"])
        if b > a and starts[sp.message] + sp.start <= a < starts[sp.message] + sp.end
    ]
    seen: list[torch.Tensor] = []
    block = lm.model.model.layers[layer]
    handle = block.register_forward_hook(lambda m, i, o: seen.append(o[0] if isinstance(o, tuple) else o))
    try:
        with torch.no_grad():
            lm.model(input_ids=torch.tensor([enc["input_ids"]]))
    finally:
        handle.remove()
    h = seen[0][0, toks].double()
    v = axis.direction(layer).double()
    i = axis.layers.index(layer)
    val = float((h @ v / h.norm(dim=1)).mean())
    score = (float((h @ v).mean()) - float(axis.mu[i])) / float(axis.sigma[i])
    assert float(written[0]["val"]) == pytest.approx(val, abs=1e-5)
    assert float(written[0]["score"]) == pytest.approx(score, abs=1e-4)
    assert int(written[0]["n_readout_tokens"]) == len(toks)


def one_line_error(code: int, err: str) -> str:
    assert code == 2
    # Progress bars (model loading) may come first; the failure itself is exactly one line.
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith(("Loading weights", "\r"))]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_bad_input_is_one_line(tiny_dir, icrl_small, tmp_path, capsys):
    out = tmp_path / "never"
    msg = one_line_error(
        *run(
            ["capture", "--model", tiny_dir, "--data", str(icrl_small), "--out", str(out), "--layers", "7"],
            capsys,
        )[::2]
    )
    assert "layer 7 out of range" in msg and "0..2" in msg
    assert not out.exists()

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "x", "label": 1, "group": "g"}\n{"id": "b", "text": \n')
    msg = one_line_error(
        *run(["capture", "--model", tiny_dir, "--data", str(bad), "--out", str(out)], capsys)[::2]
    )
    assert f"{bad}:2" in msg and not out.exists()

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    msg = one_line_error(
        *run(["capture", "--model", tiny_dir, "--data", str(empty), "--out", str(out)], capsys)[::2]
    )
    assert "empty" in msg

    msg = one_line_error(
        *run(["capture", "--model", "no/such-model", "--data", str(icrl_small), "--out", str(out)], capsys)[
            ::2
        ]
    )
    assert "cannot load model" in msg

    msg = one_line_error(*run(["fit", "--store", str(tmp_path / "nostore"), "--out", str(out)], capsys)[::2])
    assert "not an activation store" in msg

    msg = one_line_error(*run(["datasets", "build", "--family", "nope", "--out", str(out)], capsys)[::2])
    assert "unknown dataset family" in msg

    msg = one_line_error(*run(["capture", "--data", str(icrl_small)], capsys)[::2])
    assert "Missing option '--out'" in msg


def test_score_refuses_probe_of_another_model(tiny_dir, tiny_lm_factory, icrl_small, tmp_path, capsys):
    other = tiny_lm_factory("qwen2")
    other_dir = tmp_path / "other"
    other.model.save_pretrained(other_dir)
    other.tokenizer.save_pretrained(other_dir)
    store, probe = tmp_path / "s", tmp_path / "p"
    assert (
        run(
            [
                "capture",
                "--model",
                tiny_dir,
                "--data",
                str(icrl_small),
                "--out",
                str(store),
                "--positions",
                "spans",
            ],
            capsys,
        )[0]
        == 0
    )
    assert run(["fit", "--store", str(store), "--out", str(probe), "--splits", "1"], capsys)[0] == 0
    msg = one_line_error(
        *run(
            [
                "score",
                "--probe",
                str(probe),
                "--model",
                str(other_dir),
                "--data",
                str(icrl_small),
                "--out",
                str(tmp_path / "sc"),
            ],
            capsys,
        )[::2]
    )
    assert "fingerprint" in msg and "--force" in msg


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["demo", "--out", "{data}"], "is a file, not a folder"),
        (
            ["capture", "--data", "{data}", "--out", "{tmp}/s", "--positions", "middle"],
            "'middle' is not one of",
        ),
        (["capture", "--data", "{data}", "--out", "{tmp}/s", "--layers", "a:b"], "is not a layer spec"),
        (["datasets", "build", "--out", "{tmp}/d", "--family", "nope"], "unknown dataset family 'nope'"),
        (["fit", "--store", "{tmp}/none", "--out", "{tmp}/p", "--method", "pca"], "'pca' is not one of"),
        (["fit", "--store", "{tmp}/none", "--out", "{tmp}/p", "--layers", "::0"], "is not a layer spec"),
        (["fit", "--store", "{tmp}/none", "--out", "{tmp}/p"], "not an activation store"),
        (
            ["score", "--probe", "{tmp}/none", "--data", "{data}", "--out", "{tmp}/o", "--tokens", "x"],
            "'x' is not one",
        ),
        (["score", "--probe", "{tmp}/none", "--data", "{data}", "--out", "{tmp}/o"], "is not a probe folder"),
        (
            ["replicate", "axis", "--out", "{tmp}/p", "--runs", "{tmp}/r", "--splits", "0"],
            "--splits 0 is too small",
        ),
    ],
)
def test_every_verb_fails_on_bad_input_in_one_line(argv, says, icrl_small, tmp_path, capsys):
    """Each verb, given a bad option, exits 2 with one ``error:`` line naming it, before any work."""
    args = [a.format(data=icrl_small, tmp=tmp_path) for a in argv]
    assert says in one_line_error(*run(args, capsys)[::2])
    assert not any(tmp_path.iterdir())  # nothing written


def test_bad_input_through_the_real_entry_point(tmp_path):
    """The installed entry point (a fresh interpreter): one line on stderr, exit 2, no traceback."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "valueprobe",
            "fit",
            "--store",
            str(tmp_path / "none"),
            "--out",
            str(tmp_path / "p"),
            "--target",
            "both",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "'both' is not one of" in proc.stderr


def test_cli_imports_no_optional_heavy_dependency():
    """`valueprobe --help` must not pay for TRL, peft, HF datasets, nnsight or TransformerLens:
    the commands that need them import them when they run."""
    heavy = ["trl", "peft", "datasets", "nnsight", "transformer_lens", "lm_eval", "inspect_ai"]
    code = f"import sys, valueprobe.cli.main; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
