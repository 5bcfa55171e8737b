"""Capture overhead and memory on the default model, measured in one run.

    python benchmarks/capture.py                    # prints the table and writes runs/bench-capture.json
    python benchmarks/capture.py --n 32 --repeats 5

Prints:
- capture time / bare forward time, for last-token capture of every layer (in memory) and for
  span-mean capture of every layer streamed to an on-disk store (tokenization and writes included).
  The bare forward is the same model body on the same padded batches, with no hooks.
- the time to load the cached default model (after the first conversion);
- RSS held after, and peak RSS during, a capture to disk of 1x and 10x the dataset (separate
  processes), and the growth of each (benchmarks/rss.py says why the two differ).
Targets: ratio <= 1.05; held RSS growth from 1x to 10x <= 10%.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch
from rss import child_rss, print_peak  # benchmarks/rss.py, next to this script

ROOT = Path(__file__).resolve().parents[1]


def _examples(n: int, data: str):
    from valueprobe.datasets.io import Example, read_jsonl

    base = read_jsonl(data)
    out = []
    for i in range(n):
        ex = base[i % len(base)]
        out.append(
            Example(
                id=f"{ex.id}#{i}",
                label=ex.label,
                group=ex.group,
                text=ex.text,
                messages=ex.messages,
                spans=ex.spans,
                meta=ex.meta,
            )
        )
    return out


def _bare_forward(lm, batches) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        for b in batches:
            lm.model.base_model(
                input_ids=b.input_ids,
                attention_mask=b.attention_mask,
                position_ids=b.position_ids,
                use_cache=False,
            )
    return time.perf_counter() - start


def timing(args) -> dict:
    from valueprobe.activations.capture import CaptureSettings, _route_run, iter_batches
    from valueprobe.activations.encode import encode
    from valueprobe.activations.store import capture_to_store
    from valueprobe.hooks.padding import pad_id_for
    from valueprobe.model.load import load

    start = time.perf_counter()
    lm = load(args.model)
    load_seconds = time.perf_counter() - start
    exs = _examples(args.n, args.data)
    layers = list(range(lm.n_layers))
    results: dict[str, list[float]] = {"bare": [], "last_all_layers": [], "spans_to_disk": []}
    enc_last = encode(lm, exs, positions="last")
    batches = list(
        iter_batches(
            enc_last, batch_size=args.batch_size, padding_side="right", pad_id=pad_id_for(lm.tokenizer)
        )
    )
    _bare_forward(lm, batches[:1])  # warm-up
    for _ in range(args.repeats):  # interleaved, min of repeats: robust to a busy machine
        results["bare"].append(_bare_forward(lm, batches))
        start = time.perf_counter()
        for b in batches:
            _route_run(lm, b, layers=layers, site="resid_post", include_embed=False)
        results["last_all_layers"].append(time.perf_counter() - start)
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            settings = CaptureSettings(layers="all", positions="spans", batch_size=args.batch_size)
            capture_to_store(lm, exs, Path(tmp) / "s", settings, dtype="float16", progress=False)
            results["spans_to_disk"].append(time.perf_counter() - start)
    best = {k: min(v) for k, v in results.items()}
    return {
        "n_examples": args.n,
        "cached_load_seconds": load_seconds,
        "seconds_min": best,
        "ratio_last_all_layers": best["last_all_layers"] / best["bare"],
        "ratio_spans_to_disk": best["spans_to_disk"] / best["bare"],
    }


def rss_child(args) -> None:
    """Child process: capture n examples to disk, print peak RSS in MB."""
    from valueprobe.activations.capture import CaptureSettings
    from valueprobe.activations.store import capture_to_store
    from valueprobe.model.load import load

    lm = load(args.model)
    exs = _examples(args.n, args.data)
    with tempfile.TemporaryDirectory() as tmp:
        settings = CaptureSettings(
            layers="all", positions="spans", batch_size=args.batch_size, include_embed=True
        )
        capture_to_store(
            lm, exs, Path(tmp) / "s", settings, examples_per_shard=64, dtype="float16", progress=False
        )
    print_peak()


def rss(args, n: int) -> dict[str, float]:
    """Peak and held RSS (benchmarks/rss.py) of a capture of ``n`` examples, in a fresh process."""
    sizes = ["--n", str(n), "--model", args.model, "--data", args.data, "--batch-size", str(args.batch_size)]
    return child_rss(__file__, sizes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--data", default=str(ROOT / "data" / "icrl.jsonl"))
    p.add_argument("--n", type=int, default=48, help="examples in the 1x dataset")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=str(ROOT / "runs" / "bench-capture.json"))
    args = p.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    if args.rss_child:
        rss_child(args)
        return
    result = timing(args)
    one, ten = rss(args, args.n), rss(args, 10 * args.n)
    result.update(peak_rss_mb_1x=one["peak_rss_mb"], peak_rss_mb_10x=ten["peak_rss_mb"])
    result.update(held_mb_1x=one["held_mb"], held_mb_10x=ten["held_mb"])
    result.update(
        rss_growth=ten["peak_rss_mb"] / one["peak_rss_mb"] - 1,
        held_growth=ten["held_mb"] / one["held_mb"] - 1,
    )
    print(
        f"capture benchmark on {args.model}, {args.n} examples from {Path(args.data).name}, batch {args.batch_size}"
    )
    print(
        f"  cached model load (import done)           {result['cached_load_seconds']:.2f} s   (target < 2 s)"
    )
    print(f"  bare forward (min of {args.repeats})           {result['seconds_min']['bare']:.2f} s")
    print(
        f"  last token, all layers, in memory / bare      {result['ratio_last_all_layers']:.3f}   (target <= 1.05)"
    )
    print(
        f"  span means, all layers, to disk / bare        {result['ratio_spans_to_disk']:.3f}   (target <= 1.05)"
    )
    print(
        f"  held RSS 1x ({args.n}) / 10x ({10 * args.n})            {one['held_mb']:.0f} MB / {ten['held_mb']:.0f} MB "
        f"-> growth {100 * result['held_growth']:.1f}%   (target <= 10%)"
    )
    print(
        f"  peak RSS 1x ({args.n}) / 10x ({10 * args.n})            {one['peak_rss_mb']:.0f} MB / {ten['peak_rss_mb']:.0f} MB "
        f"-> {100 * result['rss_growth']:+.1f}%   (one run each: the peak moves with allocation history,"
        " see benchmarks/scale.py)"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
