"""Peak resident memory of a benchmark's work, each size measured in a fresh child process.

The benchmark script runs itself with ``--rss-child`` and the size's arguments; the child does the
work, then calls :func:`print_peak`, and the parent reads the number back:

    one = child_peak_mb(__file__, ["--n", "48"])
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def print_peak() -> None:
    """In the child: print this process's peak RSS (MB) as the last line, as JSON."""
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def child_peak_mb(script: str, args: list[str]) -> float:
    """Run ``script --rss-child ARGS`` in a new interpreter (with the checkout importable) and return
    the peak RSS in MB it printed."""
    cmd = [sys.executable, script, "--rss-child", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mb"]
