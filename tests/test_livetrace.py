"""``valueprobe trace`` end to end on a tiny model saved to disk, and its bad inputs.

Run: ``HF_HUB_OFFLINE=1 python -m pytest -q tests/test_livetrace.py``
The CSV is checked against the library's own per-token score (`valueprobe.steering.hook.handle` tests check
that one against ``output_hidden_states``); every bad input is one line, exit 2, nothing written.
"""

from __future__ import annotations

import csv
import dataclasses
import math

import pytest
import torch
from conftest import run_cli as run
from test_steer import planted_axis  # tests/ is on sys.path under pytest

from valueprobe.model.load import load
from valueprobe.probe.axis import ValueAxis


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_lm_factory):
    """A tiny llama on disk and a planted probe fitted to it (fingerprint of the reloaded model)."""
    lm = tiny_lm_factory("llama")
    path = tmp_path_factory.mktemp("model")
    lm.model.save_pretrained(path)
    lm.tokenizer.save_pretrained(path)
    reloaded = load(str(path))
    axis = dataclasses.replace(planted_axis(reloaded), model_id=str(path), fingerprint=reloaded.fingerprint)
    probe = tmp_path_factory.mktemp("probe") / "p"
    axis.save(probe)
    return str(path), probe, axis, reloaded


def test_trace_writes_html_and_csv(saved, tmp_path, capsys):
    model, probe, axis, lm = saved
    out = tmp_path / "tr"
    code, stdout, err = run(
        [
            "trace",
            "--probe",
            str(probe),
            "--model",
            model,
            "--prompt",
            "Is 7 prime?",
            "--generate",
            "5",
            "--alpha",
            "1.5",
            "--read-layers",
            "2",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert code == 0, err
    page = (out / "trace.html").read_text()
    assert "Plotly.newPlot" in page and 'src="http' not in page and "<span" in page  # plotly.js inlined
    rows = list(csv.DictReader((out / "trace.csv").open()))
    parts = [r["part"] for r in rows]
    assert parts.count("generated") == 5 and parts[0] == "prompt"
    gen = [r for r in rows if r["part"] == "generated"]
    read = "resid_post[1], after the addition"  # the read point, named in the CSV, the page and the table
    assert read in page and read in stdout
    assert all(float(r["alpha"]) == 1.5 for r in gen[:-1]) and math.isnan(float(gen[-1][read]))
    # the prompt's values, read after the addition on every position: the unsteered score + α, exactly
    ids = lm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Is 7 prime?"}], tokenize=False, add_generation_prompt=True
    )
    enc = lm.tokenizer(ids, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        hs = lm.model(**enc, output_hidden_states=True).hidden_states[2][0]
    want = axis.score(hs, 1) + 1.5
    got = torch.tensor([float(r[read]) for r in rows if r["part"] == "prompt"])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    # --raw: the prompt as typed, no template; --value-at before: the unsteered score
    raw = tmp_path / "raw"
    args = ["trace", "--probe", str(probe), "--model", model, "--prompt", "Is 7 prime?", "--out", str(raw)]
    code, _, err = run([*args, "--raw", "--alpha", "1.5", "--value-at", "before"], capsys)
    assert code == 0, err
    rows = list(csv.DictReader((raw / "trace.csv").open()))
    enc = lm.tokenizer("Is 7 prime?", return_tensors="pt")
    assert [r["token"] for r in rows] == [lm.tokenizer.decode([t]) for t in enc["input_ids"][0].tolist()]
    with torch.no_grad():
        hs = lm.model(**enc, output_hidden_states=True).hidden_states[2][0]
    got = torch.tensor([float(r["resid_post[1], before the addition"]) for r in rows])
    torch.testing.assert_close(got, axis.score(hs, 1), atol=1e-4, rtol=0)


def _one_line(code: int, err: str) -> str:
    assert code == 2, err
    # Progress bars (model loading) may come first; the failure itself is exactly one line.
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith(("Loading weights", "\r"))]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def test_trace_bad_input(saved, tmp_path, tiny_lm_factory, capsys):
    model, probe, axis, _ = saved
    out = tmp_path / "never"
    base = ["trace", "--probe", str(probe), "--model", model, "--out", str(out)]
    assert "prompt is empty" in _one_line(*run([*base, "--prompt", "  "], capsys)[::2])
    for n in ("0", "-3"):
        assert "--generate" in _one_line(*run([*base, "--prompt", "hi", "--generate", n], capsys)[::2])
    assert "no layer 5" in _one_line(*run([*base, "--prompt", "hi", "--layer", "5"], capsys)[::2])
    no_norm = dataclasses.replace(axis, mean_norm=torch.full((len(axis.layers),), float("nan")))
    no_norm.save(tmp_path / "nonorm")
    msg = _one_line(
        *run([*base[:2], str(tmp_path / "nonorm"), *base[3:], "--prompt", "hi", "--unit", "norm"], capsys)[
            ::2
        ]
    )
    assert "mean residual norm" in msg
    other = tiny_lm_factory("llama", d_model=32)
    odir = tmp_path / "other"
    other.model.save_pretrained(odir)
    other.tokenizer.save_pretrained(odir)
    capsys.readouterr()  # the save's own progress bars
    msg = _one_line(
        *run(
            ["trace", "--probe", str(probe), "--model", str(odir), "--out", str(out), "--prompt", "hi"],
            capsys,
        )[::2]
    )
    assert "d_model" in msg
    assert not out.exists()
    assert isinstance(ValueAxis.load(probe), ValueAxis)
