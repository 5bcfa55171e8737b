"""Steering overhead, sweep speed-up and memory on the default model, measured in one run.

    nice -n 10 python benchmarks/steer.py              # prints the table, writes runs/bench-steer.json
    python benchmarks/steer.py --repeats 1 --seq-rows 40

Prints:
- steered batched ``generate`` ÷ plain batched ``generate`` (24 prompts, one α per row, 48 tokens,
  greedy, fixed length; min of interleaved repeats). Target <= 1.05.
- a full sweep (5 strengths × 24 prompts × 2 samples = 240 rows, 48 new tokens, sampled with
  common random numbers) run batched (`valueprobe.steering.decode.generation.generate`, ``--batch-size`` rows a call) against
  the same rows run one per ``generate`` call, as the paper's code does. Target >= 8×.
  ``--seq-rows k`` times only the first k one-per-call rows and scales to 240 (then says so).
- peak RSS of the sweep at 1× and 4× its rows (separate processes, same chunk size). Target:
  growth <= 10%.
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
from rss import child_peak_mb, print_peak  # benchmarks/rss.py, next to this script

from valueprobe.hooks.padding import pad_id_for, pad_rows
from valueprobe.model.load import load
from valueprobe.probe.axis import ValueAxis
from valueprobe.steering.decode.generation import encode_prompts, generate
from valueprobe.steering.decode.sampling import Decoding
from valueprobe.steering.hook.handle import steer

ROOT = Path(__file__).resolve().parents[1]
TOPICS = ["the sea", "a lost key", "winter", "trains", "a red fox", "coffee", "the moon", "old books",
          "rain", "a city at night", "mountains", "a garden", "friendship", "a storm", "music",
          "a bicycle", "bread", "the desert", "a lighthouse", "clocks", "bees", "snow", "a river", "letters"]  # fmt: skip
ALPHAS = [-2.0, -1.0, 0.0, 1.0, 2.0]


def prompts(n: int) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": f"Write a few sentences about {TOPICS[i % len(TOPICS)]}."}]
        for i in range(n)
    ]


def overhead(lm, axis, args) -> dict:
    pad = pad_id_for(lm.tokenizer)
    ids, mask = pad_rows(encode_prompts(lm, prompts(24)), pad_id=pad, side="left")
    alpha = torch.tensor([ALPHAS[i % 5] for i in range(24)])
    kw = dict(
        max_new_tokens=args.new,
        min_new_tokens=args.new,
        do_sample=False,
        pad_token_id=pad,
    )
    plain, steered = [], []
    with torch.inference_mode():
        lm.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2)  # warm-up
        for _ in range(args.repeats):
            start = time.perf_counter()
            lm.model.generate(input_ids=ids, attention_mask=mask, **kw)
            plain.append(time.perf_counter() - start)
            start = time.perf_counter()
            with steer(lm, axis, alpha):
                lm.model.generate(input_ids=ids, attention_mask=mask, **kw)
            steered.append(time.perf_counter() - start)
    return {"plain_s": min(plain), "steered_s": min(steered), "steer_ratio": min(steered) / min(plain)}


def sweep(lm, axis, args) -> dict:
    ps = prompts(24)
    decoding = Decoding(samples=2, max_new_tokens=args.new, min_new_tokens=args.new, temperature=0.7, seed=0)
    kw = dict(alphas=ALPHAS, decoding=decoding, progress=False)
    start = time.perf_counter()
    generate(lm, axis, ps, batch_size=args.batch_size, **kw)
    batched_s = time.perf_counter() - start
    rows = [(p, s, a) for p in range(24) for s in range(2) for a in ALPHAS]
    todo = rows[: args.seq_rows] if args.seq_rows else rows
    start = time.perf_counter()
    alone = []
    for p, _sample, a in todo:  # one row per generate call: the paper's loop (same work per row)
        one = {**kw, "alphas": [a], "decoding": replace(decoding, samples=1)}
        alone.extend(generate(lm, axis, [ps[p]], **one, batch_size=1))
    seq_s = (time.perf_counter() - start) * len(rows) / len(todo)
    return {
        "rows": len(rows),
        "batched_s": batched_s,
        "one_per_call_s": seq_s,
        "one_per_call_rows_timed": len(todo),
        "speedup": seq_s / batched_s,
    }


def rss_child(args) -> None:
    lm = load(args.model)
    axis = ValueAxis.load(args.probe, lm=lm)
    n = args.rss_prompts
    generate(
        lm,
        axis,
        prompts(n),
        decoding=Decoding(samples=2, max_new_tokens=16, min_new_tokens=16),
        alphas=ALPHAS,
        batch_size=args.batch_size,
        progress=False,
    )
    print_peak()


def rss(args, n_prompts: int) -> float:
    sizes = [
        "--rss-prompts",
        str(n_prompts),
        "--model",
        args.model,
        "--probe",
        args.probe,
        "--batch-size",
        str(args.batch_size),
    ]
    return child_peak_mb(__file__, sizes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--probe", default=str(ROOT / "probes" / "smollm2-135m-value"))
    p.add_argument("--new", type=int, default=48)
    p.add_argument(
        "--batch-size", type=int, default=120, help="rows per batched generate call (sweep and RSS)"
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--seq-rows", type=int, default=0, help="time only this many one-per-call rows, scale to 240"
    )
    p.add_argument("--out", default=str(ROOT / "runs" / "bench-steer.json"))
    p.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rss-prompts", type=int, default=6, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rss_child:
        rss_child(args)
        return
    torch.set_num_threads(max(1, torch.get_num_threads()))
    lm = load(args.model)
    axis = ValueAxis.load(args.probe, lm=lm)
    load_before = os.getloadavg()
    result = {"model": args.model, "probe": args.probe, "threads": torch.get_num_threads()}
    result.update(overhead(lm, axis, args))
    print(f"steered / plain batched generate:  {result['steer_ratio']:.3f}   (target <= 1.05)", flush=True)
    result.update(sweep(lm, axis, args))
    print(f"sweep: {result['speedup']:.1f}x", flush=True)
    base = max(6, -(-args.batch_size // 10))  # 10 rows a prompt: the 1x sweep fills at least one batch
    one, four = rss(args, base), rss(args, 4 * base)
    result.update(peak_rss_mb_1x=one, peak_rss_mb_4x=four, rss_growth=(four - one) / one)
    result["loadavg_before_after"] = [load_before, os.getloadavg()]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"steered / plain batched generate:  {result['steer_ratio']:.3f}   (target <= 1.05)")
    scaled = "" if not args.seq_rows else f" (timed {args.seq_rows} rows, scaled)"
    print(
        f"sweep {result['rows']} rows: batched {result['batched_s']:.1f}s, one per call "
        f"{result['one_per_call_s']:.1f}s{scaled} -> {result['speedup']:.1f}x   (target >= 8x)"
    )
    print(
        f"peak RSS 1x {one:.0f} MB, 4x {four:.0f} MB -> growth {100 * result['rss_growth']:.1f}%   (target <= 10%)"
    )
    print(f"load average before / after: {load_before} / {os.getloadavg()} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
