"""Direct attribution's cost against a plain capture, and attribution patching against exact patching.

    nice -n 10 python benchmarks/attribute.py               # prints the table, writes runs/bench-attribute.json
    python benchmarks/attribute.py --pairs 4 --repeats 1    # a quick check of the script

Prints:
- direct attribution (`valueprobe.attribute.direct.direct_rows`: hooks on every block's ``attn_z``
  and ``mlp_out`` up to the read layer, each head's projection on the axis and 32 random
  directions) ÷ a plain capture of the same examples at the read layer (`valueprobe.capture`,
  the same token rows, the same batches), on the default model and the reward-history axis (layer
  22), ``--pairs`` reward-flip pairs (both rows) read on the ``post`` span; min of interleaved
  repeats. Target <= 1.5.
- attribution patching against exact patching on the first ``--agree`` pairs (heads and MLPs of
  blocks 0..22, denoising, read σ): Spearman ρ and the overlap of their top 10, computed here (or,
  with ``--from``, read from a `valueprobe replicate attribute` folder).
The machine is shared: the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from valueprobe.activations.capture import CaptureSettings, capture
from valueprobe.activations.encode import encode
from valueprobe.attribute.agreement import agreement
from valueprobe.attribute.direct import Projector, direct_rows
from valueprobe.attribute.run import AttributeSettings, Provenance, run_attribution
from valueprobe.datasets.io import read_jsonl
from valueprobe.model.load import load
from valueprobe.probe.axis import ValueAxis
from valueprobe.stats.null import random_directions
from valueprobe.vocab import Positions, Target

ROOT = Path(__file__).resolve().parents[1]


def cost_ratio(lm, axis, examples, args) -> dict:
    """min over repeats of direct attribution's time and of a plain capture's, same rows and batches."""
    layer = axis.best_layer
    proj = Projector.build(lm, axis.direction(layer), layer=layer, random=random_directions(lm.d_model, 32))
    enc = encode(lm, examples, positions=Positions.spans, span_labels=["post"])
    direct, plain = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        settings = CaptureSettings(
            layers=[layer], positions=Positions.spans, span_labels=("post",), batch_size=8
        )
        capture(lm, examples, settings, progress=False)
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        direct_rows(lm, proj, enc, batch_size=8)
        direct.append(time.perf_counter() - t)
    return {
        "examples": len(examples),
        "capture_s": min(plain),
        "direct_s": min(direct),
        "ratio": min(direct) / min(plain),
        "target": 1.5,
    }


def agreement_here(lm, axis, examples, args) -> dict:
    """Exact and attribution patching of the first ``args.agree`` pairs, compared."""
    out = Path(args.work)
    settings = AttributeSettings(
        positions=Positions.spans,
        span_labels=("post",),
        target=Target.label,
        limit=args.agree,
        resid_layers="none",
    )
    src = Provenance("probes/smollm2-135m-reward-history", "", ())
    got = {}
    for method in ("patch", "attrib-patch"):
        s = AttributeSettings(**{**settings.__dict__, "method": method})
        got[method] = run_attribution(lm, axis, examples, out / method, s, source=src, progress=False)
    a = agreement(got["patch"], got["attrib-patch"], k=10)
    return {"pairs": a.n_pairs, "spearman": a.spearman_components, "top10_overlap": a.top_k_overlap,
            "missed": list(a.missed), "sign_flips": list(a.sign_flips)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=16, help="reward-flip pairs timed (both rows of each)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--agree", type=int, default=2, help="pairs patched exactly for the agreement (0: skip)")
    p.add_argument("--from", dest="source", help="read the agreement from a replicate attribute folder")
    p.add_argument("--work", default="runs/bench-attribute")
    p.add_argument("--out", default="runs/bench-attribute.json")
    args = p.parse_args()
    lm = load("smollm2-135m")
    axis = ValueAxis.load(ROOT / "probes" / "smollm2-135m-reward-history", lm=lm)
    examples = read_jsonl(ROOT / "data" / "icrl_pairs.jsonl")
    result = {"load_average": os.getloadavg(), "cost": cost_ratio(lm, axis, examples[: 2 * args.pairs], args)}
    if args.source:
        patch = json.loads((Path(args.source) / "reward-history-patch" / "attribution.json").read_text())
        result["agreement"] = patch.get("agreement")
    elif args.agree:
        result["agreement"] = agreement_here(lm, axis, examples, args)
    c = result["cost"]
    print(f"load average {result['load_average'][0]:.2f} (shared machine: ratios only)")
    print(f"direct attribution / capture, {c['examples']} examples: {c['direct_s']:.2f}s / {c['capture_s']:.2f}s"
          f" = {c['ratio']:.2f}x (target <= {c['target']})")  # fmt: skip
    if result.get("agreement"):
        a = result["agreement"]
        rho = a.get("spearman", a.get("spearman_components"))
        top = a.get("top10_overlap", a.get("top_k_overlap"))
        print(f"attribution vs exact patching: Spearman {rho:+.3f}, top-10 overlap {top:.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
