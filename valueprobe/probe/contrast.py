"""The matched-control record: a fixed axis on ICRL conversations and their matched controls.

    valueprobe replicate axis --out probes/smollm2-135m-value    # probe.json metrics.icrl_matched_control

`valueprobe.replicate.axis.matched_control` measures it; the report draws it. The control is the
same final paragraph after a history that never rewarded the rule: if the axis reads value, main
``post`` sits above control ``post`` (identical text); if it reads wording or position, ``post``
beats ``pre`` as much in the control as in the main set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from valueprobe.records import Record
from valueprobe.stats.metrics import auroc, bootstrap_ci, cohens_d

__all__ = ["Contrast", "MatchedControl"]


@dataclass(frozen=True)
class Contrast(Record):
    """One two-sample contrast of projections: AUROC with a bootstrap 95% CI, and Cohen's d."""

    auroc: float
    auroc_ci: tuple[float, float]
    cohens_d: float

    @classmethod
    def of(cls, pos: np.ndarray, neg: np.ndarray, *, seed: int) -> Contrast:
        scores = np.concatenate([pos, neg])
        labels = np.concatenate([np.ones(len(pos)), np.zeros(len(neg))])
        ci = bootstrap_ci(auroc, scores, labels, n_boot=1000, seed=seed)
        return cls(auroc(scores, labels), ci, cohens_d(scores, labels))


@dataclass(frozen=True)
class MatchedControl(Record):
    """The axis on ICRL conversations and their matched controls (see the module docstring); its
    JSON is probe.json's ``metrics.icrl_matched_control`` (no embedding contrast: no key)."""

    OMIT = {"embed_main_post_vs_control_post": None}

    layer: int
    post_vs_pre_main: Contrast
    post_vs_pre_control: Contrast
    main_post_vs_control_post: Contrast  # identical text, different reward history
    embed_main_post_vs_control_post: Contrast | None  # must be 0.5: the text is identical
    main_minus_control_post_sigma: float

    def contrasts(self) -> dict[str, Contrast]:
        out = {
            "post_vs_pre_main": self.post_vs_pre_main,
            "post_vs_pre_control": self.post_vs_pre_control,
            "main_post_vs_control_post": self.main_post_vs_control_post,
        }
        if self.embed_main_post_vs_control_post is not None:
            out["embed_main_post_vs_control_post"] = self.embed_main_post_vs_control_post
        return out

    def table(self) -> tuple[list[str], list[list[str]]]:
        """(headers, rows): one row per contrast."""
        rows = [
            [name, f"{c.auroc:.3f}", f"[{c.auroc_ci[0]:.3f}, {c.auroc_ci[1]:.3f}]", f"{c.cohens_d:.3f}"]
            for name, c in self.contrasts().items()
        ]
        return ["contrast", "AUROC", "95% CI", "Cohen's d"], rows
