"""torchrun capture: 2 CPU ranks over gloo write their parts, rank 0 merges; one store, equal to one process."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_parts import _examples, assert_same_store

from valueprobe.activations.capture import CaptureSettings
from valueprobe.activations.store import ActivationStore, capture_to_store
from valueprobe.datasets.io import write_jsonl
from valueprobe.files import sha256_file
from valueprobe.model.load import load

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.slow,  # three torchrun launches of 2 ranks: about 80 s on 2 cores
    pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not installed"),
]


def _torchrun(tiny_dir: str, data: Path, out: Path) -> subprocess.CompletedProcess:
    argv = ["torchrun", "--nproc-per-node", "2", "--standalone", "-m", "valueprobe", "capture"]
    argv += ["--model", tiny_dir, "--data", str(data), "--out", str(out), "--positions", "spans"]
    argv += ["--examples-per-shard", "3", "--dtype", "float32"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env |= {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


def test_torchrun_two_ranks_merge_to_one_process_store(tiny_dir, tmp_path):
    data = tmp_path / "d.jsonl"
    write_jsonl(data, _examples())
    proc = _torchrun(tiny_dir, data, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    parts = sorted(p.name for p in (tmp_path / "out.parts").iterdir())
    assert parts == ["part-0-of-2", "part-1-of-2"]
    one = capture_to_store(
        load(tiny_dir),
        _examples(),
        tmp_path / "one",
        CaptureSettings(positions="spans", include_embed=True),
        examples_per_shard=3,
        dtype="float32",
        dataset_path=str(data),
        dataset_sha256=sha256_file(data),
        progress=False,
    )
    assert_same_store(ActivationStore.open(tmp_path / "out"), one)

    # a failing rank: rank 1's part folder holds something else, so rank 1 refuses to start
    shutil.rmtree(tmp_path / "out")
    shutil.rmtree(tmp_path / "out.parts" / "part-1-of-2")
    (tmp_path / "out.parts" / "part-1-of-2").mkdir()
    (tmp_path / "out.parts" / "part-1-of-2" / "notes.txt").write_text("x")
    proc = _torchrun(tiny_dir, data, tmp_path / "out")
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-3000:]
    assert (
        "rank 1 of 2 failed" in lines[0] and "part-1-of-2 exists and is not an activation store" in lines[0]
    )
    assert not (tmp_path / "out").exists()

    # the rerun resumes: rank 0's part is complete and is not captured again
    (tmp_path / "out.parts" / "part-1-of-2" / "notes.txt").unlink()
    before = (tmp_path / "out.parts" / "part-0-of-2" / "shard-00000.safetensors").stat().st_mtime_ns
    proc = _torchrun(tiny_dir, data, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "out.parts" / "part-0-of-2" / "shard-00000.safetensors").stat().st_mtime_ns == before
    assert_same_store(ActivationStore.open(tmp_path / "out"), one)


def _torchrun_cli(*argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env |= {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    launch = ["torchrun", "--nproc-per-node", "2", "--standalone", "-m", "valueprobe", *argv]
    return subprocess.run(launch, env=env, capture_output=True, text=True, timeout=300)


def test_torchrun_steer_and_score_merge_to_one_process(tiny_dir, tmp_path, capsys):
    """steer and score under torchrun: each rank its part, rank 0 merges; the same files as one process.
    Parts on disk from another world size are refused in one line before any work."""
    from conftest import run_cli
    from test_steer_sweep import chats, tiny_axis

    tiny_axis(load(tiny_dir)).save(tmp_path / "probe")
    write_jsonl(tmp_path / "p.jsonl", chats(5))
    steer = [
        "steer",
        "--probe",
        str(tmp_path / "probe"),
        "--model",
        tiny_dir,
        "--prompts",
        str(tmp_path / "p.jsonl"),
    ]
    steer += ["--alphas", "-2,2", "--max-new-tokens", "3", "--random-directions", "1", "--chunk-prompts", "2"]
    steer += ["--bootstrap", "20"]
    assert run_cli([*steer, "--out", str(tmp_path / "one")], capsys)[0] == 0
    proc = _torchrun_cli(*steer, "--out", str(tmp_path / "ranked"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("generations.jsonl", "metrics.csv"):
        assert (tmp_path / "ranked" / name).read_text() == (tmp_path / "one" / name).read_text(), name
    assert sorted(p.name for p in (tmp_path / "ranked.parts").iterdir()) == ["part-0-of-2", "part-1-of-2"]

    score = [
        "score",
        "--probe",
        str(tmp_path / "probe"),
        "--model",
        tiny_dir,
        "--data",
        str(tmp_path / "p.jsonl"),
    ]
    score += ["--batch-size", "2", "--bootstrap", "20"]
    assert run_cli([*score, "--out", str(tmp_path / "score-one")], capsys)[0] == 0
    proc = _torchrun_cli(*score, "--out", str(tmp_path / "score"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got, want = tmp_path / "score" / "scores.csv", tmp_path / "score-one" / "scores.csv"
    assert got.read_text() == want.read_text()

    (tmp_path / "again.parts" / "part-2-of-3").mkdir(parents=True)
    proc = _torchrun_cli(*steer, "--out", str(tmp_path / "again"))
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-3000:]
    assert "holds parts of a 3-rank run (part-2-of-3) but torchrun started 2 ranks" in lines[0]
    assert not (tmp_path / "again").exists()
