"""The store holds exactly what in-memory capture returns, resumes after kill -9, and refuses mismatches."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch

from valueprobe.activations.capture import CaptureSettings, capture
from valueprobe.activations.store import ActivationStore, capture_to_store
from valueprobe.datasets.io import Example, Span
from valueprobe.errors import ValueprobeError
from valueprobe.files import read_safetensors_header
from valueprobe.probe.fit import fit_probe

ROOT = Path(__file__).resolve().parents[1]


def _examples(n: int = 11) -> list[Example]:
    words = ["Paris is nice", "Rome is old", "two plus two is four", "wait, that is wrong", "yes"]
    out = []
    for i in range(n):
        t = f"{words[i % 5]} {i}. " * (1 + i % 3)
        out.append(
            Example(
                id=f"e{i}",
                label=i % 2,
                group=f"g{i % 4}",
                text=t,
                spans=(Span(0, 5, "pre"), Span(5, len(t), "post")),
            )
        )
    return out


def test_store_round_trips_capture(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("llama")
    exs = _examples()
    ref = capture(
        lm, exs, CaptureSettings(layers="all", positions="spans", include_embed=True), progress=False
    )
    store = capture_to_store(
        lm,
        exs,
        tmp_path / "s",
        CaptureSettings(layers="all", positions="spans", batch_size=3, include_embed=True),
        dtype="float32",
        examples_per_shard=4,
        progress=False,
    )
    assert len(list((tmp_path / "s").glob("shard-*.safetensors"))) == 3
    assert store.manifest.complete and store.manifest.n_rows == len(ref.rows) == 2 * len(exs)
    for key in ["embed", 0, 1, 2]:
        np.testing.assert_array_equal(store.acts(key), ref.acts[key].numpy())
    rows = store.rows()
    assert (
        rows.example_id == ref.rows.example_id and rows.span == ref.rows.span and rows.group == ref.rows.group
    )
    np.testing.assert_array_equal(rows.label, ref.rows.label)
    np.testing.assert_array_equal(rows.token_index, ref.rows.token_index)
    arrays, _ = next(store.iter_shards(layers=[1]))
    assert isinstance(arrays[1], np.memmap)


def test_float16_store_is_close(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("gpt2")
    exs = _examples(5)
    ref = capture(lm, exs, CaptureSettings(layers=[0], positions="last"), progress=False)
    store = capture_to_store(
        lm,
        exs,
        tmp_path / "h",
        CaptureSettings(layers=[0], positions="last", include_embed=True),
        dtype="float16",
        progress=False,
    )
    np.testing.assert_allclose(store.acts(0), ref.acts[0].numpy(), rtol=2e-3, atol=2e-3)


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    import conftest
    import safetensors.torch as st
    import valueprobe.activations.store as vs
    from valueprobe.activations.capture import CaptureSettings
    from valueprobe.model.load import wrap
    from test_store import _examples
    tok = conftest.build_tokenizer()
    lm = wrap(conftest.build_model("llama", len(tok)), tok, model_id="tiny-llama")
    calls = []
    real = vs.save_file
    def dying_save(tensors, path, metadata=None):
        calls.append(path)
        if len(calls) == 3:  # third shard: leave a half-written temp file, then die like kill -9
            with open(path, "wb") as f:
                f.write(b"\\x00" * 100)
            os.kill(os.getpid(), signal.SIGKILL)
        real(tensors, path, metadata=metadata)
    vs.save_file = dying_save
    settings = CaptureSettings(layers="all", positions="spans", include_embed=True)
    vs.capture_to_store(lm, _examples(), {out!r}, settings, dtype="float32", examples_per_shard=2, progress=False)
    """
)


def test_kill_9_mid_shard_resumes_to_identical_store(tiny_lm_factory, tmp_path):
    out = tmp_path / "killed"
    code = CHILD.format(tests=str(ROOT / "tests"), out=str(out))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert list(out.glob("*.tmp")), "the child should have died with a half-written shard"
    with pytest.raises(ValueprobeError, match="is partial: its capture stopped after 4 of"):
        ActivationStore.open(out)
    partial = ActivationStore.open(out, allow_partial=True)
    assert (
        not partial.manifest.complete and partial.manifest.n_rows == 2 * 2 * 2
    )  # two complete shards of 2 examples x 2 spans
    partial.acts(0)  # a half-written shard is never read

    lm = tiny_lm_factory("llama")
    resumed = capture_to_store(
        lm,
        _examples(),
        out,
        CaptureSettings(layers="all", positions="spans", include_embed=True),
        dtype="float32",
        examples_per_shard=2,
        progress=False,
    )
    assert resumed.manifest.complete and not list(out.glob("*.tmp"))
    fresh = capture_to_store(
        lm,
        _examples(),
        tmp_path / "fresh",
        CaptureSettings(layers="all", positions="spans", include_embed=True),
        dtype="float32",
        examples_per_shard=2,
        progress=False,
    )
    for key in resumed.manifest.keys:
        np.testing.assert_array_equal(resumed.acts(key), fresh.acts(key))
    assert resumed.rows().example_id == fresh.rows().example_id


class _Clock:
    """``time`` for the capture modules: every reading is one second after the last, so a shard
    closes after ``checkpoint_seconds`` of batches whatever the machine's speed."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 1.0
        return self.now


def test_time_checkpoints_then_resume_give_the_one_pass_store(tiny_lm_factory, tmp_path, monkeypatch):
    """Shards closed by ``checkpoint_seconds`` (mid-block), a stop after the second shard, then a
    resume: the same rows and activations, bit for bit, as one pass without checkpoints, and the
    shards of both runs tile the dataset, none crossing an ``examples_per_shard`` boundary (so both
    runs feed the same batches)."""
    from valueprobe.activations import capture as capture_module
    from valueprobe.activations import store as store_module

    lm = tiny_lm_factory("llama")
    exs = _examples(11)
    settings = CaptureSettings(layers="all", positions="spans", batch_size=2, include_embed=True)
    kw = dict(dtype="float32", examples_per_shard=5)
    out = tmp_path / "checkpointed"
    clock = _Clock()  # one clock: the store sets each deadline, the capture reads it after each batch
    for module in (capture_module, store_module):
        monkeypatch.setattr(module, "time", clock)
    written = []
    real = store_module._write_shard

    def stop_after_two(path, tensors, meta):  # a Ctrl-C between the second and third checkpoint
        if len(written) == 2:
            raise KeyboardInterrupt
        written.append(path.name)
        real(path, tensors, meta)

    monkeypatch.setattr(store_module, "_write_shard", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        capture_to_store(lm, exs, out, settings, checkpoint_seconds=1.5, progress=False, **kw)
    partial = ActivationStore.open(out, allow_partial=True)
    assert [s.examples for s in partial.manifest.shards] == [
        (0, 4),
        (4, 5),
    ]  # a time checkpoint, then a block end
    monkeypatch.setattr(store_module, "_write_shard", real)
    resumed = capture_to_store(lm, exs, out, settings, checkpoint_seconds=1.5, progress=False, **kw)
    ranges = [s.examples for s in resumed.manifest.shards]
    assert ranges == [(0, 4), (4, 5), (5, 9), (9, 10), (10, 11)]
    fresh = capture_to_store(lm, exs, tmp_path / "one-pass", settings, progress=False, **kw)
    assert [s.examples for s in fresh.manifest.shards] == [(0, 5), (5, 10), (10, 11)]
    assert resumed.manifest.complete and resumed.rows().example_id == fresh.rows().example_id
    for key in fresh.manifest.keys:
        np.testing.assert_array_equal(resumed.acts(key), fresh.acts(key))


def test_resume_with_other_settings_fails(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("llama")
    capture_to_store(
        lm,
        _examples(4),
        tmp_path / "s",
        CaptureSettings(layers=[0, 1], positions="last", include_embed=True),
        progress=False,
    )
    with pytest.raises(ValueprobeError, match=r"captured with layers=\[0, 1\], not \[0, 1, 2\]"):
        capture_to_store(
            lm,
            _examples(4),
            tmp_path / "s",
            CaptureSettings(layers="all", positions="last", include_embed=True),
            progress=False,
        )
    other = tiny_lm_factory("qwen2")
    with pytest.raises(ValueprobeError, match="captured with model_id='tiny-llama'"):
        capture_to_store(
            other,
            _examples(4),
            tmp_path / "s",
            CaptureSettings(layers=[0, 1], positions="last", include_embed=True),
            progress=False,
        )
    with pytest.raises(ValueprobeError, match="another dataset"):
        capture_to_store(
            lm,
            _examples(5),
            tmp_path / "s",
            CaptureSettings(layers=[0, 1], positions="last", include_embed=True),
            progress=False,
        )


def test_missing_layer_and_not_a_store(tiny_lm_factory, tmp_path):
    lm = tiny_lm_factory("llama")
    store = capture_to_store(
        lm,
        _examples(3),
        tmp_path / "s",
        CaptureSettings(layers=[1], positions="last", include_embed=True),
        progress=False,
    )
    with pytest.raises(ValueprobeError, match=r"has no layer 2 \(it holds embed, 1\)"):
        store.acts(2)
    with pytest.raises(ValueprobeError, match="not an activation store"):
        ActivationStore.open(tmp_path / "nowhere")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file.txt").write_text("x")
    with pytest.raises(ValueprobeError, match="not an activation store: choose an empty"):
        capture_to_store(
            lm,
            _examples(3),
            tmp_path / "junk",
            CaptureSettings(layers=[1], include_embed=True),
            progress=False,
        )


def test_no_disk_space_leaves_no_partial_shard(tiny_lm_factory, tmp_path, monkeypatch):
    lm = tiny_lm_factory("llama")
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(
        "valueprobe.activations.store.shutil.disk_usage", lambda p: Usage(10**6, 10**6 - 10, 10)
    )
    with pytest.raises(ValueprobeError, match="no space left"):
        capture_to_store(
            lm,
            _examples(3),
            tmp_path / "s",
            CaptureSettings(layers="all", include_embed=True),
            progress=False,
        )
    assert not list((tmp_path / "s").glob("shard-*"))
    # Nothing was captured, so nothing is left: no shard, and no store holding only a manifest.
    assert not (tmp_path / "s").exists()


def test_bfloat16_store_keeps_bf16_and_reads_float32(tiny_lm_factory, tmp_path):
    """bf16 on disk (2 bytes a value), read back exactly as the bf16 rounding of the capture, in
    float32; a probe fits on it in float32 and finds the same direction as on the rounded rows."""
    lm = tiny_lm_factory("llama")
    exs = _examples(12)
    ref = capture(
        lm, exs, CaptureSettings(layers="all", positions="spans", include_embed=True), progress=False
    )
    settings = CaptureSettings(layers="all", positions="spans", include_embed=True)
    kw = dict(examples_per_shard=5, progress=False)
    store = capture_to_store(lm, exs, tmp_path / "bf", settings, dtype="bfloat16", **kw)
    assert store.manifest.dtype == "bfloat16"
    _, header = read_safetensors_header(tmp_path / "bf" / store.manifest.shards[0].file)
    assert header["resid_post.1"]["dtype"] == "BF16"
    for key in store.manifest.keys:
        got = store.acts(key)
        assert got.dtype == np.float32
        assert torch.equal(torch.from_numpy(got), ref.acts[key].to(torch.bfloat16).float())
    full = capture_to_store(lm, exs, tmp_path / "f32", settings, dtype="float32", **kw)
    a = fit_probe(store, method="span_diff", n_splits=2, transfer=False).axis
    b = fit_probe(full, method="span_diff", n_splits=2, transfer=False).axis
    assert a.directions.dtype == torch.float32
    cos = (a.directions * b.directions).sum(1)
    assert cos.min() > 0.999  # bf16 keeps 8 bits of mantissa: the mean difference barely moves


def test_up_front_check_holds_one_block_and_warns_once(tiny_lm_factory, tmp_path, monkeypatch, caplog):
    """Before writing, a capture encodes every example (a bad one fails before any shard), but one
    block of --examples-per-shard at a time, so what it holds does not grow with the dataset; the
    truncations of all blocks make one warning."""
    from valueprobe.activations import store

    lm = tiny_lm_factory("llama")
    exs = [
        Example(id=f"e{i}", label=i % 2, group="g", text="Paris is nice. " * (1 + 20 * (i % 3)))
        for i in range(11)
    ]
    long = [ex.id for ex in exs if len(lm.tokenizer(ex.text)["input_ids"]) > 32]
    assert 3 < len(long) < len(exs)
    seen: list[int] = []
    real = store.encode

    def counting(lm_, examples, **kw):
        seen.append(len(examples))
        return real(lm_, examples, **kw)

    monkeypatch.setattr(store, "encode", counting)
    with caplog.at_level("WARNING", logger="valueprobe"):
        capture_to_store(
            lm,
            exs,
            tmp_path / "s",
            CaptureSettings(positions="last", max_length=32, include_embed=True),
            examples_per_shard=3,
            progress=False,
        )
    assert max(seen) <= 3 and sum(seen) == 2 * len(exs)  # each block checked, then captured
    warnings = [r.getMessage() for r in caplog.records if "truncated" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"truncated {len(long)} of 11 examples to max_length 32 tokens")
    assert f"(first: {long[0]!r}" in warnings[0]
