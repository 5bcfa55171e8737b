"""Sharded runs on this machine, measured in one run: workers, the merge, and memory per worker.

    python benchmarks/scale.py                     # prints the table and writes runs/bench-scale.json
    python benchmarks/scale.py --n 64 --prompts 8

Prints:
- 2 workers ÷ 1 worker throughput for a capture (``--shard I/2`` in two processes at once, against
  one process over the same examples) and for a steering sweep. Each worker is a whole process with
  its own model, as a SLURM array task or a torchrun rank is.
- the merge's time as a share of the 2-worker job;
- peak RSS of one capture worker at 1× and 4× the examples (each in a fresh process, the store's
  shards of ``--examples-per-shard`` examples): memory held per example shows as growth.
Targets: RSS growth from 1× to 4× <= 10%. On 2 shared cores the throughput ratio is about 1×: both
workers compete for the same cores, which one process's BLAS threads already use.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rss import child_peak_mb, print_peak  # benchmarks/rss.py, next to this script

ROOT = Path(__file__).resolve().parents[1]


def _examples(n: int, data: str, out: Path) -> Path:
    """``n`` examples cycled from ``data`` (ids made unique), written where the workers read them."""
    from valueprobe.datasets.io import read_jsonl, write_jsonl

    base = read_jsonl(data)
    rows = [base[i % len(base)] for i in range(n)]
    rows = [replace(ex, id=f"{ex.id}#{i}") for i, ex in enumerate(rows)]
    write_jsonl(out, rows)
    return out


def _cli(*argv: str, threads: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
    return subprocess.Popen([sys.executable, "-m", "valueprobe", *argv], env=env, stdout=subprocess.DEVNULL)


def _wall(jobs: list[list[str]], threads: int) -> float:
    """Seconds until every job (run at once) has finished."""
    start = time.perf_counter()
    procs = [_cli(*job, threads=threads) for job in jobs]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"a worker failed: {p.args!r}")
    return time.perf_counter() - start


def _ratio(tmp: Path, kind: str, job: list[str], threads_one: int) -> dict:
    """One process over everything vs two shard processes at once, and the merge of their parts."""
    one = _wall([[*job, "--out", str(tmp / f"{kind}-one")]], threads=threads_one)
    parts = [tmp / f"{kind}-p{i}" for i in range(2)]
    two = _wall([[*job, "--out", str(p), "--shard", f"{i}/2"] for i, p in enumerate(parts)], threads=1)
    merge = _wall([["merge", str(tmp / f"{kind}-merged"), *map(str, parts)]], threads=1)
    return {
        "one_worker_s": one,
        "two_workers_s": two,
        "merge_s": merge,
        "throughput_2_over_1": one / (two + merge),
        "merge_share": merge / (two + merge),
    }


def rss_child(args) -> None:
    """Child process: one capture worker over ``args.n`` examples to disk; prints peak RSS in MB."""
    from valueprobe.activations.store import capture_to_store
    from valueprobe.datasets.io import read_jsonl
    from valueprobe.model.load import load
    from valueprobe.vocab import Dtype, Positions

    lm = load(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        data = _examples(args.n, args.data, Path(tmp) / "d.jsonl")
        capture_to_store(
            lm, read_jsonl(data), Path(tmp) / "s", layers="all", positions=Positions.spans, batch_size=8,
            examples_per_shard=args.examples_per_shard, dtype=Dtype.float16, progress=False,
        )  # fmt: skip
    print_peak()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", default=str(ROOT / "data" / "icrl.jsonl"))
    ap.add_argument("--prompts", default=str(ROOT / "data" / "steer_open.jsonl"))
    ap.add_argument("--probe", default=str(ROOT / "probes" / "smollm2-135m-value"))
    ap.add_argument("--n", type=int, default=64, help="examples of the throughput capture")
    ap.add_argument("--rss-n", type=int, default=128, help="examples at 1× for the memory check")
    ap.add_argument("--examples-per-shard", type=int, default=32)
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench-scale.json"))
    ap.add_argument("--rss-child", action="store_true")
    args = ap.parse_args()
    if args.rss_child:
        return rss_child(args)
    threads = os.cpu_count() or 1
    tmp = Path(tempfile.mkdtemp(prefix="vp-scale-"))
    try:
        data = _examples(args.n, args.data, tmp / "d.jsonl")
        capture = ["capture", "--model", args.model, "--data", str(data), "--positions", "spans"]
        capture += ["--examples-per-shard", str(args.examples_per_shard), "--batch-size", "8"]
        steer = [
            "steer",
            "--model",
            args.model,
            "--probe",
            args.probe,
            "--prompts",
            args.prompts,
            "--limit",
            "8",
        ]
        steer += [
            "--alphas",
            "-50,0,50",
            "--unit",
            "norm",
            "--max-new-tokens",
            "16",
            "--random-directions",
            "1",
        ]
        steer += ["--chunk-prompts", "2", "--bootstrap", "50"]
        result: dict[str, Any] = {
            "cores": threads,
            "load_before": os.getloadavg(),
            "capture": _ratio(tmp, "capture", capture, threads),
            "steer": _ratio(tmp, "steer", steer, threads),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    sizes = ["--model", args.model, "--data", args.data, "--examples-per-shard", str(args.examples_per_shard)]
    one = child_peak_mb(__file__, [*sizes, "--n", str(args.rss_n)])
    four = child_peak_mb(__file__, [*sizes, "--n", str(4 * args.rss_n)])
    result["rss_mb"] = {"1x": one, "4x": four, "growth": four / one - 1}
    result["load_after"] = os.getloadavg()
    for kind in ("capture", "steer"):
        r = result[kind]
        print(
            f"{kind}: 1 worker {r['one_worker_s']:.1f} s, 2 workers {r['two_workers_s']:.1f} s + merge"
            f" {r['merge_s']:.1f} s -> throughput 2/1 = {r['throughput_2_over_1']:.2f}x, merge share {r['merge_share']:.1%}"
        )
    g = result["rss_mb"]
    print(f"peak RSS per worker: {g['1x']:.0f} MB at {args.rss_n} examples, {g['4x']:.0f} MB at {4 * args.rss_n}"
          f" ({g['growth']:+.1%}; target within 10%)")  # fmt: skip
    print(
        f"on {threads} cores two workers share the cores one worker's BLAS threads already fill, so about 1x;"
        " with one GPU a worker nothing is shared but the disk, so 8 GPUs predict about 8x less the merge share"
        f"; load average before {result['load_before'][0]:.2f}, after {result['load_after'][0]:.2f}"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
