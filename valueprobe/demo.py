"""The main job on the default model, start to finish, in a few minutes on a laptop CPU.

    valueprobe demo                      # -> runs/demo/summary.json, runs/demo/sweep.html

1. load SmolLM2-135M-Instruct offline (PyPI wheel -> GGUF -> cached safetensors);
2. generate a small ICRL construction set (48 hidden rules, ``--n`` conversations);
3. capture the ``pre``/``post`` spans of the first post-discovery paragraph at every layer
   (plus the embedding output) into an on-disk store;
4. fit the axis with the paper's construction and sweep the layers on held-out rules, with the
   controls printed beside every AUROC.

The shipped, fuller build is ``valueprobe replicate axis`` (see ``probes/smollm2-135m-value``).
"""

from __future__ import annotations

from pathlib import Path

from valueprobe.datasets import build
from valueprobe.errors import ValueprobeError
from valueprobe.fit import FitReport, fit_probe
from valueprobe.models import DEFAULT_MODEL, load
from valueprobe.probe import Method
from valueprobe.replicate import FAMILIES, capture_families

__all__ = ["MIN_N", "run_demo"]

# Each conversation has its own rule (up to 48); a held-out split needs a train, a validation and a
# test rule, so fewer than 3 conversations would fail only after the capture.
MIN_N = 3


def run_demo(
    *, out: str | Path = "runs/demo", model: str = DEFAULT_MODEL, n: int = 96, seed: int = 0, splits: int = 5
) -> FitReport:
    """Build ICRL data, capture it, fit and sweep; writes the store and probe under ``out``.

    Raises:
        ValueprobeError: ``n`` below :data:`MIN_N` or ``splits`` below 1, before any work.
    """
    if n < MIN_N or splits < 1:
        raise ValueprobeError(
            f"demo needs n >= {MIN_N} conversations and splits >= 1 (got n={n}, splits={splits})"
        )
    out = Path(out)
    build("icrl", out / "data", seed=seed, n=n)
    lm = load(model)
    store = capture_families(lm, out / "data", out, families={"icrl": FAMILIES["icrl"]})["icrl"]
    report = fit_probe({"icrl": store}, method=Method.span_diff, n_splits=splits, seed=seed, transfer=False)
    report.axis.save(out / "probe")
    return report
