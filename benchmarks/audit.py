"""What `valueprobe audit` costs at its default sizes, stage by stage, against its 10-minute target.

    nice -n 10 python benchmarks/audit.py                       # the reward-history axis, every test
    python benchmarks/audit.py --probe smollm2-135m-value --tests ae

Runs the audit from nothing (a fresh temporary folder, so no stage is reused) on the default model
and prints each stage's seconds, the whole run's wall time and its ratio to the target (600 s on 2
CPU cores), and the load average before and after: the machine may be shared, and the figure means
little without it. Writes runs/bench-audit.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import valueprobe as vp
from valueprobe.files import write_json

TARGET_S = 600.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probe", default="smollm2-135m-reward-history")
    parser.add_argument("--tests", default="abcde")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-audit.json"))
    args = parser.parse_args()
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    lm = vp.load("smollm2-135m")
    axis = vp.ValueAxis.load(args.probe, lm=lm)
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:
        res = vp.run_audit(lm, axis, Path(tmp), vp.AuditSettings(tests=args.tests), probe=args.probe)
        stages = {
            p.stem: json.loads(p.read_text())["seconds"]
            for p in sorted((Path(tmp) / "stages").glob("*.json"))
        }
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()
    for name, seconds in stages.items():
        print(f"{name:>10}  {seconds:7.1f} s")
    for t in res.tests:
        print(f"test {t.key}: {t.cost}, {t.seconds:.0f} s")
    print(
        f"audit of {args.probe} (tests {args.tests}): {wall:.0f} s wall, {wall / TARGET_S:.2f} × the 600 s target"
    )
    print(f"load average: {load_before[0]:.2f} before, {load_after[0]:.2f} after ({os.cpu_count()} CPUs)")
    write_json(
        args.out,
        {"probe": args.probe, "tests": args.tests, "wall_s": wall, "ratio_to_target": wall / TARGET_S,
         "stages_s": stages, "load_before": load_before, "load_after": load_after},
        indent=1,
    )  # fmt: skip


if __name__ == "__main__":
    main()
