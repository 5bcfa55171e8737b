"""Sharded runs on this machine, measured in one run: workers, the merge, and memory per worker.

    python benchmarks/scale.py                     # prints the table and writes runs/bench-scale.json
    python benchmarks/scale.py --n 64 --prompts 8

Prints:
- 2 workers ÷ 1 worker throughput for a capture (``--shard I/2`` in two processes at once, against
  one process over the same examples) and for a steering sweep. Each worker is a whole process with
  its own model, as a SLURM array task or a torchrun rank is.
- the merge's time as a share of the 2-worker job;
- memory of one capture worker at 1× and 4× the examples, each in a fresh process (the store's
  shards of ``--examples-per-shard`` examples; 4× cycles the 1× examples, so both have the same
  longest batch and only what is kept per example can differ): the RSS still held after the work
  (see benchmarks/rss.py), and the peak RSS, ``--rss-repeats`` runs of each, with glibc's default
  allocator settings and with a fixed mmap threshold (``MALLOC_MMAP_THRESHOLD_=131072``).
Targets: held and peak RSS from 1× to 4× within 10%. On 2 shared cores the throughput ratio is about 1×: both
workers compete for the same cores, which one process's BLAS threads already use.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rss import child_rss, print_peak  # benchmarks/rss.py, next to this script

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
    """Child process: one capture worker over ``args.n`` examples (the first ``args.rss_n`` of the
    data, cycled) to disk; prints peak and held RSS in MB."""
    from valueprobe.activations.capture import CaptureSettings
    from valueprobe.activations.store import capture_to_store
    from valueprobe.datasets.io import read_jsonl
    from valueprobe.model.load import load
    from valueprobe.vocab import Dtype, Positions

    lm = load(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        data = _examples(args.rss_n, args.data, Path(tmp) / "base.jsonl")
        data = _examples(args.n, str(data), Path(tmp) / "d.jsonl")
        settings = CaptureSettings(layers="all", positions=Positions.spans, batch_size=8, include_embed=True)
        capture_to_store(
            lm, read_jsonl(data), Path(tmp) / "s", settings, examples_per_shard=args.examples_per_shard,
            dtype=Dtype.float16, progress=False,
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
    ap.add_argument("--rss-repeats", type=int, default=2, help="fresh processes per size and setting")
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
    sizes += ["--rss-n", str(args.rss_n)]
    result["rss_mb"] = {}
    for setting, env in (("default", {}), ("fixed_mmap", {"MALLOC_MMAP_THRESHOLD_": "131072"})):
        for times in (1, 4):
            runs = [
                child_rss(__file__, [*sizes, "--n", str(times * args.rss_n)], env=env)
                for _ in range(args.rss_repeats)
            ]
            result["rss_mb"][f"{setting}_{times}x"] = runs
    result["load_after"] = os.getloadavg()
    for kind in ("capture", "steer"):
        r = result[kind]
        print(
            f"{kind}: 1 worker {r['one_worker_s']:.1f} s, 2 workers {r['two_workers_s']:.1f} s + merge"
            f" {r['merge_s']:.1f} s -> throughput 2/1 = {r['throughput_2_over_1']:.2f}x, merge share {r['merge_share']:.1%}"
        )
    for setting in ("default", "fixed_mmap"):
        one, four = result["rss_mb"][f"{setting}_1x"], result["rss_mb"][f"{setting}_4x"]
        for what in ("held_mb", "peak_rss_mb"):
            a, b = [r[what] for r in one], [r[what] for r in four]
            print(
                f"{setting:10} {what.removesuffix('_mb').replace('_rss', ''):4}: {args.rss_n} examples"
                f" {min(a):.0f}-{max(a):.0f} MB, {4 * args.rss_n} examples {min(b):.0f}-{max(b):.0f} MB"
                f" (median {statistics.median(b) / statistics.median(a) - 1:+.1%}; target within 10%)"
            )
    print(
        f"on {threads} cores two workers share the cores one worker's BLAS threads already fill, so about 1x;"
        " with one GPU a worker nothing is shared but the disk, so 8 GPUs predict about 8x less the merge share"
        f"; load average before {result['load_before'][0]:.2f}, after {result['load_after'][0]:.2f}"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
