"""Synthetic result sections for report tests: every section present, numbers made up for layout only."""

from __future__ import annotations

import numpy as np


def _ms(x: float, sd: float = 0.02) -> dict:
    return {"mean": x, "sd": sd}


def sweep_section(n_layers: int = 4) -> dict:
    by = {
        str(i): {
            k: _ms(v)
            for k, v in {
                "val_auroc": 0.6 + 0.05 * i,
                "test_auroc": 0.6 + 0.05 * i,
                "cohens_d": 0.5,
                "shuffled_auroc": 0.5,
                "random_auroc": 0.55,
            }.items()
        }
        for i in range(n_layers)
    }
    rng = np.random.default_rng(0)
    cos = np.clip(np.eye(n_layers) + 0.3 * rng.random((n_layers, n_layers)), -1, 1)
    return {
        "method": "span_diff",
        "best_layer": n_layers - 1,
        "n_splits": 3,
        "by_layer": by,
        "heldout_auroc": _ms(0.75),
        "controls": {
            "embed": _ms(0.6),
            "position:token_index": _ms(0.52),
            "shuffled": _ms(0.5),
            "random": _ms(0.55),
        },
        "strongest_control": "embed",
        "margin": 0.15,
        "cosine_layers": list(range(n_layers)),
        "cosine": cos.tolist(),
    }


def all_sections() -> dict:
    fams = ["icrl", "code"]
    alphas = [-4.0, 0.0, 4.0]
    return {
        "model": "tiny",
        "summary": ["axis: AUROC 0.75 vs control 0.60"],
        "sections": {
            "sweep": sweep_section(),
            "history": sweep_section(),
            "transfer": {
                "families": fams,
                "layer": 3,
                "auroc": [[0.9, 0.6], [0.55, 0.8]],
                "margin": [[0.1, 0.05], [0.0, 0.2]],
                "off_diagonal_auroc": _ms(0.575),
            },
            "matched_control": {
                "layer": 3,
                "main_post_vs_control_post": {"auroc": 0.6, "auroc_ci": [0.5, 0.7]},
                "post_vs_pre_control": {"auroc": 0.9, "auroc_ci": [0.85, 0.95]},
            },
            "logit_lens": {"layer": 3, "promoted": [["<b>", 2.0], ["yes", 1.0]], "suppressed": [["no", 1.5]]},
            "trace": {
                "layer": 3,
                "tokens": ["Hi", " <there>", "!"],
                "score": [0.1, -1.5, 2.5],
                "n_prompt": 1,
            },
            "steer": {
                "unit": "sigma",
                "slope_step": 1.0,
                "effects": [
                    {
                        "metric": "p_yes",
                        "subset": "direct",
                        "axis": {"slope": 0.02},
                        "null_range": [-0.01, 0.01],
                        "outside_null": True,
                        "other_name": "other:history",
                        "curves": {
                            "axis": {
                                "alpha": alphas,
                                "mean": [0.3, 0.4, 0.5],
                                "lo": [0.2, 0.3, 0.4],
                                "hi": [0.4, 0.5, 0.6],
                            },
                            "other": {
                                "alpha": alphas,
                                "mean": [0.4, 0.4, 0.4],
                                "lo": [0.3] * 3,
                                "hi": [0.5] * 3,
                            },
                            "null": {"alpha": alphas, "mean": [0.4] * 3, "lo": [0.35] * 3, "hi": [0.45] * 3},
                        },
                    }
                ],
            },
            "shift": {
                "layer": 2,
                "layers": [0, 1, 2, 3],
                "records": [
                    {"group": "words", "base": b, "tuned": t} for b, t in [(0, 0.5), (0.1, 0.7), (-0.2, 0.4)]
                ],
                "probe": {"sigma": 2.0, "sigma_data": 0.25},  # 1 base σ = 8 data σ
                "groups": [
                    {
                        "group": "words",
                        "targeted": True,
                        "shift": 0.53,
                        "shift_data_sigma": 4.24,
                        "ci": [0.4, 0.7],
                        "null_range": [-0.2, 0.2],
                        "null_percentile": 100.0,
                        "base_mean": -0.03,
                    }
                ],
                "pairs": [
                    {"a": "words", "b": "other", "d_base": [0, 0.1, 0.2, 0.1], "d_tuned": [0, 0.5, 0.9, 0.6]}
                ],
                "shift_by_layer": {"words": [0.1, 0.3, 0.53, 0.4]},
            },
        },
    }
