"""Sharded capture: N parts merge into the store one process captures; parts that don't belong are refused."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import run_cli
from hypothesis import given
from hypothesis import strategies as st

from valueprobe.activations import parts as parts_module
from valueprobe.activations import store as store_module
from valueprobe.activations.capture import CaptureSettings
from valueprobe.activations.store import ActivationStore, capture_to_store
from valueprobe.datasets.io import Example, Span, write_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.sharded import merge, rank_device
from valueprobe.vocab import ShardSpec

CAPTURE = CaptureSettings(layers="all", positions="spans", batch_size=3, include_embed=True)
STORE = dict(dataset_sha256="d" * 64, progress=False)


def _examples(n: int = 11) -> list[Example]:
    words = ["Paris is nice", "Rome is old", "two plus two is four", "wait, that is wrong", "yes"]
    out = []
    for i in range(n):
        t = f"{words[i % 5]} {i}. " * (1 + i % 3)
        spans = (Span(0, 5, "pre"), Span(5, len(t), "post"))
        out.append(Example(id=f"e{i}", label=i % 2, group=f"g{i % 4}", text=t, spans=spans))
    return out


def _parts(lm, tmp: Path, n_parts: int, **kw) -> list[Path]:
    """Capture every part, last shard first (the order the jobs finish in must not matter)."""
    paths = [tmp / f"part{i}" for i in range(n_parts)]
    for i in reversed(range(n_parts)):
        capture_to_store(
            lm,
            _examples(),
            paths[i],
            CAPTURE,
            shard=ShardSpec(i, n_parts),
            **STORE,
            **kw,
        )
    return paths


def assert_same_store(a: ActivationStore, b: ActivationStore) -> None:
    """Every layer tensor and every row column equal, and the same shard files byte for byte."""
    assert a.manifest.keys == b.manifest.keys and a.manifest.n_rows == b.manifest.n_rows
    for key in a.manifest.keys:
        assert torch.equal(torch.from_numpy(a.acts(key)), torch.from_numpy(b.acts(key))), key
    ra, rb = a.rows(), b.rows()
    assert (ra.example_id, ra.group, ra.span) == (rb.example_id, rb.group, rb.span)
    for col in ("label", "token_index", "n_tokens"):
        assert torch.equal(torch.from_numpy(getattr(ra, col)), torch.from_numpy(getattr(rb, col))), col
    for sa, sb in zip(a.manifest.shards, b.manifest.shards, strict=True):
        assert (a.path / sa.file).read_bytes() == (b.path / sb.file).read_bytes()


@pytest.mark.parametrize(
    ("n_parts", "per_shard", "dtype"),
    [(3, 2, "float32"), (2, 4, "float16"), (5, 4, "float32")],  # 5 parts of 3 blocks: two are empty
)
def test_merged_parts_equal_one_process_capture(tiny_lm_factory, tmp_path, n_parts, per_shard, dtype):
    lm = tiny_lm_factory("llama")
    kw = dict(examples_per_shard=per_shard, dtype=dtype)
    one = capture_to_store(lm, _examples(), tmp_path / "one", CAPTURE, **STORE, **kw)
    paths = _parts(lm, tmp_path, n_parts, **kw)
    parts = [ActivationStore.open(p) for p in paths]
    assert [p.manifest.part for p in parts] == [ShardSpec(i, n_parts) for i in range(n_parts)]
    assert all(p.manifest.dataset == one.manifest.dataset for p in parts)
    assert sum(p.manifest.n_rows for p in parts) == one.manifest.n_rows
    merged = merge(tmp_path / "merged", paths[::-1])
    assert merged.manifest == one.manifest  # the same shards, ranges, rows and settings
    assert_same_store(merged, one)


def test_a_part_resumes_from_its_own_checkpoints(tiny_lm_factory, tmp_path, monkeypatch):
    lm = tiny_lm_factory("llama")
    one = capture_to_store(
        lm,
        _examples(),
        tmp_path / "one",
        CAPTURE,
        examples_per_shard=2,
        **STORE,
    )
    real, calls = store_module.save_file, []

    def dies_on_second(tensors, path, metadata=None):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(tensors, path, metadata=metadata)

    monkeypatch.setattr(store_module, "save_file", dies_on_second)
    part1 = tmp_path / "part1"
    with pytest.raises(KeyboardInterrupt):
        capture_to_store(
            lm,
            _examples(),
            part1,
            CAPTURE,
            shard=ShardSpec(1, 2),
            examples_per_shard=2,
            **STORE,
        )
    stopped = ActivationStore.open(part1, allow_partial=True).manifest
    assert [s.examples for s in stopped.shards] == [(6, 8)]  # blocks 3..5 of 6 are shard 1/2's
    with pytest.raises(ValueprobeError, match=f"part {part1} .shard 1/2. is partial"):
        merge(tmp_path / "merged", [part1, tmp_path / "part0"])
    monkeypatch.setattr(store_module, "save_file", real)
    capture_to_store(
        lm,
        _examples(),
        part1,
        CAPTURE,
        shard=ShardSpec(1, 2),
        examples_per_shard=2,
        **STORE,
    )
    capture_to_store(
        lm,
        _examples(),
        tmp_path / "part0",
        CAPTURE,
        shard=ShardSpec(0, 2),
        examples_per_shard=2,
        **STORE,
    )
    assert_same_store(merge(tmp_path / "merged", [tmp_path / "part0", part1]), one)


@pytest.fixture
def three_parts(tiny_lm_factory, tmp_path) -> list[Path]:
    return _parts(tiny_lm_factory("llama"), tmp_path, 3, examples_per_shard=4)


def _edit_manifest(path: Path, **fields) -> None:
    raw = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps({**raw, **fields}))


def test_parts_that_do_not_belong_together_are_refused(tiny_lm_factory, three_parts, tmp_path):
    p0, p1, p2 = three_parts
    out = tmp_path / "merged"

    def refused(parts: list[Path], match: str) -> None:
        with pytest.raises(ValueprobeError, match=match):
            merge(out, parts)
        assert not out.exists() and not list(tmp_path.glob(".merged.tmp-*"))

    refused([p0, p2], "shard 1/3 is missing")
    refused([p0, p1, p1, p2], f"parts {p1} and {p1} are both shard 1/3")
    other = tmp_path / "other-model"
    capture_to_store(
        tiny_lm_factory("qwen2"),
        _examples(),
        other,
        CAPTURE,
        shard=ShardSpec(1, 3),
        examples_per_shard=4,
        **STORE,
    )
    refused([p0, other, p2], f"part {other} was captured from another model")
    layers = tmp_path / "other-layers"
    capture_to_store(
        tiny_lm_factory("llama"),
        _examples(),
        layers,
        replace(CAPTURE, layers=[0]),
        shard=ShardSpec(1, 3),
        examples_per_shard=4,
        **STORE,
    )
    refused([p0, layers, p2], rf"part {layers} was captured with layers=\[0\], not \[0, 1, 2\]")
    split = tmp_path / "split2"
    capture_to_store(
        tiny_lm_factory("llama"),
        _examples(),
        split,
        CAPTURE,
        shard=ShardSpec(1, 2),
        examples_per_shard=4,
        **STORE,
    )
    refused([p0, split, p2], f"part {split} is shard 1/2, of another split")
    data = tmp_path / "other-data"
    shutil.copytree(p1, data)
    _edit_manifest(data, dataset={"path": "x.jsonl", "sha256": "e" * 64, "n_examples": 11})
    refused([p0, data, p2], f"part {data} was captured from another dataset")
    unreadable = tmp_path / "bad-fingerprint"
    shutil.copytree(p1, unreadable)
    _edit_manifest(unreadable, fingerprint="not-a-fingerprint")
    refused([p0, unreadable, p2], f"part {unreadable}: unreadable model fingerprint")
    whole = tmp_path / "whole"
    capture_to_store(
        tiny_lm_factory("llama"),
        _examples(),
        whole,
        CAPTURE,
        examples_per_shard=4,
        **STORE,
    )
    refused([p0, whole, p2], f"part {whole} is a whole store")
    (p2 / "shard-00000.safetensors").write_bytes(b"\0" * 10)
    refused([p0, p1, p2], f"part {p2}: shard")
    with pytest.raises(ValueprobeError, match="is one of its parts"):
        merge(p0, [p0, p1, p2])


def test_merge_is_atomic(three_parts, tmp_path, monkeypatch):
    out = tmp_path / "merged"
    real, copied = parts_module.link_or_copy, []

    def dies_on_third(src, dst):
        copied.append(dst)
        if len(copied) == 3:
            raise OSError(28, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(parts_module, "link_or_copy", dies_on_third)
    with pytest.raises(ValueprobeError, match="no space left"):
        merge(out, three_parts)
    assert not out.exists() and not list(tmp_path.glob(".merged.tmp-*"))


@pytest.mark.parametrize("bad", ["3/2", "0/0", "two/4", "1", "-1/2"])
def test_bad_shard_is_one_line_exit_2(bad, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    write_jsonl(data, _examples(2))
    code, _, err = run_cli(
        [
            "capture",
            "--model",
            "no/such-model",
            "--data",
            str(data),
            "--out",
            str(tmp_path / "s"),
            "--shard",
            bad,
        ],
        capsys,
    )
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "--shard" in lines[0], err
    assert not (tmp_path / "s").exists()


def test_cli_shard_and_merge(tiny_dir, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    write_jsonl(data, _examples())
    common = [
        "capture",
        "--model",
        tiny_dir,
        "--data",
        str(data),
        "--positions",
        "spans",
        "--examples-per-shard",
        "3",
    ]
    assert run_cli([*common, "--out", str(tmp_path / "one")], capsys)[0] == 0
    for i in (1, 0):
        code, out, err = run_cli([*common, "--out", str(tmp_path / f"p{i}"), "--shard", f"{i}/2"], capsys)
        assert code == 0, err
        assert f"{i}/2" in out
    code, out, err = run_cli(
        ["merge", str(tmp_path / "m"), str(tmp_path / "p0"), str(tmp_path / "p1")], capsys
    )
    assert code == 0 and "merged 2 parts" in out, err
    assert_same_store(ActivationStore.open(tmp_path / "m"), ActivationStore.open(tmp_path / "one"))
    code, _, err = run_cli(["merge", str(tmp_path / "m2"), str(tmp_path / "p0")], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "shard 1/2 is missing" in lines[0], err


@given(n=st.integers(0, 500), block=st.integers(1, 40), count=st.integers(1, 12))
def test_shards_tile_the_dataset_in_whole_blocks(n, block, count):
    ranges = [ShardSpec(i, count).examples(n, block=block) for i in range(count)]
    assert [i for r in ranges for i in r] == list(range(n))  # every example once, in order
    assert all(r.start % block == 0 for r in ranges if r)  # parts start on block boundaries
    assert ShardSpec.parse(str(ShardSpec(count - 1, count))) == ShardSpec(count - 1, count)


def test_torchrun_environment_names_the_shard_and_gpu():
    assert ShardSpec.from_env({"RANK": "3", "WORLD_SIZE": "8"}) == ShardSpec(3, 8)
    assert ShardSpec.from_env({"RANK": "0", "WORLD_SIZE": "1"}) is None  # one process: a whole store
    assert ShardSpec.from_env({}) is None
    with pytest.raises(ValueprobeError, match="--shard '8/8'"):
        ShardSpec.from_env({"RANK": "8", "WORLD_SIZE": "8"})
    assert rank_device("cuda", {"LOCAL_RANK": "3"}) == "cuda:3"
    assert rank_device("cuda:1", {"LOCAL_RANK": "3"}) == "cuda:1"
    assert rank_device("cpu", {"LOCAL_RANK": "3"}) == "cpu"
