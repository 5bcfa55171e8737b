"""Sharded score: the merged parts write the scores.csv and summary.json of a one-process score."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli
from test_readout import tiny_axis

from valueprobe.datasets.io import Example, write_jsonl
from valueprobe.model.load import load


@pytest.fixture(scope="module")
def scored(tiny_dir, tmp_path_factory):
    """A probe for the tiny model, a paired dataset, and the one-process score of it."""
    tmp = tmp_path_factory.mktemp("score")
    tiny_axis(load(tiny_dir), layer=1).save(tmp / "probe")
    texts = ["Paris is nice", "Rome is old", "two plus two is four", "wait, that is wrong", "yes"]
    examples = [
        Example(
            id=f"e{i}",
            label=i % 2,
            group=f"g{i % 3}",
            text=f"{texts[i % 5]} {i}. " * (1 + i % 3),
            meta={"pair": f"e{i - 1}"} if i % 2 else {},
        )
        for i in range(13)
    ]
    write_jsonl(tmp / "d.jsonl", examples)
    return tmp


def _score(tiny_dir, tmp: Path, out: Path, capsys, *extra: str) -> tuple[int, str, str]:
    argv = ["score", "--probe", str(tmp / "probe"), "--model", tiny_dir, "--data", str(tmp / "d.jsonl")]
    return run_cli([*argv, "--out", str(out), "--batch-size", "2", "--bootstrap", "50", *extra], capsys)


def test_merged_score_parts_equal_one_process(tiny_dir, scored, capsys):
    assert _score(tiny_dir, scored, scored / "one", capsys, "--null", "32")[0] == 0
    parts = [scored / f"p{i}" for i in range(3)]
    for i in (2, 0, 1):
        code, _, err = _score(tiny_dir, scored, parts[i], capsys, "--null", "32", "--shard", f"{i}/3")
        assert code == 0, err
        assert not (parts[i] / "summary.json").exists()
    assert [len((p / "scores.csv").read_text().splitlines()) - 1 for p in parts] == [4, 4, 5]  # blocks of 2
    code, out, err = run_cli(["merge", str(scored / "merged"), *map(str, parts[::-1])], capsys)
    assert code == 0 and "merged 3 parts" in out, err
    one, merged = scored / "one", scored / "merged"
    assert (merged / "scores.csv").read_text() == (one / "scores.csv").read_text()
    summary = json.loads((merged / "summary.json").read_text())
    assert summary == json.loads((one / "summary.json").read_text())
    assert "null_auroc_range" in summary["summary"][0]  # the null travelled through the parts


def _one_line(code: int, err: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_score_parts_that_do_not_belong_are_refused(tiny_dir, scored, capsys):
    parts = [scored / f"q{i}" for i in range(2)]
    for i in range(2):
        assert _score(tiny_dir, scored, parts[i], capsys, "--shard", f"{i}/2")[0] == 0
    other = scored / "q1-seed"
    assert _score(tiny_dir, scored, other, capsys, "--shard", "1/2", "--seed", "3")[0] == 0
    merge = ["merge", str(scored / "bad")]
    line = _one_line(*run_cli([*merge, str(parts[0])], capsys)[::2])
    assert "shard 1/2 is missing" in line
    line = _one_line(*run_cli([*merge, str(parts[0]), str(other)], capsys)[::2])
    assert f"part {other} was scored with seed=3, not 0" in line
    line = _one_line(*run_cli([*merge, str(parts[0]), str(parts[0])], capsys)[::2])
    assert "both shard 0/2" in line
    data = scored / "d.jsonl"
    saved = data.read_text()
    data.write_text(saved.replace("Paris", "Lyon"))
    try:
        line = _one_line(*run_cli([*merge, *map(str, parts)], capsys)[::2])
    finally:
        data.write_text(saved)
    assert f"part {parts[0]} was scored on {data}" in line and "has changed" in line
    assert not (scored / "bad").exists()
