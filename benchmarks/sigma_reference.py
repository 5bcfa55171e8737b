"""How stable σ is on the neutral reference: its halves, a bootstrap over paragraphs, another genre.

    python benchmarks/sigma_reference.py                  # both shipped axes on the default model
    python benchmarks/sigma_reference.py --boot 500

σ of each shipped axis at its best layer over `neutral_text` (every token but position 0, plain
text: `valueprobe.probe.calibrate`), then over each half of it (``neutral_text/kl``,
``neutral_text/heldout``), a 95% bootstrap interval over its paragraphs, and 60 paragraphs of
another genre (the prose of Python's own reference documentation, ``pydoc_data.topics``, which
ships with the interpreter). Each as a ratio to σ over the whole reference, and 1σ in % of the
layer's mean residual norm.
"""

from __future__ import annotations

import argparse
import random
from pydoc_data.topics import topics

import numpy as np
import torch

import valueprobe as vp
from valueprobe.activations.capture import CaptureSettings
from valueprobe.datasets.io import Example
from valueprobe.probe.calibrate import reference_examples
from valueprobe.vocab import Unit


def projections(lm, axis: vp.ValueAxis, examples: list[Example]) -> list[np.ndarray]:
    """Per paragraph, the projections of its tokens but position 0 at the axis's best layer."""
    layer = axis.best_layer
    got = vp.capture(lm, examples, CaptureSettings(layers=[layer], positions="all"), progress=False)
    proj = (got.acts[layer].double() @ axis.direction(layer).double()).numpy()
    ids, pos = np.array(got.rows.example_id), got.rows.token_index
    return [proj[(ids == ex.id) & (pos > 0)] for ex in examples]


def other_genre(n: int = 60) -> list[Example]:
    """``n`` prose paragraphs of the language reference (no code blocks), in a fixed shuffle."""
    paras = [
        p.strip()
        for key in sorted(topics)
        for p in topics[key].split("\n\n")
        if len(p.split()) > 30 and not p.startswith(" ")
    ]
    random.Random(0).shuffle(paras)
    return [Example(id=f"pydoc-{i}", label=1, group="pydoc", text=t) for i, t in enumerate(paras[:n])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--boot", type=int, default=1000)
    args = parser.parse_args()
    torch.manual_seed(0)
    lm = vp.load(args.model)
    _, reference = reference_examples()
    for name in ("smollm2-135m-value", "smollm2-135m-reward-history"):
        axis = vp.ValueAxis.load(name, lm=lm)
        per = projections(lm, axis, reference)
        sigma = float(np.concatenate(per).std())
        share = sigma / axis.unit_size(axis.best_layer, Unit.norm)  # one unit of norm is 1 %
        rng = np.random.default_rng(0)
        boot = [
            np.concatenate([per[i] for i in rng.integers(0, len(per), len(per))]).std() / sigma
            for _ in range(args.boot)
        ]
        halves = {
            g: np.concatenate([p for p, ex in zip(per, reference, strict=True) if ex.group == g]).std()
            / sigma
            for g in ("neutral_text/kl", "neutral_text/heldout")
        }
        genre = np.concatenate(projections(lm, axis, other_genre())).std() / sigma
        print(
            f"{name} layer {axis.best_layer}: σ {sigma:.3f} over {sum(map(len, per))} tokens"
            f" (1σ = {share:.2f}% of the mean norm; probe.json σ {axis.sigma_at():.3f})"
        )
        print(
            "  ratio to it: "
            + ", ".join(f"{g.split('/')[1]} half {r:.3f}" for g, r in halves.items())
            + f"; bootstrap over paragraphs 95% [{np.percentile(boot, 2.5):.3f}, {np.percentile(boot, 97.5):.3f}]"
            + f"; Python reference prose (60 paragraphs) {genre:.3f}"
        )


if __name__ == "__main__":
    main()
