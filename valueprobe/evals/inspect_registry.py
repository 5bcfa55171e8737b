"""What Inspect AI's entry point loads (``[project.entry-points.inspect_ai]`` in pyproject.toml):
importing this registers the ``valueprobe`` model provider and the ``valueprobe/...`` tasks.

    inspect eval valueprobe/arithmetic --model valueprobe/smollm2-135m -M probe=smollm2-135m-value
"""

from __future__ import annotations

from valueprobe.evals.inspect_model import ValueprobeAPI, valueprobe
from valueprobe.evals.inspect_tasks import arithmetic, corrigible_ab

__all__ = ["ValueprobeAPI", "arithmetic", "corrigible_ab", "valueprobe"]
