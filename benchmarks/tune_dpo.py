"""One default DPO model of the default model: wall time, CPU time and machine load, measured in one run.

    nice -n 10 python benchmarks/tune_dpo.py                      # defaults: one word, 1 epoch, 11 steps
    nice -n 10 python benchmarks/tune_dpo.py --max-steps 2        # a quick per-step figure

Prints seconds per optimizer step (wall and CPU), the projected wall time of the default run on
2 free cores (CPU seconds / 2, which assumes both cores are ours), and the 1-minute load average
before and after, so a figure taken on a shared machine can be read for what it is.
Target: the default run (11 steps) in <= 240 s on 2 free cores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path

from valueprobe.tune.pairs import read_pairs
from valueprobe.tune.train import TuneSettings, train

ROOT = Path(__file__).resolve().parents[1]


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--group", default="preference_words/dolphin")
    ap.add_argument("--max-steps", type=int, default=-1)
    ap.add_argument("--out", default="runs/bench-tune.json")
    args = ap.parse_args()
    pairs = read_pairs(ROOT / "data" / "preference_words.jsonl", groups=[args.group])
    settings = TuneSettings(max_steps=args.max_steps)
    load_before = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), cpu_seconds()
    with tempfile.TemporaryDirectory() as tmp:
        res = train("smollm2-135m", pairs, Path(tmp) / "ckpt", settings=settings)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    steps = res.record.train.steps
    full_steps = -(-len(pairs) // settings.batch_size) * int(settings.epochs)
    out = {
        "pairs": len(pairs),
        "steps": steps,
        "wall_s": wall,
        "cpu_s": cpu,
        "train_runtime_s": res.record.train.seconds,
        "cpu_s_per_step": cpu / steps,
        "default_steps": full_steps,
        "projected_default_wall_s_on_2_free_cores": cpu / steps * full_steps / 2,
        "load_1min_before": load_before,
        "load_1min_after": os.getloadavg()[0],
        "cores": os.cpu_count(),
    }
    print(json.dumps(out, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
