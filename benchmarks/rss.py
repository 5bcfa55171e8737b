"""Peak resident memory of a benchmark's work, each size measured in a fresh child process.

The benchmark script runs itself with ``--rss-child`` and the size's arguments; the child does the
work, then calls :func:`print_peak`, and the parent reads the number back:

    one = child_peak_mb(__file__, ["--n", "48"])
    held = child_rss(__file__, ["--n", "48"], env={"MALLOC_MMAP_THRESHOLD_": "131072"})["held_mb"]

Two numbers, because they answer two questions. The peak (``ru_maxrss``) is what a job must fit in.
What is *held* after the work (``held_mb``: RSS once Python's garbage and glibc's free pages are
returned, ``malloc_trim``) is what a run keeps per example. glibc moves its mmap threshold up after
a large block is freed, so later activation-sized blocks come from the heap and the peak depends on
allocation history (here ±15% between runs of one size); a fixed ``MALLOC_MMAP_THRESHOLD_`` turns
that off.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def print_peak() -> None:
    """In the child: print this process's peak RSS and the RSS it still holds (MB) as the last line, as JSON."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    gc.collect()
    with contextlib.suppress(OSError):  # not glibc: what is held then includes the allocator's free pages
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        held = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    print(json.dumps({"peak_rss_mb": peak, "held_mb": held}))


def child_rss(script: str, args: list[str], *, env: dict[str, str] | None = None) -> dict[str, float]:
    """Run ``script --rss-child ARGS`` in a new interpreter (with the checkout importable, ``env``
    added) and return what it printed: ``peak_rss_mb`` and ``held_mb``."""
    cmd = [sys.executable, script, "--rss-child", *args]
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=full)
    return json.loads(out.stdout.strip().splitlines()[-1])


def child_peak_mb(script: str, args: list[str]) -> float:
    """The peak RSS in MB of ``script --rss-child ARGS`` (see `child_rss`)."""
    return child_rss(script, args)["peak_rss_mb"]
