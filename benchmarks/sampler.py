"""The sampler alone: the shortlist against the full sort it replaced, on the default model's logits.

    python benchmarks/sampler.py                  # prints the table, writes runs/bench-sampler.json
    python benchmarks/sampler.py --rows 240 --steps 20

Takes the next-token logits of the benchmark prompts of ``benchmarks/steer.py`` after a few greedy
steps (so they are real distributions, not random ones), repeats them to ``--rows`` rows, and times
``RowSampler.sample`` (the shortlist, with the full sort where it cannot decide) against the full
sort of every row (the sampler before the shortlist, kept here as in ``tests/test_sampling.py``),
on the same uniforms; both must pick the same tokens. Prints the ratio measured in this run, the
share of rows that needed the full sort, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from valueprobe.hooks.padding import pad_id_for, pad_rows
from valueprobe.model.load import load
from valueprobe.steering.decode.generation import encode_prompts
from valueprobe.steering.decode.sampling import RowSampler

ROOT = Path(__file__).resolve().parents[1]
TOPICS = ["the sea", "a lost key", "winter", "trains", "a red fox", "coffee", "the moon", "old books",
          "rain", "a city at night", "mountains", "a garden"]  # fmt: skip


def full_sort(scores: torch.Tensor, uniforms: torch.Tensor, temperature: float) -> torch.Tensor:
    """The sampler before the shortlist (top_p = 1): sort the whole vocabulary of every row."""
    probs = torch.softmax(scores.double() / temperature, dim=-1)
    ranked, order = probs.sort(dim=-1, descending=True, stable=True)
    cdf = ranked.cumsum(-1)
    u = uniforms * cdf[:, -1]
    pick = torch.searchsorted(cdf, u[:, None]).clamp(max=cdf.shape[1] - 1)
    return order.gather(1, pick).squeeze(1)


def logits(lm, rows: int, new: int) -> torch.Tensor:
    chats = [[{"role": "user", "content": f"Write a few sentences about {t}."}] for t in TOPICS]
    ids, mask = pad_rows(encode_prompts(lm, chats), pad_id=pad_id_for(lm.tokenizer), side="left")
    with torch.inference_mode():
        out = lm.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
            output_logits=True, return_dict_in_generate=True, pad_token_id=pad_id_for(lm.tokenizer),
        )  # fmt: skip
    steps = torch.cat([x.float() for x in out.logits])  # [new * prompts, vocab]
    return steps.repeat(-(-rows // steps.shape[0]), 1)[:rows]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--rows", type=int, default=120, help="rows per sampling step (the sweep's batch)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--out", default=str(ROOT / "runs" / "bench-sampler.json"))
    args = p.parse_args()
    lm = load(args.model)
    scores = logits(lm, args.rows, new=8)
    load_before = os.getloadavg()
    seeds = list(range(args.rows))
    new, old = RowSampler(seeds, temperature=args.temperature), RowSampler(seeds)
    t_new = t_old = 0.0
    for _ in range(args.steps):
        start = time.perf_counter()
        picked = new.sample(scores)
        t_new += time.perf_counter() - start
        uniforms = old.draw()  # the same generators: the same uniforms as `new` drew
        start = time.perf_counter()
        want = full_sort(scores, uniforms, args.temperature)
        t_old += time.perf_counter() - start
        if not torch.equal(picked, want):
            raise SystemExit("the shortlist picked another token than the full sort: a bug")
    result = {
        "rows": args.rows,
        "steps": args.steps,
        "full_sort_ms_per_step": 1000 * t_old / args.steps,
        "shortlist_ms_per_step": 1000 * t_new / args.steps,
        "speedup": t_old / t_new,
        "full_sort_share": new.full_sorts / (args.rows * args.steps),
        "loadavg_before_after": [load_before, os.getloadavg()],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(
        f"sampler, {args.rows} rows a step: full sort {result['full_sort_ms_per_step']:.0f} ms, shortlist"
        f" {result['shortlist_ms_per_step']:.0f} ms -> {result['speedup']:.1f}x; rows needing the full sort"
        f" {100 * result['full_sort_share']:.1f}%; same tokens"
    )
    print(f"load average before / after: {load_before} / {os.getloadavg()} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
