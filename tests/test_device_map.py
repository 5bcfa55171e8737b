"""A model split by accelerate's device_map, one layer offloaded to disk, reads and steers as the whole model.

HF_HUB_OFFLINE=1 python -m pytest -q tests/test_device_map.py
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from test_steer_sweep import tiny_axis

from valueprobe.activations.capture import CaptureSettings, capture
from valueprobe.datasets.io import Example
from valueprobe.errors import ValueprobeError
from valueprobe.model.load import check_dtype, load
from valueprobe.steering.decode.generation import generate
from valueprobe.steering.decode.sampling import Decoding
from valueprobe.steering.hook.spec import SteeringSpec

# the tiny llama of conftest (3 blocks): block 1 lives on disk and is paged in for each forward
SPLIT = {
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.layers.2": "cpu",
    "model.norm": "cpu",
    "lm_head": "cpu",
}
EXAMPLES = [
    Example(id=f"e{i}", text=f"The capital of France is Paris {i}. " * (1 + i), label=i % 2, group="g")
    for i in range(4)
]


def test_disk_offloaded_model_captures_and_steers_like_the_whole_model(tiny_dir, tmp_path):
    whole = load(tiny_dir)
    split = load(tiny_dir, device_map=SPLIT, offload_folder=str(tmp_path / "offload"))
    # block 1's weights are not in memory (meta) and accelerate pages them in from disk each forward
    assert split.model.model.layers[1].self_attn.q_proj.weight.device.type == "meta"
    assert split.model.hf_device_map["model.layers.1"] == "disk"
    assert split.fingerprint == whole.fingerprint  # read from the offloaded weights themselves
    a = capture(whole, EXAMPLES, CaptureSettings(layers="all", positions="mean"), progress=False).acts
    b = capture(split, EXAMPLES, CaptureSettings(layers="all", positions="mean"), progress=False).acts
    for layer in a:
        torch.testing.assert_close(b[layer], a[layer], rtol=0, atol=1e-6)
    axis = tiny_axis(whole)
    prompts = ["The capital of France is", "def add(a, b):"]
    kw = dict(alphas=(-4.0, 0.0, 4.0), decoding=Decoding(greedy=True, max_new_tokens=6), progress=False)
    want = [g.text for g in generate(whole, SteeringSpec(axis, layers=[1]), prompts, **kw)]
    got = [g.text for g in generate(split, SteeringSpec(axis, layers=[1]), prompts, **kw)]
    assert got == want
    assert want[0] != want[2]  # the steering changed the greedy text, so the equality above says something


def test_device_map_on_a_model_that_cannot_be_split_is_one_line(tiny_dir, monkeypatch):
    monkeypatch.setattr(transformers.LlamaPreTrainedModel, "_no_split_modules", None)
    with pytest.raises(ValueprobeError, match="is not sharded by it") as got:
        load(tiny_dir, device_map="auto")
    assert "\n" not in str(got.value)


def test_a_dtype_the_device_cannot_run_is_one_line(monkeypatch):
    check_dtype(torch.float32, "cpu")
    real = torch.Tensor.__matmul__

    def no_half(self, other):
        if self.dtype == torch.float16:
            raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'Half'")
        return real(self, other)

    monkeypatch.setattr(torch.Tensor, "__matmul__", no_half)
    with pytest.raises(
        ValueprobeError, match=r"--model-dtype float16: cpu cannot run it \(.*Half.*\); use float32"
    ):
        check_dtype(torch.float16, "cpu")


def test_cli_capture_device_map(tiny_dir, tmp_path, capsys, monkeypatch):
    """capture --device-map auto (accelerate places the tiny model; here all on the CPU) writes the
    store the plain capture writes; on a class accelerate cannot split it is one line, before any work."""
    from conftest import run_cli

    from valueprobe.activations.store import ActivationStore
    from valueprobe.datasets.io import write_jsonl

    write_jsonl(tmp_path / "d.jsonl", EXAMPLES)
    argv = ["capture", "--model", tiny_dir, "--data", str(tmp_path / "d.jsonl"), "--positions", "mean"]
    argv += ["--dtype", "float32"]
    assert run_cli([*argv, "--out", str(tmp_path / "plain")], capsys)[0] == 0
    code, _, err = run_cli([*argv, "--out", str(tmp_path / "mapped"), "--device-map", "auto"], capsys)
    assert code == 0, err
    a, b = ActivationStore.open(tmp_path / "plain"), ActivationStore.open(tmp_path / "mapped")
    for layer in a.manifest.layers:
        np.testing.assert_allclose(b.acts(layer), a.acts(layer), rtol=0, atol=1e-6)
    monkeypatch.setattr(transformers.LlamaPreTrainedModel, "_no_split_modules", None)
    code, _, err = run_cli([*argv, "--out", str(tmp_path / "refused"), "--device-map", "auto"], capsys)
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and "is not sharded by it" in lines[0], err
    assert not (tmp_path / "refused").exists()
