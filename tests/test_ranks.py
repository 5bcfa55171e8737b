"""torchrun capture: 2 CPU ranks over gloo write their parts, rank 0 merges; one store, equal to one process."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_parts import _examples, assert_same_store

from valueprobe.activations.store import ActivationStore, capture_to_store
from valueprobe.datasets.io import sha256_file, write_jsonl
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
        positions="spans",
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
