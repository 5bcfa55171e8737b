"""Export / import of steering vectors, checked with the other projects' own code.

Run: ``HF_HUB_OFFLINE=1 python -m pytest -q tests/test_interop.py`` (``-m slow`` for the default model)
References: repeng's ``ControlVector.import_gguf`` / ``ControlModel.set_control`` and its own
``export_gguf`` (byte for byte), steering-vectors' ``SteeringVector.apply``, and llama.cpp's loader
rules (``common_control_vector_load_one``, ``llama_adapter_cvec``) replayed with the ``gguf``
reader and a plain forward hook. The same hidden-state delta as ``vp.steer`` is the criterion.

repeng 0.4.0 pins numpy<2 and steering-vectors 0.12.2 pins transformers<5, so neither can sit in
valueprobe's test extra; ``.ci/run`` installs them with ``--no-deps`` and the tests that need them
skip where they are missing.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from conftest import build_model, run_cli
from safetensors.torch import load_file
from test_cli_faults import one_line

from valueprobe.errors import ValueprobeError
from valueprobe.model.load import wrap
from valueprobe.probe.axis import ValueAxis
from valueprobe.steering.hook.handle import steer
from valueprobe.steering.hook.interop import (
    ControlVector,
    control_vector,
    import_axis,
    read_control_vector,
    write_control_vector,
)
from valueprobe.steering.hook.spec import SteeringSpec

PROMPT = "Wait, that's not right. Let me recompute: 12 * 7 = 84."


def planted_axis(lm, *, site: str = "resid_post", seed: int = 3) -> ValueAxis:
    n, d = lm.n_layers, lm.d_model
    v = torch.randn(n, d, generator=torch.Generator().manual_seed(seed))
    return ValueAxis(
        directions=v / v.norm(dim=1, keepdim=True),
        layers=tuple(range(n)),
        mu=torch.full((n,), 0.2),
        sigma=torch.linspace(0.5, 1.5, n),
        mean_norm=torch.full((n,), 9.0),
        best_layer=1,
        site=site,
        method="planted",
        model_id=lm.model_id,
        fingerprint=lm.fingerprint,
        d_model=d,
    )


@pytest.fixture
def own_lm(tiny_tokenizer):
    """A private tiny llama: repeng swaps the model's blocks, so the shared cached models stay out of it."""
    model = build_model("llama", len(tiny_tokenizer), n_layers=4, d_model=64, seed=7)
    return wrap(model, tiny_tokenizer, model_id="tiny-llama-interop")


@pytest.fixture
def repeng(monkeypatch):
    # repeng 0.4.0 annotates with np.float_, which numpy 2 removed; put the alias back so its own code imports
    monkeypatch.setattr(np, "float_", np.float64, raising=False)
    return pytest.importorskip("repeng")


def _hidden(lm, text: str = PROMPT) -> tuple[torch.Tensor, ...]:
    """Every ``hidden_states`` entry, then the logits."""
    ids = lm.tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        out = lm.model(input_ids=ids, output_hidden_states=True)
    return (*out.hidden_states, out.logits)


def _steered_delta(lm, axis, alpha, **kw) -> list[torch.Tensor]:
    base = _hidden(lm)
    with steer(lm, SteeringSpec(axis, **kw), alpha):
        got = _hidden(lm)
    return [g - b for g, b in zip(got, base, strict=True)]


def _assert_same_delta(
    got: list[torch.Tensor], want: list[torch.Tensor], *, last_block: int, atol: float = 1e-5
) -> None:
    """Equal deltas in what the network receives after the last steered block, and in the logits.

    transformers records ``hidden_states[i + 1]`` on block ``i`` itself, so whether that entry
    shows an addition at block ``i``'s output depends on who made it (repeng wraps the block in a
    ControlModule, the llama.cpp replay hooks it after transformers' recorder, a valueprobe
    ``resid_pre`` hook adds at the next block's input). ``hidden_states[last_block + 2:]`` and the
    logits do not depend on that, and differ if any vector went to another block or sign.
    """
    assert any(float(d.abs().max()) > 1e-2 for d in want), "the reference steering moved nothing"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if i < last_block + 2:
            continue
        torch.testing.assert_close(g, w, atol=atol, rtol=1e-5, msg=f"hidden_states[{i}] differ")


def _llama_cpp_apply(lm, path: Path, strength: float):
    """Replay llama.cpp on a GGUF: its loader's checks, then ``cur + tensors[il]`` after block ``il``."""
    reader = gguf.GGUFReader(path)
    data: dict[int, torch.Tensor] = {}
    for t in reader.tensors:
        prefix, _, index = t.name.partition(".")
        assert prefix == "direction" and int(index) > 0  # llama.cpp rejects anything else, and layer 0
        assert t.tensor_type == gguf.GGMLQuantizationType.F32 and len(t.shape) == 1
        data[int(index)] = data.get(int(index), 0) + torch.from_numpy(np.array(t.data)) * strength
    hooks = []
    for il, vec in data.items():

        def add(_m, _i, out, vec=vec):
            if isinstance(out, tuple):
                return (out[0] + vec, *out[1:])
            return out + vec

        hooks.append(lm.layers[il].register_forward_hook(add))
    return hooks


# --- the file layouts ---


def test_gguf_is_what_llama_cpp_and_repeng_read(tmp_path, tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    axis = planted_axis(lm)
    cv = control_vector(lm, SteeringSpec(axis, layers=[1, 2]), alpha=2.0)
    path = write_control_vector(cv, tmp_path / "v.gguf", to="gguf-control-vector")
    reader = gguf.GGUFReader(path)
    fields = {
        k: bytes(f.parts[-1]) for k, f in reader.fields.items() if k.startswith(("general.", "control"))
    }
    assert fields["general.architecture"] == b"controlvector"
    assert fields["controlvector.model_hint"] == b"llama"
    assert int(reader.get_field("controlvector.layer_count").parts[-1][0]) == 2
    names = {t.name: t for t in reader.tensors}
    assert sorted(names) == ["direction.1", "direction.2"]
    for layer in (1, 2):
        t = names[f"direction.{layer}"]
        assert t.tensor_type == gguf.GGMLQuantizationType.F32 and list(t.shape) == [lm.d_model]
        # α·σ·v̂ with the planted σ of that layer
        want = 2.0 * float(axis.sigma[layer]) * axis.direction(layer)
        torch.testing.assert_close(torch.from_numpy(np.array(t.data)), want, atol=1e-6, rtol=0)


def test_gguf_bytes_equal_repengs_own_export(tmp_path, tiny_lm_factory, repeng):
    lm = tiny_lm_factory("llama")
    cv = control_vector(lm, SteeringSpec(planted_axis(lm), layers="0:3"))
    ours = write_control_vector(cv, tmp_path / "ours.gguf", to="repeng")
    theirs = tmp_path / "theirs.gguf"
    directions = {layer: cv.vectors[layer].numpy() for layer in cv.layers}
    repeng.ControlVector(model_type="llama", directions=directions).export_gguf(theirs)
    assert ours.read_bytes() == theirs.read_bytes()


def test_llama_cpp_refuses_block_0_and_resid_pre_0_has_no_key(tmp_path, tiny_lm_factory):
    lm = tiny_lm_factory("llama")
    cv = control_vector(lm, SteeringSpec(planted_axis(lm), layers=[0, 1]))
    with pytest.raises(ValueprobeError, match="never steers block 0"):
        write_control_vector(cv, tmp_path / "v.gguf", to="gguf-control-vector")
    assert not (tmp_path / "v.gguf").exists()
    write_control_vector(cv, tmp_path / "r.gguf", to="repeng")  # repeng steers block 0
    with pytest.raises(ValueprobeError, match="embedding output"):
        control_vector(lm, SteeringSpec(planted_axis(lm, site="resid_pre"), layers=0))


# --- the same hidden-state delta through each project's own API ---


@pytest.mark.parametrize("site", ["resid_post", "resid_pre"])
def test_repeng_steers_as_vp_steer(tmp_path, own_lm, repeng, site):
    lm, axis = own_lm, planted_axis(own_lm, site=site)
    layers, alpha, coeff = [1, 3], 1.5, -2.0
    path = write_control_vector(
        control_vector(lm, SteeringSpec(axis, layers=layers), alpha=alpha), tmp_path / "v.gguf", to="repeng"
    )
    want = _steered_delta(lm, axis, alpha * coeff, layers=layers)
    vector = repeng.ControlVector.import_gguf(str(path))
    # resid_pre[L] is block L-1's output: repeng's key
    assert sorted(vector.directions) == [x - (site == "resid_pre") for x in layers]
    base = _hidden(lm)
    model = repeng.ControlModel(lm.model, sorted(vector.directions))
    try:
        model.set_control(vector, coeff)
        got = _hidden(lm)
    finally:
        model.unwrap()
    _assert_same_delta(
        [g - b for g, b in zip(got, base, strict=True)], want, last_block=max(vector.directions)
    )


def test_steering_vectors_steers_as_vp_steer(tmp_path, own_lm):
    sv = pytest.importorskip("steering_vectors")
    lm, axis = own_lm, planted_axis(own_lm)
    cv = control_vector(lm, SteeringSpec(axis, layers="1:3", unit="norm"), alpha=1.0)
    path = write_control_vector(cv, tmp_path / "v.safetensors", to="steering-vectors")
    vector = sv.SteeringVector({int(k): v for k, v in load_file(str(path)).items()}, "decoder_block")
    want = _steered_delta(lm, axis, 3.0, layers="1:3", unit="norm")
    base = _hidden(lm)
    with vector.apply(lm.model, multiplier=3.0):
        got = _hidden(lm)
    _assert_same_delta([g - b for g, b in zip(got, base, strict=True)], want, last_block=2)


def test_llama_cpp_rules_steer_as_vp_steer(tmp_path, own_lm):
    lm, axis = own_lm, planted_axis(own_lm, site="resid_pre")
    path = write_control_vector(
        control_vector(lm, SteeringSpec(axis, layers=[2, 3])), tmp_path / "v.gguf", to="gguf-control-vector"
    )
    want = _steered_delta(lm, axis, 2.5, layers=[2, 3])
    base = _hidden(lm)
    hooks = _llama_cpp_apply(lm, path, 2.5)  # --control-vector-scaled v.gguf 2.5
    try:
        got = _hidden(lm)
    finally:
        for h in hooks:
            h.remove()
    _assert_same_delta([g - b for g, b in zip(got, base, strict=True)], want, last_block=2)


# --- import ---


def test_import_round_trip_steers_as_the_file(tmp_path, own_lm):
    lm, axis = own_lm, planted_axis(own_lm, site="resid_pre")
    cv = control_vector(
        lm, SteeringSpec(axis, layers=[2, 3], unit="raw")
    )  # unit vectors, as repeng's PCA gives
    path = write_control_vector(cv, tmp_path / "v.gguf", to="gguf-control-vector")
    got = import_axis(lm, read_control_vector(path), source=str(path))
    assert got.layers == (1, 2) and got.site == "resid_post"  # resid_pre[L] came back as resid_post[L-1]
    torch.testing.assert_close(got.directions, axis.directions[2:], atol=1e-6, rtol=0)
    assert not got.calibrated(1)  # σ-scores wait for calibrate
    got.save(tmp_path / "probe")
    again = ValueAxis.load(tmp_path / "probe", lm=lm)
    assert again.metrics["control_vector"]["norms"] == pytest.approx({"1": 1.0, "2": 1.0})
    _assert_same_delta(
        _steered_delta(lm, again, 2.0, layers=[1, 2], unit="raw"),
        _steered_delta(lm, axis, 2.0, layers=[2, 3], unit="raw"),
        last_block=2,
    )


def test_import_single_layer_keeps_its_norm_as_scale(tmp_path, own_lm):
    lm, axis = own_lm, planted_axis(own_lm)
    path = write_control_vector(
        control_vector(lm, SteeringSpec(axis, layers=2)), tmp_path / "v.gguf", to="repeng"
    )
    got = import_axis(lm, read_control_vector(path))
    assert got.scale == pytest.approx(float(axis.sigma[2]))  # the file holds σ·v̂
    # raw α = s on the import adds what the file adds at strength s: α = s σ on the axis
    _assert_same_delta(
        _steered_delta(lm, got, -3.0, layers=2, unit="raw"),
        _steered_delta(lm, axis, -3.0, layers=2),
        last_block=2,
    )


def test_import_reads_repengs_file(tmp_path, own_lm, repeng):
    v = torch.randn(3, own_lm.d_model, generator=torch.Generator().manual_seed(0)) * 4
    directions = {i + 1: v[i].numpy() for i in range(3)}
    path = tmp_path / "repeng.gguf"
    repeng.ControlVector(model_type="llama", directions=directions).export_gguf(path)
    axis = import_axis(own_lm, read_control_vector(path))
    norms = v.norm(dim=1)
    torch.testing.assert_close(axis.directions, v / norms[:, None], atol=1e-6, rtol=0)
    assert axis.best_layer == 1 + int(torch.argmax(norms))
    assert axis.scale == 1.0  # the norms differ by layer: they stay in the metrics
    assert axis.metrics["control_vector"]["norms"] == pytest.approx(
        {str(i + 1): float(n) for i, n in enumerate(norms)}
    )


def test_import_refuses_other_width_architecture_and_files(tmp_path, tiny_lm_factory):
    llama = tiny_lm_factory("llama")
    path = write_control_vector(
        control_vector(llama, SteeringSpec(planted_axis(llama), layers=1)), tmp_path / "v.gguf", to="repeng"
    )
    cv = read_control_vector(path)
    with pytest.raises(ValueprobeError, match="width 64 but .* d_model 32"):
        import_axis(tiny_lm_factory("llama", d_model=32), cv)
    with pytest.raises(ValueprobeError, match="architecture 'llama' but .* is 'gpt2'"):
        import_axis(tiny_lm_factory("gpt2"), cv)
    assert import_axis(tiny_lm_factory("gpt2"), cv, force=True).layers == (1,)
    other = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(other, "llama")
    writer.add_tensor("token_embd.weight", np.zeros(4, dtype=np.float32))
    (
        writer.write_header_to_file(),
        writer.write_kv_data_to_file(),
        writer.write_tensors_to_file(),
        writer.close(),
    )
    with pytest.raises(ValueprobeError, match="not a control vector: its general.architecture is 'llama'"):
        read_control_vector(other)
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf")
    with pytest.raises(ValueprobeError, match="not a readable GGUF"):
        read_control_vector(tmp_path / "junk.gguf")


def test_control_vector_record_is_keyed_by_block():
    cv = ControlVector(vectors={3: torch.ones(8), 1: torch.zeros(8)}, model_hint="llama")
    assert cv.layers == [1, 3] and cv.d_model == 8


# --- the CLI ---


def test_cli_export_then_import(tmp_path, tiny_dir, capsys):
    lm_axis = tmp_path / "probe"
    from valueprobe.model.load import load

    lm = load(tiny_dir)
    planted_axis(lm).save(lm_axis)
    out = tmp_path / "v.gguf"
    code, stdout, err = run_cli(
        ["export", "--probe", str(lm_axis), "--model", tiny_dir, "--to", "gguf-control-vector",
         "--layers", "1:3", "--alpha", "2", "--out", str(out)],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    assert "direction.1" in stdout and out.is_file()
    torch.testing.assert_close(
        read_control_vector(out).vectors[2],
        2.0 * float(planted_axis(lm).sigma[2]) * planted_axis(lm).direction(2),
    )
    code, stdout, err = run_cli(
        ["import", str(out), "--model", tiny_dir, "--out", str(tmp_path / "imp")], capsys
    )
    assert code == 0, err
    assert ValueAxis.load(tmp_path / "imp", lm=lm).layers == (1, 2)


def test_cli_bad_input_is_one_line(tmp_path, tiny_dir, capsys):
    code, _, err = run_cli(
        ["export", "--probe", str(tmp_path), "--to", "onnx", "--out", str(tmp_path / "v.gguf")], capsys
    )
    assert "unknown format 'onnx'" in one_line(code, err)
    path = tmp_path / "wide.gguf"
    write_control_vector(ControlVector({1: torch.ones(48)}, "llama"), path, to="repeng")
    code, _, err = run_cli(["import", str(path), "--model", tiny_dir, "--out", str(tmp_path / "imp")], capsys)
    assert "has width 48 but" in one_line(code, err)


# --- the default model ---


@pytest.mark.slow
def test_default_model_all_three_formats_match_vp_steer(tmp_path, repeng):
    sv = pytest.importorskip("steering_vectors")
    import valueprobe as vp

    lm = vp.load("smollm2-135m")
    axis = vp.ValueAxis.load(Path(__file__).parents[1] / "probes/smollm2-135m-value", lm=lm)
    layers, alpha = [axis.best_layer - 2, axis.best_layer], 4.0
    cv = control_vector(lm, SteeringSpec(axis, layers=layers))
    want = _steered_delta(lm, axis, alpha, layers=layers)
    paths = {
        to: write_control_vector(cv, tmp_path / f"v-{to}", to=to)
        for to in ("repeng", "gguf-control-vector", "steering-vectors")
    }
    last = max(cv.layers)
    base = _hidden(lm)
    hooks = _llama_cpp_apply(lm, paths["gguf-control-vector"], alpha)  # --control-vector-scaled FILE 4
    try:
        _assert_same_delta(
            [g - b for g, b in zip(_hidden(lm), base, strict=True)], want, last_block=last, atol=1e-4
        )
    finally:
        for h in hooks:
            h.remove()
    vector = sv.SteeringVector({int(k): v for k, v in load_file(str(paths["steering-vectors"])).items()})
    with vector.apply(lm.model, multiplier=alpha):
        _assert_same_delta(
            [g - b for g, b in zip(_hidden(lm), base, strict=True)], want, last_block=last, atol=1e-4
        )
    rv = repeng.ControlVector.import_gguf(str(paths["repeng"]))
    model = repeng.ControlModel(lm.model, sorted(rv.directions))
    try:
        model.set_control(rv, alpha)
        _assert_same_delta(
            [g - b for g, b in zip(_hidden(lm), base, strict=True)], want, last_block=last, atol=1e-4
        )
    finally:
        model.unwrap()
    assert torch.equal(_hidden(lm)[-1], base[-1])  # every tool's hooks are gone


def test_the_export_help_names_every_format():
    from valueprobe.cli.interop import FORMAT_NAMES
    from valueprobe.steering.hook.interop import FORMATS

    assert tuple(FORMATS) == FORMAT_NAMES
