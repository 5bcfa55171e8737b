"""How fast the command line answers: ``valueprobe --help`` and every ``valueprobe VERB --help``.

    python benchmarks/cli_start.py                 # 3 runs each; the target is ≤ 1.0 s wall, alone
    python benchmarks/cli_start.py --repeats 5

Each help runs in a fresh process (as a user types it), from an empty folder; the figure is the
median wall time of the runs, beside the load average at the start and the end (a shared machine
slows every figure alike: compare them only to each other, and to the target on a quiet machine).
``import valueprobe`` and ``import torch`` are timed the same way, as the scale.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import typer

from valueprobe.cli.main import app

TARGET_S = 1.0


def wall(argv: list[str], cwd: Path, repeats: int) -> float:
    """Median wall seconds of ``argv`` over ``repeats`` fresh processes."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def verbs() -> list[list[str]]:
    """Every command path: ``demo``, ``datasets build``, ``replicate steer``..."""
    out: list[list[str]] = []
    for name, command in typer.main.get_command(app).commands.items():  # type: ignore[attr-defined]
        subs = getattr(command, "commands", None)
        out += [[name, sub] for sub in subs] if subs else [[name]]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    exe = [sys.executable, "-m", "valueprobe"]
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as empty:
        here = Path(empty)
        scale = {
            "python -c pass": wall([sys.executable, "-c", "pass"], here, args.repeats),
            "import valueprobe": wall([sys.executable, "-c", "import valueprobe"], here, args.repeats),
            "import torch": wall([sys.executable, "-c", "import torch"], here, args.repeats),
        }
        helps = {
            " ".join(["valueprobe", *v, "--help"]): wall([*exe, *v, "--help"], here, args.repeats)
            for v in verbs()
        }
        top = wall([*exe, "--help"], here, args.repeats)
    print(f"load average {load_before:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    for name, seconds in scale.items():
        print(f"  {seconds:6.2f} s  {name}")
    print(f"  {top:6.2f} s  valueprobe --help")
    for name, seconds in sorted(helps.items(), key=lambda kv: -kv[1]):
        print(f"  {seconds:6.2f} s  {name}")
    worst = max([top, *helps.values()])
    print(
        f"slowest help {worst:.2f} s: {'within' if worst <= TARGET_S else 'over'} the {TARGET_S:.1f} s target"
    )


if __name__ == "__main__":
    main()
