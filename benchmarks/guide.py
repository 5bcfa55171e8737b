"""Guided decoding's cost on the default model, and rollback's tokens against its accuracy, in one run.

    nice -n 10 python benchmarks/guide.py            # prints the table, writes runs/bench-guide.json
    python benchmarks/guide.py --repeats 1 --tasks 12

Prints:
- guided best-of-N (`valueprobe.guided.run.guide`, N = 8, the value read at the axis's best layer
  inside the generating forward, the pick by mean σ) ÷ plain sampling of the same N
  (`valueprobe.steering.decode.generation.generate` with ``samples=8``: transformers' ``generate`` with the
  same per-row sampler), and ÷ transformers' ``generate`` with that sampler and no hook at all: 6 prompts × 8 rows, 48 new tokens, temperature 0.8, the same seeds, so the
  same tokens (checked). Min of interleaved repeats. Target <= 1.05. Both stop a row at EOS;
  ``generate`` keeps stepping a finished row until the batch ends, guide drops it.
- prune (every 8 tokens, quantile 0.5) on the same rows: its tokens spent ÷ best-of-N's.
- on the checkable arithmetic tasks (data/task_arithmetic.jsonl, ``--tasks`` questions spread over
  the levels, the last-integer rule of `valueprobe.datasets.answers`): accuracy and tokens spent per
  prompt of one sample, best-of-N by σ, by log-probability and by one random direction (the
  same N samples: common random numbers), prune, and rollback
  (k = 8, τ = 1, at most 2, with α = 0 and α = +2 σ for 8 tokens).
The machine is shared: the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import torch

from valueprobe.datasets.answers import check, read_tasks
from valueprobe.files import atomic_write_text
from valueprobe.guided.policy import BestOfN, Policy, Prune, Rollback
from valueprobe.guided.run import guide
from valueprobe.hooks.padding import pad_id_for, pad_rows
from valueprobe.model.load import load
from valueprobe.probe.axis import ValueAxis
from valueprobe.stats.null import random_directions
from valueprobe.steering.decode.generation import encode_prompts, generate
from valueprobe.steering.decode.sampling import Decoding, RowSampler, row_seed
from valueprobe.steering.hook.spec import SteeringSpec

ROOT = Path(__file__).resolve().parents[1]
TOPICS = ["the sea", "a lost key", "winter", "trains", "a red fox", "coffee"]


def prompts() -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"Write a few sentences about {t}."}] for t in TOPICS]


def bare_generate(lm, ps, args) -> list[list[int]]:
    """The same rows through transformers' ``generate`` alone: the per-row sampler, no hook at all."""
    encoded = [e for e in encode_prompts(lm, ps) for _ in range(args.n)]
    seeds = [row_seed(0, p, s) for p in range(len(ps)) for s in range(args.n)]
    pad = pad_id_for(lm.tokenizer)
    ids, mask = pad_rows(encoded, pad_id=pad, side="left")
    eos = lm.tokenizer.eos_token_id
    with torch.inference_mode():
        seqs = lm.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=args.new, do_sample=False, pad_token_id=pad,
            eos_token_id=eos, logits_processor=[RowSampler(seeds, temperature=0.8)],
        )  # fmt: skip
    out = []
    for row in seqs[:, ids.shape[1] :].tolist():
        out.append(row[: row.index(eos)] if eos in row else row)
    return out


def overhead(lm, axis, args) -> dict:
    decoding = Decoding(max_new_tokens=args.new, temperature=0.8, seed=0)
    kw = {"decoding": decoding, "progress": False, "batch_size": 48}
    ps = prompts()
    guide(
        lm, axis, ps[:1], BestOfN(n=2), **{**kw, "decoding": replace(decoding, max_new_tokens=2)}
    )  # warm-up
    plain_s, bare_s, guided_s, same = [], [], [], True
    for _ in range(args.repeats):
        start = time.perf_counter()
        gens = generate(lm, axis, ps, **{**kw, "decoding": replace(decoding, samples=args.n)})
        plain_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        bare = bare_generate(lm, ps, args)
        bare_s.append(time.perf_counter() - start)
        same &= bare == [list(g.token_ids) for g in gens]
        start = time.perf_counter()
        out = guide(lm, axis, ps, BestOfN(n=args.n), **kw)
        guided_s.append(time.perf_counter() - start)
        same &= [g.token_ids for g in gens] == [c.token_ids for g in out for c in g.candidates]
        print(
            f"  repeat: generate {plain_s[-1]:.2f}s, bare {bare_s[-1]:.2f}s, guide {guided_s[-1]:.2f}s",
            flush=True,
        )
    pruned = guide(lm, axis, ps, Prune(n=args.n, every=8, quantile=0.5), **kw)
    spent = sum(g.tokens_spent for g in out)
    return {
        "plain_s": min(plain_s),
        "guided_s": min(guided_s),
        "guided_ratio": min(guided_s) / min(plain_s),
        "bare_s": min(bare_s),
        "guided_over_bare": min(guided_s) / min(bare_s),
        "same_tokens": same,
        "best_of_n_tokens": spent,
        "prune_tokens": sum(g.tokens_spent for g in pruned),
        "prune_token_ratio": sum(g.tokens_spent for g in pruned) / spent,
    }


def accuracy(lm, axis, args) -> dict:
    tasks = read_tasks(ROOT / "data" / "task_arithmetic.jsonl")
    step = max(1, len(tasks) // args.tasks)
    chosen = tasks[::step][: args.tasks]
    chats = [list(t.messages) for t in chosen]
    kw = {
        "decoding": Decoding(max_new_tokens=args.new, temperature=0.8, seed=0),
        "progress": False,
        "batch_size": 48,
    }

    null = torch.from_numpy(random_directions(lm.d_model, 1, seed=0)[0]).float()

    def run(policy: Policy, score: str = "sigma", direction: torch.Tensor | None = None) -> dict:
        start = time.perf_counter()
        out = guide(lm, SteeringSpec(axis, direction=direction), chats, policy, score=score, **kw)
        right = [check(t, g.text).correct for t, g in zip(chosen, out, strict=True)]
        row = {
            "accuracy": sum(right) / len(right),
            "tokens_per_prompt": sum(g.tokens_spent for g in out) / len(out),
            "rollbacks_per_prompt": sum(g.rollbacks for g in out) / len(out),
            "seconds": time.perf_counter() - start,
        }
        print(
            f"  {policy.name} n={policy.n} by {score}{'' if direction is None else ' (random direction)'}: {row}",
            flush=True,
        )
        return row

    rows = {
        "one sample": run(BestOfN(n=1)),
        f"best-of-{args.n} by σ": run(BestOfN(n=args.n)),
        f"best-of-{args.n} by log-prob": run(BestOfN(n=args.n), "logprob"),
        f"best-of-{args.n} by a random direction": run(BestOfN(n=args.n), direction=null),
        f"prune {args.n} (every 8, q 0.5)": run(Prune(n=args.n, every=8, quantile=0.5)),
        "rollback k=8 τ=1 (α=0)": run(Rollback(n=1, k=8, tau=1.0, max_rollbacks=2)),
        "rollback k=8 τ=1 (α=+2σ, 8 tokens)": run(Rollback(n=1, k=8, tau=1.0, max_rollbacks=2, alpha=2.0)),
    }
    return {"tasks": len(chosen), "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--probe", default=str(ROOT / "probes" / "smollm2-135m-reward-history"))
    p.add_argument("--new", type=int, default=48)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tasks", type=int, default=24)
    p.add_argument("--out", default=str(ROOT / "runs" / "bench-guide.json"))
    args = p.parse_args()
    load_before = os.getloadavg()
    lm = load(args.model)
    axis = ValueAxis.load(args.probe, lm=lm)
    print(f"load average at start {load_before}", flush=True)
    res = {"overhead": overhead(lm, axis, args)}
    print(f"overhead: {res['overhead']}  load average {os.getloadavg()}", flush=True)
    res["accuracy"] = accuracy(lm, axis, args)
    res["load_average"] = {"before": load_before, "after": os.getloadavg()}
    res["settings"] = vars(args)
    o = res["overhead"]
    print(
        f"guided best-of-{args.n} ÷ plain sampling of the same {args.n}: {o['guided_ratio']:.3f}"
        f" ({o['guided_s']:.2f}s / {o['plain_s']:.2f}s; same tokens: {o['same_tokens']})  target <= 1.05"
    )
    print(f"guided best-of-{args.n} ÷ bare transformers generate (no hooks): {o['guided_over_bare']:.3f}")
    print(f"prune tokens ÷ best-of-{args.n} tokens: {o['prune_token_ratio']:.3f}")
    print(f"arithmetic tasks ({res['accuracy']['tasks']} questions, last-integer rule):")
    for name, r in res["accuracy"]["rows"].items():
        print(
            f"  {name:38s} accuracy {r['accuracy']:.3f}  tokens/prompt {r['tokens_per_prompt']:7.1f}"
            f"  rollbacks/prompt {r['rollbacks_per_prompt']:.2f}"
        )
    print(f"load average before {load_before}, after {res['load_average']['after']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
