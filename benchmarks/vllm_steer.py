"""vLLM with valueprobe's plugin, in one run: steered ÷ unsteered, and a sweep through vLLM ÷ the HF route.

    flock /tmp/vp-heavy.lock timeout 900 .venv-vllm/bin/python benchmarks/vllm_steer.py --out runs/bench-vllm.json

1. The same requests (``--prompts`` chat prompts × ``--tokens`` greedy tokens, EOS ignored so every
   row has the same length) through one ``vllm.LLM`` (vLLM's default torch.compile), three ways:
   no ``extra_args`` (unsteered), each request steered at +4σ on all positions, and steered with
   the per-token readout. Steered ÷ unsteered is the plugin's cost (target <= 1.10).
2. A steering sweep, prompts × strengths × (the axis and ``--random-directions`` controls), greedy:
   `VllmGenerator` (one request per row, one ``generate`` call per direction) against the HF route's
   batched `generate` (``--batch-size`` rows a call), both on this machine's CPU. The gain vLLM is
   built for shows on GPUs; on 2 shared cores this is a record, not a target.

Each figure is the best of ``--repeats`` runs; the load average is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

PROBE = Path(__file__).resolve().parents[1] / "probes" / "smollm2-135m-value"
TOPICS = ["winter mornings", "gardening", "bicycles", "a robot learning to paint", "the sea", "old maps"]


def _prompts(n: int) -> list[list[dict[str, str]]]:
    asks = [
        "Tell me about {}.",
        "Write a short story about {}.",
        "Describe {}.",
        "Give three facts about {}.",
    ]
    return [[{"role": "user", "content": asks[i % 4].format(TOPICS[i % len(TOPICS)])}] for i in range(n)]


def _best(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _plugin_cost(llm, lm, args) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from valueprobe.steering.decode.generation import encode_prompts
    from valueprobe.steering.hook.spec import SteeringSpec
    from valueprobe.vllm.generate import take_values
    from valueprobe.vllm.request import VllmArgs

    ids = encode_prompts(lm, _prompts(args.prompts))
    requests = [TokensPrompt(prompt_token_ids=i) for i in ids]

    def run(steer: bool, read: bool) -> None:
        keys = [f"bench-{i}" for i in range(len(requests))] if read else [None] * len(requests)
        params = [
            SamplingParams(
                max_tokens=args.tokens,
                temperature=0.0,
                ignore_eos=True,
                extra_args=VllmArgs(
                    SteeringSpec(probe=str(PROBE)), alpha=4.0 if steer else 0.0, key=k
                ).extra_args()
                if (steer or read)
                else None,
            )
            for k in keys
        ]
        llm.reset_prefix_cache()
        llm.generate(requests, params, use_tqdm=False)
        if read:
            take_values(llm, [k for k in keys if k is not None])

    run(False, False)  # warm up
    plain = _best(args.repeats, lambda: run(False, False))
    steered = _best(args.repeats, lambda: run(True, False))
    read = _best(args.repeats, lambda: run(True, True))
    tokens = len(requests) * args.tokens
    return {
        "requests": len(requests),
        "tokens": tokens,
        "unsteered_s": plain,
        "steered_s": steered,
        "steered_read_s": read,
        "steered_over_unsteered": steered / plain,
        "steered_read_over_unsteered": read / plain,
        "unsteered_tok_s": tokens / plain,
    }


def _sweep(llm, lm, axis, args) -> dict:
    import valueprobe as vp
    from valueprobe.stats.null import random_directions
    from valueprobe.vllm.generate import VllmGenerator

    prompts = _prompts(args.sweep_prompts)
    alphas = [-4.0, -2.0, 0.0, 2.0, 4.0]
    rand = torch.from_numpy(random_directions(axis.d_model, args.random_directions, seed=0)).float()
    directions = [None, *list(rand)]
    kw = {
        "alphas": alphas,
        "decoding": vp.Decoding(greedy=True, max_new_tokens=args.sweep_tokens),
        "progress": False,
    }
    gen = VllmGenerator(llm)

    def run_vllm() -> None:
        for d in directions:
            gen(lm, vp.SteeringSpec(axis, probe=str(PROBE), direction=d), prompts, **kw)

    def run_hf() -> None:
        for d in directions:
            vp.generate(lm, vp.SteeringSpec(axis, direction=d), prompts, batch_size=args.batch_size, **kw)

    t_vllm = _best(args.repeats, run_vllm)
    t_hf = _best(args.repeats, run_hf)
    rows = len(prompts) * len(alphas) * len(directions)
    return {
        "rows": rows,
        "max_new_tokens": args.sweep_tokens,
        "vllm_s": t_vllm,
        "hf_s": t_hf,
        "vllm_over_hf": t_vllm / t_hf,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--sweep-prompts", type=int, default=12)
    p.add_argument("--sweep-tokens", type=int, default=32)
    p.add_argument("--random-directions", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=60)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()

    import valueprobe as vp
    from valueprobe.probe.axis import ValueAxis
    from valueprobe.vllm.generate import open_llm

    lm = vp.load("smollm2-135m")
    axis = ValueAxis.load(PROBE, lm=lm)
    t = time.perf_counter()
    llm = open_llm("smollm2-135m", max_model_len=1024)
    start = time.perf_counter() - t
    result = {
        "load_average_before": os.getloadavg(),
        "vllm_start_s": start,
        "plugin_cost": _plugin_cost(llm, lm, args),
        "sweep": _sweep(llm, lm, axis, args),
        "load_average_after": os.getloadavg(),
        "torch_threads": torch.get_num_threads(),
    }
    c, s = result["plugin_cost"], result["sweep"]
    print(f"load average {result['load_average_before']} -> {result['load_average_after']}")
    print(
        f"plugin: {c['requests']} requests x {args.tokens} tokens: unsteered {c['unsteered_s']:.2f}s "
        f"({c['unsteered_tok_s']:.0f} tok/s), steered {c['steered_s']:.2f}s, steered+read {c['steered_read_s']:.2f}s; "
        f"steered / unsteered = {c['steered_over_unsteered']:.3f}, with readout {c['steered_read_over_unsteered']:.3f}"
    )
    print(
        f"sweep: {s['rows']} rows x {s['max_new_tokens']} greedy tokens: vLLM {s['vllm_s']:.1f}s, "
        f"HF batched {s['hf_s']:.1f}s; vLLM / HF = {s['vllm_over_hf']:.3f}"
    )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
