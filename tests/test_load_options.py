"""The model-loading options every command shares (--device-map, --model-dtype, --offload-folder),
end to end on the tiny llama of conftest saved to disk.

Stated tolerance for bfloat16 against float32, the one tests/test_bf16_models.py states for a captured
residual: bf16 keeps 8 significant bits, and a 3-block forward compounds a few dozen roundings, so a
figure computed from the residuals (each example's val and σ-score, each group's shift, each layer's
fitted direction) moves by at most 3% of its size. The reads themselves (cos, projection, σ) run in
float32 or float64 whatever the model's dtype, so nothing else is lost.

HF_HUB_OFFLINE=1 python -m pytest -q tests/test_load_options.py
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from conftest import run_cli
from test_bf16_models import CAPTURE_TOL
from test_shift import saved  # noqa: F401  (the module fixture: base, tuned, probe, data on disk)
from test_steer_sweep import chats, tiny_axis

from valueprobe.activations.store import ActivationStore
from valueprobe.datasets.io import Example, read_jsonl, write_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.model.load import as_dtype, load
from valueprobe.probe.axis import ValueAxis
from valueprobe.steering.decode.generation import encode_prompts
from valueprobe.steering.decode.rows import RowSpec, generate_rows

DATA = Path(__file__).resolve().parents[1] / "data"


def one_line(code: int, err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def probe_and_prompts(tiny_dir, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("loadopts")
    tiny_axis(load(tiny_dir)).save(root / "probe")
    write_jsonl(root / "p.jsonl", chats(4))
    return root / "probe", root / "p.jsonl"


def _steer(tiny_dir: str, probe: Path, prompts: Path, out: Path, *extra: str) -> list[str]:
    argv = ["steer", "--probe", str(probe), "--model", tiny_dir, "--prompts", str(prompts), "--out", str(out)]
    argv += ["--alphas", "-4,0,4", "--max-new-tokens", "4", "--random-directions", "1", "--greedy"]
    return [*argv, "--bootstrap", "20", *extra]


def test_steer_with_device_map_auto_writes_the_plain_generations(
    tiny_dir, probe_and_prompts, tmp_path, capsys
):
    """accelerate places the tiny model (all on the CPU here): the sweep's rows are the plain run's."""
    probe, prompts = probe_and_prompts
    code, _, err = run_cli(_steer(tiny_dir, probe, prompts, tmp_path / "plain"), capsys)
    assert code == 0, err
    argv = _steer(tiny_dir, probe, prompts, tmp_path / "mapped", "--device-map", "auto")
    code, _, err = run_cli([*argv, "--offload-folder", str(tmp_path / "offload")], capsys)
    assert code == 0, err
    want = (tmp_path / "plain" / "generations.jsonl").read_text()
    assert (tmp_path / "mapped" / "generations.jsonl").read_text() == want
    texts = {json.loads(line)["alpha"]: json.loads(line)["text"] for line in want.splitlines()}
    assert len(set(texts.values())) > 1  # the strengths changed the text, so equality says something


def _scores(path: Path) -> dict[str, tuple[float, float]]:
    with open(path / "scores.csv", newline="", encoding="utf-8") as f:
        return {r["id"]: (float(r["val"]), float(r["score"])) for r in csv.DictReader(f)}


def test_score_in_bfloat16_is_float32_within_tolerance(tiny_dir, probe_and_prompts, tmp_path, capsys):
    probe, _ = probe_and_prompts
    data = tmp_path / "d.jsonl"
    write_jsonl(data, [Example(id=f"e{i}", text=f"The capital of France is Paris, {i} times. " * (1 + i % 3),
                               label=i % 2, group="g") for i in range(8)])  # fmt: skip
    argv = ["score", "--probe", str(probe), "--model", tiny_dir, "--data", str(data), "--bootstrap", "0"]
    runs = {}
    for dtype in ("float32", "bfloat16"):
        code, _, err = run_cli([*argv, "--out", str(tmp_path / dtype), "--model-dtype", dtype], capsys)
        assert code == 0, err
        runs[dtype] = _scores(tmp_path / dtype)
    full, half = runs["float32"], runs["bfloat16"]
    assert full.keys() == half.keys()
    a, b = np.array([full[i] for i in full]), np.array([half[i] for i in full])  # [examples, (val, score)]
    relative = np.linalg.norm(b - a, axis=0) / np.linalg.norm(a, axis=0)
    assert (relative <= CAPTURE_TOL).all(), relative  # measured: val 1.2%, score 0.9%
    assert (relative > 0).all()  # really run in bf16


def test_shift_in_bfloat16_is_float32_within_tolerance(saved, tmp_path, capsys):  # noqa: F811
    argv = ["shift", "--probe", str(saved / "probe"), "--base", str(saved / "base"), "--tuned"]
    argv += [str(saved / "tuned"), "--data", str(saved / "data.jsonl"), "--targeted", "alpha"]
    argv += ["--bootstrap", "20", "--n-random", "4", "--batch-size", "4"]
    got = {}
    for dtype in ("float32", "bfloat16"):
        code, _, err = run_cli([*argv, "--out", str(tmp_path / dtype), "--model-dtype", dtype], capsys)
        assert code == 0, err
        got[dtype] = json.loads((tmp_path / dtype / "shift.json").read_text())
    full = {g["group"]: g["shift"] for g in got["float32"]["groups"]}
    half = {g["group"]: g["shift"] for g in got["bfloat16"]["groups"]}
    assert full.keys() == half.keys()
    # the shifts (about 3σ here) move by at most 3% of their size, as a residual does; measured 0.6%
    a, b = np.array([full[k] for k in full]), np.array([half[k] for k in full])
    assert np.linalg.norm(b - a) <= CAPTURE_TOL * np.linalg.norm(a), (full, half)
    assert any(half[k] != full[k] for k in full)  # really run in bf16


def test_capture_bfloat16_model_into_a_bfloat16_store_fits_in_float32(tiny_dir, tmp_path, capsys):
    """--model-dtype is the model's, --dtype the store's: both bf16, the store reads back as float32
    and `fit` fits from it, near the float32 run's axis."""
    write_jsonl(tmp_path / "d.jsonl", read_jsonl(DATA / "icrl.jsonl")[:24])
    argv = ["capture", "--model", tiny_dir, "--data", str(tmp_path / "d.jsonl"), "--positions", "spans"]
    stores = {}
    for model_dtype, dtype in (("float32", "float32"), ("bfloat16", "bfloat16"), ("float32", "bfloat16")):
        store = tmp_path / f"store-{model_dtype}-{dtype}"
        code, _, err = run_cli(
            [*argv, "--out", str(store), "--dtype", dtype, "--model-dtype", model_dtype], capsys
        )
        assert code == 0, err
        stores[model_dtype, dtype] = ActivationStore.open(store)
        assert stores[model_dtype, dtype].manifest.dtype == dtype
        assert stores[model_dtype, dtype].manifest.model_dtype == model_dtype  # the store records both
        assert stores[model_dtype, dtype].acts(1).dtype == np.float32
    # a store of the float32 model does not resume with the bfloat16 one (its rows would mix both)
    store = str(stores["float32", "bfloat16"].path)
    line = one_line(
        *run_cli([*argv, "--out", store, "--dtype", "bfloat16", "--model-dtype", "bfloat16"], capsys)[::2]
    )
    assert "captured with model_dtype='float32', not 'bfloat16'" in line
    manifest = Path(store) / "manifest.json"  # a store from before the record resumes with any
    manifest.write_text(
        json.dumps({k: v for k, v in json.loads(manifest.read_text()).items() if k != "model_dtype"})
    )
    code, _, err = run_cli(
        [*argv, "--out", store, "--dtype", "bfloat16", "--model-dtype", "bfloat16"], capsys
    )
    assert code == 0, err
    # the same stored dtype from a float32 and a bfloat16 model: the model really ran in bf16
    assert not np.array_equal(stores["bfloat16", "bfloat16"].acts(1), stores["float32", "bfloat16"].acts(1))
    axes = {}
    for key in (("float32", "float32"), ("bfloat16", "bfloat16")):
        fit = ["fit", "--store", str(stores[key].path), "--method", "span_diff", "--splits", "2"]
        code, _, err = run_cli([*fit, "--out", str(tmp_path / f"probe-{key[0]}")], capsys)
        assert code == 0, err
        axes[key[0]] = ValueAxis.load(tmp_path / f"probe-{key[0]}")
    full, half = axes["float32"], axes["bfloat16"]
    assert half.directions.dtype == torch.float32
    cos = (full.directions * half.directions).sum(-1)  # unit directions, one per layer
    assert cos.min() > 1 - CAPTURE_TOL, cos  # measured: 1 − cos below 1e-4 at every layer


def _relative(full: np.ndarray, half: np.ndarray) -> float:
    assert full.shape == half.shape and half.size > 0
    return float(np.linalg.norm(half - full) / np.linalg.norm(full))


def test_trace_guide_and_serve_read_a_bfloat16_model_within_tolerance(
    tiny_dir, probe_and_prompts, tmp_path, capsys
):
    """The live reads of a bf16 model: trace's per-token σ, guide's in-forward σ of each fed token,
    and the per-token value serve's hf engine streams (`generate_rows`)."""
    probe, prompts = probe_and_prompts
    trace = [
        "trace",
        "--probe",
        str(probe),
        "--model",
        tiny_dir,
        "--prompt",
        "Is 91 prime? Think it through.",
    ]
    guide = ["guide", "--probe", str(probe), "--model", tiny_dir, "--prompts", str(prompts), "--greedy"]
    guide += ["--n", "1", "--max-new-tokens", "4"]
    values: dict[str, dict[str, np.ndarray]] = {"trace": {}, "guide": {}}
    for dtype in ("float32", "bfloat16"):
        out = tmp_path / f"trace-{dtype}"
        code, _, err = run_cli([*trace, "--out", str(out), "--model-dtype", dtype], capsys)
        assert code == 0, err
        with open(out / "trace.csv", newline="", encoding="utf-8") as f:
            values["trace"][dtype] = np.array([float(r[-1]) for r in list(csv.reader(f))[1:]])
        out = tmp_path / f"guide-{dtype}"
        code, _, err = run_cli([*guide, "--out", str(out), "--model-dtype", dtype], capsys)
        assert code == 0, err
        rows = [json.loads(line) for line in (out / "guide.jsonl").read_text().splitlines()]
        values["guide"][dtype] = np.array([v for r in rows for v in r["candidates"][0]["sigma"]])
    # serve's hf engine: its rows, one steered, through the same generate_rows
    axis = ValueAxis.load(probe)
    values["serve"] = {}
    for dtype in ("float32", "bfloat16"):
        lm = load(tiny_dir, dtype=dtype)
        (ids,) = encode_prompts(lm, ["The capital of France is"])
        specs = [RowSpec(tuple(ids), max_new_tokens=4)] * 2  # one unsteered row, one at α = 2
        runs = generate_rows(lm, axis, specs, [0.0, 2.0])
        values["serve"][dtype] = np.array([v for r in runs for v in r.values])
    for command, got in values.items():
        relative = _relative(got["float32"], got["bfloat16"])
        assert 0 < relative <= CAPTURE_TOL, (command, relative)


# ---- bad input: one line, exit 2, nothing written -------------------------------------------------


def test_an_unknown_model_dtype_is_one_line(tiny_dir, probe_and_prompts, tmp_path, capsys):
    probe, prompts = probe_and_prompts
    line = one_line(
        *run_cli(_steer(tiny_dir, probe, prompts, tmp_path / "o", "--model-dtype", "float8"), capsys)[::2]
    )
    assert "--model-dtype" in line and "'float8' is not one of" in line
    assert not (tmp_path / "o").exists()
    with pytest.raises(ValueprobeError, match="'float8' is not a floating-point torch dtype"):
        as_dtype("float8")


def test_offload_folder_without_device_map_is_one_line(tiny_dir, probe_and_prompts, tmp_path, capsys):
    probe, prompts = probe_and_prompts
    argv = _steer(tiny_dir, probe, prompts, tmp_path / "o", "--offload-folder", str(tmp_path / "off"))
    assert "add --device-map auto" in one_line(*run_cli(argv, capsys)[::2])
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["capture", "score", "steer"])
def test_device_map_under_a_two_rank_torchrun_is_one_line(
    command, tiny_dir, probe_and_prompts, tmp_path, capsys, monkeypatch
):
    """Each rank would spread the whole model over every GPU: refused before the ranks meet (were
    it not, the ranks would be reached: the patched rendezvous fails the test instead of waiting)."""
    probe, prompts = probe_and_prompts
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")

    def reached(*_args, **_kw):
        raise AssertionError("the ranks were reached with --device-map")

    monkeypatch.setattr("valueprobe.sharded.run_ranks", reached)
    out = tmp_path / "o"
    argv = {
        "capture": ["capture", "--model", tiny_dir, "--data", str(prompts), "--out", str(out)],
        "score": [
            "score",
            "--probe",
            str(probe),
            "--model",
            tiny_dir,
            "--data",
            str(prompts),
            "--out",
            str(out),
        ],
        "steer": _steer(tiny_dir, probe, prompts, out),
    }[command]
    line = one_line(*run_cli([*argv, "--device-map", "auto"], capsys)[::2])
    assert "--device-map under torchrun (2 ranks)" in line
    assert not out.exists() and not (tmp_path / "o.parts").exists()


def test_score_device_map_on_a_model_accelerate_cannot_split_is_one_line(
    tiny_dir, probe_and_prompts, tmp_path, capsys, monkeypatch
):
    probe, prompts = probe_and_prompts
    monkeypatch.setattr(transformers.LlamaPreTrainedModel, "_no_split_modules", None)
    out = tmp_path / "o"
    argv = ["score", "--probe", str(probe), "--model", tiny_dir, "--data", str(prompts), "--out", str(out)]
    line = one_line(*run_cli([*argv, "--device-map", "auto"], capsys)[::2])
    assert "is not sharded by it" in line and "drop --device-map" in line
    assert not out.exists()


# ---- dtype auto: the checkpoint's own -------------------------------------------------------------


def test_model_dtype_auto_is_the_checkpoints_own(tiny_dir, tmp_path, monkeypatch):
    whole = load(tiny_dir)
    whole.model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    whole.tokenizer.save_pretrained(tmp_path / "bf16")
    assert load(tiny_dir, dtype="auto").model.dtype == torch.float32
    half = load(str(tmp_path / "bf16"), dtype="auto")
    assert half.model.dtype == torch.bfloat16 and half.fingerprint == whole.fingerprint
    assert load(str(tmp_path / "bf16")).model.dtype == torch.float32  # the default stays float32
    # a device that cannot run the checkpoint's dtype is refused once the config names it
    real = torch.Tensor.__matmul__

    def no_bf16(self, other):
        if self.dtype == torch.bfloat16:
            raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'BFloat16'")
        return real(self, other)

    monkeypatch.setattr(torch.Tensor, "__matmul__", no_bf16)
    with pytest.raises(ValueprobeError, match=r"--model-dtype bfloat16: cpu cannot run it"):
        load(str(tmp_path / "bf16"), dtype="auto")
