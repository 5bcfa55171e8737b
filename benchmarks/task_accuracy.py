"""Greedy accuracy of a model on the task files, per group: how the task levels were sized.

    python benchmarks/task_accuracy.py --tasks data/task_arithmetic.jsonl --new 128
    python benchmarks/task_accuracy.py --tasks data/task_code.jsonl --new 200
    python benchmarks/task_accuracy.py --new 48 --limit 24 --batch-size 24   # valueprobe eval's α = 0 check

Generates one greedy answer per task (batched; the probe is only carried, α = 0 steers nothing),
checks it by the task's stated rule (`valueprobe.datasets.answers.check`) and prints the share right
per group, with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

from valueprobe.datasets.answers import check, read_tasks
from valueprobe.model.load import load
from valueprobe.probe.axis import ValueAxis
from valueprobe.steering.decode.generation import generate
from valueprobe.steering.decode.sampling import Decoding

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--probe", default=str(ROOT / "probes" / "smollm2-135m-value"))
    p.add_argument("--tasks", default=str(ROOT / "data" / "task_arithmetic.jsonl"))
    p.add_argument("--new", type=int, default=128, help="max new tokens")
    p.add_argument("--batch-size", type=int, default=60)
    p.add_argument("--limit", type=int, default=None, help="the first N tasks of the file (default: all)")
    p.add_argument("--out", default=None, help="write every answer and its verdict here (JSON)")
    args = p.parse_args()
    tasks = read_tasks(args.tasks)[: args.limit]
    lm = load(args.model)
    axis = ValueAxis.load(args.probe, lm=lm)
    start = time.perf_counter()
    gens = generate(lm, axis, [list(t.messages) for t in tasks], decoding=Decoding(greedy=True, max_new_tokens=args.new), batch_size=args.batch_size)  # fmt: skip
    seconds = time.perf_counter() - start
    right: dict[str, list[bool]] = defaultdict(list)
    rows = []
    for task, gen in zip(tasks, gens, strict=True):
        verdict = check(task, gen.text)
        right[task.group].append(verdict.correct)
        rows.append(
            {"id": task.id, "text": gen.text, "right": verdict.correct, "extracted": verdict.extracted}
        )
    for group, hits in right.items():
        print(f"{group}: {sum(hits)}/{len(hits)} right ({sum(hits) / len(hits):.1%})")
    print(f"{len(tasks)} answers in {seconds:.0f}s; load average {os.getloadavg()} on {os.cpu_count()} CPUs")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
