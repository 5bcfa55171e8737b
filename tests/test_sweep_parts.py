"""Sharded steering: the merged parts are the one-process sweep, row for row, sampled rows included.

HF_HUB_OFFLINE=1 python -m pytest -q tests/test_sweep_parts.py
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import run_cli
from test_steer_sweep import chats, settings_for, steer_argv, tiny_axis, tiny_files  # noqa: F401

from valueprobe.datasets.io import write_jsonl
from valueprobe.errors import ValueprobeError
from valueprobe.files import sha256_file
from valueprobe.sharded import merge
from valueprobe.steering.experiment.sweep import GENERATIONS, run_sweep
from valueprobe.steering.experiment.sweep_parts import run_sweep_part
from valueprobe.vocab import ShardSpec


@pytest.fixture()
def sweep(tiny_lm_factory, tmp_path):
    """A sampled sweep's model, axis, 7 prompts on disk and settings (chunks of 2 prompts: 4 blocks)."""
    lm = tiny_lm_factory("llama")
    examples = chats(7)
    write_jsonl(tmp_path / "p.jsonl", examples)
    axis = tiny_axis(lm)
    settings = settings_for(
        tmp_path,
        axis,
        prompts_sha256=sha256_file(tmp_path / "p.jsonl"),
        greedy=False,
        temperature=1.0,
        samples=2,
        max_new_tokens=5,
        controls=1,
        seed=3,
    )
    return lm, axis, examples, settings


def _parts(sweep, tmp: Path, n: int, batch_sizes: tuple[int, ...], **kw) -> list[Path]:
    lm, axis, examples, settings = sweep
    paths = [tmp / f"part{i}" for i in range(n)]
    for i in reversed(range(n)):  # the order parts run in does not matter
        run_sweep_part(
            lm, examples, paths[i], settings, shard=ShardSpec(i, n), batch_size=batch_sizes[i], n_boot=50,
            progress=False, **kw,
        )  # fmt: skip
    return paths


def test_sampled_sweep_split_two_ways_merges_to_one_process_row_for_row(sweep, tmp_path, monkeypatch):
    lm, axis, examples, settings = sweep
    monkeypatch.chdir(tmp_path)
    one = run_sweep(lm, examples, tmp_path / "one", settings, batch_size=4, n_boot=50, progress=False)
    # other batch sizes in each part: a row's draws depend on its (block, prompt, sample) only
    paths = _parts(sweep, tmp_path, 2, (3, 7))
    assert not (paths[0] / "metrics.json").exists()  # a part has no summary: the slopes need every prompt
    merged = merge(tmp_path / "merged", paths[::-1])
    want = (tmp_path / "one" / GENERATIONS).read_text()
    assert (tmp_path / "merged" / GENERATIONS).read_text() == want
    rows = [json.loads(line) for line in want.splitlines()]
    assert len(rows) == 7 * 2 * 3 * 2  # prompts × samples × α × (axis + 1 random)
    # the sampling is real: the two samples of a (prompt, α, direction) mostly differ
    text = {(r["prompt_id"], r["alpha"], r["direction"], r["sample"]): r["text"] for r in rows}
    assert sum(text[k] != text[(*k[:3], 1)] for k in text if k[3] == 0) > len(text) // 4
    assert (tmp_path / "merged" / "settings.json").read_text() == (
        tmp_path / "one" / "settings.json"
    ).read_text()
    got = json.loads((tmp_path / "merged" / "metrics.json").read_text())
    assert got == json.loads((tmp_path / "one" / "metrics.json").read_text())
    assert merged.to_dict() == one.to_dict()


def test_a_shard_that_renumbered_its_blocks_would_not_match(sweep, tmp_path):
    """The check above can fail: prompts 4..6 run as blocks 0..1 of their own sweep draw other numbers."""
    lm, axis, examples, settings = sweep

    def texts(folder: Path) -> dict:
        rows = [json.loads(line) for line in (folder / GENERATIONS).read_text().splitlines()]
        return {(r["prompt_id"], r["alpha"], r["direction"], r["sample"]): r["text"] for r in rows}

    run_sweep(lm, examples[4:], tmp_path / "late", settings, n_boot=10, progress=False)
    run_sweep(lm, examples, tmp_path / "all", settings, n_boot=10, progress=False)
    late, whole = texts(tmp_path / "late"), texts(tmp_path / "all")
    assert sum(late[k] != whole[k] for k in late) > len(late) // 4


def test_sweep_parts_that_do_not_belong_are_refused(sweep, tiny_lm_factory, tmp_path, monkeypatch):
    lm, axis, examples, settings = sweep
    monkeypatch.chdir(tmp_path)
    paths = _parts(sweep, tmp_path, 2, (8, 8))
    out = tmp_path / "bad"

    def refused(parts: list[Path], match: str) -> None:
        with pytest.raises(ValueprobeError, match=match):
            merge(out, parts)
        assert not out.exists()

    refused([paths[0]], "shard 1/2 is missing")
    refused([paths[0], paths[0]], "both shard 0/2")
    seeded = tmp_path / "seeded"
    run_sweep_part(
        lm,
        examples,
        seeded,
        replace(settings, seed=4),
        shard=ShardSpec(1, 2),
        n_boot=50,
        progress=False,
    )
    refused([paths[0], seeded], f"part {seeded} was steered with seed=4, not 3")
    other_lm = tiny_lm_factory("llama", seed=1)  # same shape, other weights
    foreign = tmp_path / "foreign"
    with pytest.warns(Warning):
        run_sweep_part(
            other_lm, examples, foreign, settings, shard=ShardSpec(1, 2), n_boot=50, progress=False
        )
    refused([paths[0], foreign], f"part {foreign} was steered on another model")
    lines = (paths[1] / GENERATIONS).read_text().splitlines()
    (paths[1] / GENERATIONS).write_text("\n".join(lines[:-3]) + "\n")
    refused(paths, f"part {paths[1]} \\(shard 1/2\\) is partial")
    with pytest.raises(ValueprobeError, match="holds shard 1/2 of a sharded sweep, not 0/2"):
        run_sweep_part(lm, examples, paths[1], settings, shard=ShardSpec(0, 2), progress=False)
    with pytest.raises(ValueprobeError, match="holds one part of a sharded sweep"):
        run_sweep(lm, examples, paths[1], settings, progress=False)


def test_cli_steer_shard_and_merge(tiny_files, tmp_path, capsys, monkeypatch):  # noqa: F811
    argv = steer_argv(
        tiny_files, alphas="-2,2", max_new_tokens=2, random_directions=1, chunk_prompts=1, bootstrap=20
    )
    code, _, err = run_cli([*argv, "--out", str(tmp_path / "one")], capsys)
    assert code == 0, err
    for i in range(3):
        code, out, err = run_cli([*argv, "--out", str(tmp_path / f"p{i}"), "--shard", f"{i}/3"], capsys)
        assert code == 0 and "part.json (shard" in out, err
    code, out, err = run_cli(
        ["merge", str(tmp_path / "m"), *(str(tmp_path / f"p{i}") for i in range(3))], capsys
    )
    assert code == 0 and "merged 3 parts" in out, err
    for name in ("generations.jsonl", "metrics.csv"):
        assert (tmp_path / "m" / name).read_text() == (tmp_path / "one" / name).read_text(), name
    assert (tmp_path / "m" / "dose.html").is_file()
    code, _, err = run_cli(
        ["merge", str(tmp_path / "m2"), str(tmp_path / "p0"), str(tmp_path / "p2")], capsys
    )
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and "shard 1/3 is missing" in lines[0], err


def test_replicate_steer_shards_then_merges_to_the_one_process_results(tiny_lm_factory, tmp_path):
    """replicate steer --shard I/N runs each sweep's shard; the run without --shard merges the parts
    (no generation left to do) into the results one process writes."""
    from test_steer_sweep import DATA

    from valueprobe.replicate.steer import ReplicateSteerSettings, replicate_steer

    lm = tiny_lm_factory("llama")
    axis, other = tiny_axis(lm), tiny_axis(lm, seed=1)
    run = ReplicateSteerSettings(
        probe=Path("p/value"), other_probe=Path("p/history"), data_dir=DATA, prompts=3, alphas=(-1.0, 1.0),
        unit="sigma", controls=1, tokens=0.05, benchmarks=("confidence", "length"),
    )  # fmt: skip
    one = replicate_steer(
        lm, replace(run, runs_dir=tmp_path / "one"), axis=axis, other=other, out=tmp_path / "one-out"
    )
    split = replace(run, runs_dir=tmp_path / "split")
    for i in (1, 0):
        replicate_steer(lm, split, axis=axis, other=other, out=tmp_path / "split-out", shard=ShardSpec(i, 2))
    assert not (tmp_path / "split-out" / "results.json").exists()
    assert (tmp_path / "split" / "length.parts" / "part-1-of-2" / GENERATIONS).is_file()
    merged = replicate_steer(lm, split, axis=axis, other=other, out=tmp_path / "split-out")
    for name in ("confidence", "length", "confidence-ablate"):
        folder = next((tmp_path / "one").glob(f"{name}*"), None)
        if folder is None or folder.suffix == ".parts":
            continue
        got = (tmp_path / "split" / folder.name / GENERATIONS).read_text()
        assert got == (folder / GENERATIONS).read_text(), name
    assert merged.to_dict() == one.to_dict()
