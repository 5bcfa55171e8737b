"""Sharded shift: the merged parts give the figures of a one-process shift (shift.json, examples.csv)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_cli
from test_shift import one_line, saved  # noqa: F401

from valueprobe.files import mmap_safetensors


def _shift(saved: Path, out: Path, capsys, *extra: str) -> tuple[int, str, str]:  # noqa: F811
    argv = ["shift", "--probe", str(saved / "probe"), "--base", str(saved / "base"), "--tuned"]
    argv += [str(saved / "tuned"), "--data", str(saved / "data.jsonl"), "--targeted", "alpha", "--contrast"]
    argv += ["--refit", "--bootstrap", "100", "--batch-size", "4", "--out", str(out), *extra]
    return run_cli(argv, capsys)


def test_merged_shift_parts_give_the_one_process_figures(saved, tmp_path, capsys):  # noqa: F811
    code, _, err = _shift(saved, tmp_path / "one", capsys)
    assert code == 0, err
    parts = [tmp_path / f"p{i}" for i in range(3)]
    for i in (1, 2, 0):
        code, out, err = _shift(saved, parts[i], capsys, "--shard", f"{i}/3")
        assert code == 0 and "shard" in out, err
        assert not (parts[i] / "shift.json").exists()
    code, out, err = run_cli(["merge", str(tmp_path / "merged"), *map(str, parts[::-1])], capsys)
    assert code == 0 and "merged 3 parts" in out, err
    one, merged = tmp_path / "one", tmp_path / "merged"
    assert json.loads((merged / "shift.json").read_text()) == json.loads((one / "shift.json").read_text())
    assert (merged / "examples.csv").read_text() == (one / "examples.csv").read_text()
    assert (merged / "shift.html").is_file()
    # 18 examples in blocks of --batch-size 4: 5 blocks cut 1 + 2 + 2, so each part ran one process's batches
    sizes = [len(json.loads(mmap_safetensors(p / "reads.safetensors")[1]["ids"])) for p in parts]
    assert sizes == [4, 8, 6]


def test_shift_parts_that_do_not_belong_are_refused(saved, tmp_path, capsys):  # noqa: F811
    parts = [tmp_path / f"q{i}" for i in range(2)]
    for i in range(2):
        assert _shift(saved, parts[i], capsys, "--shard", f"{i}/2")[0] == 0
    seeded = tmp_path / "seeded"
    assert _shift(saved, seeded, capsys, "--shard", "1/2", "--seed", "5")[0] == 0
    merge = ["merge", str(tmp_path / "bad")]
    assert "shard 1/2 is missing" in one_line(*run_cli([*merge, str(parts[0])], capsys)[::2])
    line = one_line(*run_cli([*merge, str(parts[0]), str(seeded)], capsys)[::2])
    assert f"part {seeded} ran with seed=5, not 0" in line
    assert "both shard 0/2" in one_line(*run_cli([*merge, str(parts[0]), str(parts[0])], capsys)[::2])
    data = saved / "data.jsonl"
    text = data.read_text()
    data.write_text(text.replace("Paris", "Lyon"))
    try:
        line = one_line(*run_cli([*merge, *map(str, parts)], capsys)[::2])
    finally:
        data.write_text(text)
    assert f"part {parts[0]} read {data}" in line and "has changed" in line
    assert not (tmp_path / "bad").exists()
