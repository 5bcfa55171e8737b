"""GPU benchmark at the Qwen3-8B shape (random weights, bf16): every row of issue 27's table, one run.

    python benchmarks/gpu.py                                    # on a GPU: Qwen3-8B shape, bf16, ~3 min
    python benchmarks/gpu.py --device cpu --shape tiny --dtype float32 --scale 0.25   # checks it end to end on a CPU

It builds the model from a config (no download: random weights, the default model's tokenizer)
and prints, per row, the measured figure, its target and the peak GPU memory of that row:

- ``vp.capture`` last token at every layer ÷ a bare forward over the same batches (≤ 1.03);
- ``vp.capture_to_store``, span means written to disk ÷ the bare forward (≤ 1.10);
- steering exactness in the run dtype: the shift along v̂ at non-pad cells against the wanted α·σ,
  and the largest part orthogonal to v̂, beside the mean ‖h‖ (bf16 rounds each cell);
- ``vp.generate`` (α = 2 and α = 0 at layer 0) ÷ plain ``model.generate`` of the same rows (≤ 1.03);
- ``vp.steer`` as a context around plain ``generate`` at the middle layer ÷ plain (keep ≈ 1);
- a sweep (prompts × 5 α × 2 samples) batched against the paper's one-row-per-call loop (≥ 100×;
  the loop is timed on ``--loop-rows`` rows and scaled, and says so);
- ``vp.guide`` best-of-8 ÷ ``vp.generate`` of the same 8 samples per prompt (≤ 1.05);
- the serve hf engine's decode (`valueprobe.steering.decode.rows.generate_rows`, the batch the
  engine runs for N concurrent clients) in tokens/s at 1, 16 and 64 rows;
- compiled ÷ eager decoding under ``cache_implementation="static"``, plain and steered (or why not).

What random weights can show: speed, memory and the arithmetic of steering. Nothing about values,
probes or behaviour: the axis here is a random unit direction whose σ is measured on the batch.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {  # hidden, layers, heads, kv heads, intermediate
    "qwen3-8b": (4096, 36, 32, 8, 12288),
    "llama3-70b-slice": (8192, 8, 64, 8, 28672),  # 8 of Llama-3-70B's 80 layers
    "tiny": (64, 4, 4, 2, 128),
}
TOPICS = ["the sea", "a lost key", "winter", "trains", "a red fox", "coffee", "the moon", "old books"]


def build(args):
    """The model of ``--shape`` with random weights on ``--device`` in ``--dtype``, wrapped."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from valueprobe.model.load import load, wrap

    if args.tokenizer:  # a saved tokenizer folder: a GPU machine without the model cache or network
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        tokenizer = load("smollm2-135m").tokenizer  # cached offline; only its tokenizer is used
    hidden, layers, heads, kv, inter = SHAPES[args.shape]
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, intermediate_size=inter, head_dim=hidden // heads, max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, args.dtype))
    return wrap(model, tokenizer, model_id=f"random-{args.shape}")


def random_axis(lm, prompts):
    """A random unit direction at every layer, μ and σ measured on the prompts (speed and exactness only)."""
    from valueprobe.hooks.padding import pad_id_for, pad_rows
    from valueprobe.probe.axis import ValueAxis
    from valueprobe.steering.decode.generation import encode_prompts

    n, d = lm.n_layers, lm.d_model
    v = torch.randn(n, d, generator=torch.Generator().manual_seed(1))
    v = v / v.norm(dim=1, keepdim=True)
    ids, mask = pad_rows(encode_prompts(lm, prompts), pad_id=pad_id_for(lm.tokenizer), side="left")
    with torch.inference_mode():
        hs = lm.model(
            input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device), output_hidden_states=True
        )
    real = mask.bool()
    proj = torch.stack([(h.float().cpu()[real] @ v[i]) for i, h in enumerate(hs.hidden_states[1:])])
    norms = torch.stack([h.float().cpu()[real].norm(dim=-1).mean() for h in hs.hidden_states[1:]])
    return ValueAxis(
        directions=v, layers=tuple(range(n)), mu=proj.mean(1), sigma=proj.std(1), mean_norm=norms,
        best_layer=n // 2, site="resid_post", method="random (benchmark)", model_id=lm.model_id,
        fingerprint=lm.fingerprint, d_model=d,
    )  # fmt: skip


def chats(n: int) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": f"Write about {TOPICS[i % len(TOPICS)]}, part {i}."}] for i in range(n)
    ]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def best_of(fn: Callable[[], object], repeats: int, device: str) -> float:
    """The fastest of ``repeats`` runs, in seconds (after one warm-up run)."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return min(times)


def plain_generate(lm, prompts, tokens: int) -> Callable[[], object]:
    from valueprobe.hooks.padding import pad_id_for, pad_rows
    from valueprobe.steering.decode.generation import encode_prompts

    pad = pad_id_for(lm.tokenizer)
    ids, mask = pad_rows(encode_prompts(lm, prompts), pad_id=pad, side="left")
    ids, mask = ids.to(lm.device), mask.to(lm.device)
    kw = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=pad)

    def run(**extra):
        with torch.inference_mode():
            return lm.model.generate(input_ids=ids, attention_mask=mask, **kw, **extra)

    return run


def row_capture(lm, args) -> dict:
    from valueprobe.activations.capture import CaptureSettings, capture, iter_batches
    from valueprobe.activations.encode import encode
    from valueprobe.activations.store import capture_to_store
    from valueprobe.datasets.io import read_jsonl
    from valueprobe.hooks.padding import pad_id_for

    base = read_jsonl(ROOT / "data" / "icrl.jsonl")
    exs = [replace(base[i % len(base)], id=f"{base[i % len(base)].id}#{i}") for i in range(args.examples)]
    enc = encode(lm, exs, positions="last")
    batches = list(
        iter_batches(enc, batch_size=args.batch_size, padding_side="right", pad_id=pad_id_for(lm.tokenizer))
    )
    tokens = sum(int(b.attention_mask.sum()) for b in batches)

    def bare():
        with torch.inference_mode():
            for b in batches:
                lm.model.base_model(
                    input_ids=b.input_ids.to(lm.device), attention_mask=b.attention_mask.to(lm.device),
                    position_ids=b.position_ids.to(lm.device), use_cache=False,
                )  # fmt: skip

    settings = CaptureSettings(layers="all", batch_size=args.batch_size)
    spans = CaptureSettings(layers="all", positions="spans", batch_size=args.batch_size)

    def to_disk():
        with tempfile.TemporaryDirectory() as tmp:
            capture_to_store(lm, exs, Path(tmp) / "s", spans, dtype="float16", progress=False)

    t_bare = best_of(bare, args.repeats, args.device)
    t_last = best_of(lambda: capture(lm, exs, settings, progress=False), args.repeats, args.device)
    t_disk = best_of(to_disk, args.repeats, args.device)
    return {
        "examples": len(exs), "tokens": tokens, "bare_s": t_bare,
        "capture_last_all_layers_ratio": t_last / t_bare, "capture_to_store_spans_ratio": t_disk / t_bare,
    }  # fmt: skip


def row_exactness(lm, axis, prompts, args) -> dict:
    """The shift along v̂ a steered forward makes at layer L's output, against the wanted α·σ."""
    from valueprobe.hooks.padding import pad_id_for, pad_rows
    from valueprobe.steering.decode.generation import encode_prompts
    from valueprobe.steering.hook.handle import steer
    from valueprobe.steering.hook.spec import SteeringSpec

    layer, alpha = lm.n_layers // 2, 2.0
    ids, mask = pad_rows(encode_prompts(lm, prompts), pad_id=pad_id_for(lm.tokenizer), side="left")
    ids, mask = ids.to(lm.device), mask.to(lm.device)
    with torch.inference_mode():
        base = lm.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[
            layer + 1
        ]
        with steer(lm, SteeringSpec(axis, layers=layer), alpha):
            got = lm.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[
                layer + 1
            ]
    real = mask.bool()
    v = axis.direction(layer).to(lm.device)
    delta = (got.float() - base.float())[real]
    shift = delta @ v
    orth = (delta - shift[:, None] * v).norm(dim=-1)
    return {
        "wanted_shift": alpha * float(axis.sigma[layer]), "shift_min": float(shift.min()),
        "shift_max": float(shift.max()), "orthogonal_max": float(orth.max()),
        "mean_norm_h": float(base.float()[real].norm(dim=-1).mean()), "dtype": args.dtype,
    }  # fmt: skip


def row_generate(lm, axis, prompts, args) -> dict:
    from valueprobe.steering.decode.generation import generate
    from valueprobe.steering.decode.sampling import Decoding
    from valueprobe.steering.hook.handle import steer
    from valueprobe.steering.hook.spec import SteeringSpec

    plain = plain_generate(lm, prompts, args.tokens)
    decoding = Decoding(greedy=True, max_new_tokens=args.tokens, min_new_tokens=args.tokens)

    def steered(alpha: float) -> Callable[[], object]:
        spec = SteeringSpec(axis, layers=0)
        return lambda: generate(
            lm, spec, prompts, alphas=[alpha], decoding=decoding, batch_size=len(prompts), progress=False
        )

    def context():
        with steer(lm, SteeringSpec(axis, layers=lm.n_layers // 2), 2.0):
            plain()

    t_plain = best_of(plain, args.repeats, args.device)
    return {
        "rows": len(prompts), "tokens": args.tokens, "plain_s": t_plain,
        "generate_alpha2_layer0_ratio": best_of(steered(2.0), args.repeats, args.device) / t_plain,
        "generate_alpha0_ratio": best_of(steered(0.0), args.repeats, args.device) / t_plain,
        "steer_context_mid_layer_ratio": best_of(context, args.repeats, args.device) / t_plain,
    }  # fmt: skip


def row_sweep(lm, axis, args) -> dict:
    from valueprobe.steering.decode.generation import generate
    from valueprobe.steering.decode.sampling import Decoding

    prompts, alphas = chats(args.sweep_prompts), [-2.0, -1.0, 0.0, 1.0, 2.0]
    decoding = Decoding(samples=2, max_new_tokens=args.sweep_tokens, min_new_tokens=args.sweep_tokens, seed=0)
    kw = dict(decoding=decoding, progress=False)
    start = time.perf_counter()
    generate(lm, axis, prompts, alphas=alphas, batch_size=len(prompts) * 10, **kw)
    sync(args.device)
    batched = time.perf_counter() - start
    rows = [(p, a) for p in range(len(prompts)) for _ in range(2) for a in alphas]
    todo = rows[: args.loop_rows]
    start = time.perf_counter()
    for p, a in todo:  # the paper's loop: one row per generate call
        generate(lm, axis, [prompts[p]], alphas=[a], decoding=replace(decoding, samples=1), progress=False)
    sync(args.device)
    loop = (time.perf_counter() - start) * len(rows) / len(todo)
    return {"sweep_rows": len(rows), "batched_s": batched, "loop_s_scaled": loop,
            "loop_rows_timed": len(todo), "sweep_speedup": loop / batched}  # fmt: skip


def row_guide(lm, axis, args) -> dict:
    from valueprobe import guide
    from valueprobe.guided.policy import BestOfN
    from valueprobe.steering.decode.generation import generate
    from valueprobe.steering.decode.sampling import Decoding

    prompts = chats(args.guide_prompts)
    decoding = Decoding(max_new_tokens=args.sweep_tokens, seed=0)
    t_guide = best_of(lambda: guide(lm, axis, prompts, BestOfN(n=8), decoding=decoding, batch_size=8 * len(prompts),
                                    progress=False), args.repeats, args.device)  # fmt: skip
    same = replace(decoding, samples=8)
    t_gen = best_of(lambda: generate(lm, axis, prompts, decoding=same, batch_size=8 * len(prompts), progress=False),
                    args.repeats, args.device)  # fmt: skip
    return {"guide_prompts": len(prompts), "guide_best_of_8_ratio": t_guide / t_gen}


def row_serve(lm, axis, args) -> dict:
    from valueprobe.steering.decode.generation import encode_prompts
    from valueprobe.steering.decode.rows import RowSpec, generate_rows
    from valueprobe.steering.hook.spec import SteeringSpec

    out = {}
    for n in (1, 16, 64):
        ids = encode_prompts(lm, chats(n))
        rows = [RowSpec(tuple(i), max_new_tokens=args.tokens, ignore_eos=True) for i in ids]
        alphas = [2.0 if i % 2 else 0.0 for i in range(n)]
        t = best_of(lambda rows=rows, alphas=alphas: generate_rows(lm, SteeringSpec(axis), rows, alphas),
                    1, args.device)  # fmt: skip
        out[f"serve_rows_{n}_tokens_per_s"] = n * args.tokens / t
    return out


def row_compiled(lm, axis, prompts, args) -> dict:
    """Static cache and torch.compile ÷ eager, plain and steered (a failure is reported, not hidden).

    The steered forward is compiled with the hooks on: dynamo does not guard module hooks, so hooks
    added to an already compiled forward are silently skipped (tests/test_compiled.py)."""
    from valueprobe.steering.hook.handle import steer
    from valueprobe.steering.hook.spec import SteeringSpec

    plain = plain_generate(lm, prompts, args.tokens)
    spec = SteeringSpec(axis, layers=lm.n_layers // 2)
    eager, eager_tokens = best_of(plain, args.repeats, args.device), plain()
    with steer(lm, spec, 2.0):
        eager_steered, steered_tokens = best_of(plain, args.repeats, args.device), plain()
    forward = lm.model.forward
    static = lambda: plain(cache_implementation="static")  # noqa: E731
    try:
        torch._dynamo.reset()
        lm.model.forward = torch.compile(forward, dynamic=False)
        compiled, tokens = best_of(static, args.repeats, args.device), static()
        with steer(lm, spec, 2.0):
            torch._dynamo.reset()
            lm.model.forward = torch.compile(forward, dynamic=False)
            compiled_steered, tokens_steered = best_of(static, args.repeats, args.device), static()
    except Exception as exc:  # noqa: BLE001 -- the row says why it could not run
        return {"compiled": f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    finally:
        lm.model.forward = forward
        torch._dynamo.reset()
    return {
        "compiled_plain_ratio": compiled / eager, "compiled_steered_ratio": compiled_steered / eager_steered,
        "compiled_plain_tokens_equal": bool(torch.equal(tokens, eager_tokens)),
        "compiled_steered_tokens_equal": bool(torch.equal(tokens_steered, steered_tokens)),
    }  # fmt: skip


def peak_mb(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--shape", default="qwen3-8b", choices=list(SHAPES))
    p.add_argument(
        "--scale", type=float, default=1.0, help="multiply every row and token count (0.25: a quick check)"
    )
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16, help="capture's examples per forward")
    p.add_argument("--loop-rows", type=int, default=8, help="one-per-call sweep rows timed (then scaled)")
    p.add_argument("--skip", default="", help="comma-separated rows to leave out: capture,exact,generate,...")
    p.add_argument("--out", default=str(ROOT / "runs" / "bench-gpu.json"))
    p.add_argument(
        "--tokenizer",
        default="",
        help="a saved tokenizer folder (default: the default model's, from its cache)",
    )
    args = p.parse_args()
    from valueprobe.model.load import check_device, check_dtype

    check_device(args.device)  # one line before anything loads
    check_dtype(getattr(torch, args.dtype), args.device)
    s = args.scale
    args.examples, args.tokens = max(2, round(64 * s)), max(2, round(64 * s))
    args.sweep_prompts, args.sweep_tokens, args.guide_prompts = (
        max(1, round(24 * s)),
        max(2, round(48 * s)),
        max(1, round(16 * s)),
    )
    lm = build(args)
    prompts = chats(max(2, round(48 * s)))
    axis = random_axis(lm, prompts[:8])
    rows: dict[str, Callable[[], dict]] = {
        "capture": lambda: row_capture(lm, args),
        "exact": lambda: row_exactness(lm, axis, prompts[:8], args),
        "generate": lambda: row_generate(lm, axis, prompts, args),
        "sweep": lambda: row_sweep(lm, axis, args),
        "guide": lambda: row_guide(lm, axis, args),
        "serve": lambda: row_serve(lm, axis, args),
        "compiled": lambda: row_compiled(lm, axis, prompts[:8], args),
    }
    load_before = os.getloadavg()
    result: dict = {"shape": args.shape, "device": args.device, "dtype": args.dtype, "scale": s, "rows": {}}
    for name, run in rows.items():
        if name in args.skip.split(","):
            continue
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        got = run()
        got |= {"seconds": time.perf_counter() - start, "peak_gpu_mb": peak_mb(args.device)}
        result["rows"][name] = got
        _write(args.out, result)  # after every row: a run cut short keeps the rows it finished
        print(
            name,
            json.dumps(got, default=lambda x: round(x, 4) if isinstance(x, float) else str(x)),
            flush=True,
        )
    result["loadavg_before_after"] = [load_before, os.getloadavg()]
    _write(args.out, result)
    print_table(result)


def _write(out: str, result: dict) -> None:
    """The results so far, whole: written to a temporary name and renamed."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(path)


def print_table(result: dict) -> None:
    r = result["rows"]
    ex, gen, sw = r.get("exact", {}), r.get("generate", {}), r.get("sweep", {})
    lines = [
        ("vp.capture, last token, all layers ÷ bare forward", r.get("capture", {}).get("capture_last_all_layers_ratio"), "≤ 1.03"),
        ("vp.capture_to_store, span means to disk ÷ bare forward", r.get("capture", {}).get("capture_to_store_spans_ratio"), "≤ 1.10"),
        ("steering shift along v̂ (min, max) for wanted", ex and f"{ex['shift_min']:.3f}–{ex['shift_max']:.3f} for {ex['wanted_shift']:.3f}; orthogonal ≤ {ex['orthogonal_max']:.3f} at ‖h‖ ≈ {ex['mean_norm_h']:.1f}", "keep"),
        ("vp.generate α = 2 at layer 0 ÷ plain generate", gen.get("generate_alpha2_layer0_ratio"), "≤ 1.03"),
        ("vp.generate α = 0 ÷ plain generate", gen.get("generate_alpha0_ratio"), "≤ 1.03"),
        ("vp.steer around plain generate, middle layer ÷ plain", gen.get("steer_context_mid_layer_ratio"), "keep"),
        ("sweep batched vs one row per call", sw and f"{sw['sweep_speedup']:.1f}× (loop timed on {sw['loop_rows_timed']} of {sw['sweep_rows']} rows, scaled)", "≥ 100×"),
        ("vp.guide best-of-8 ÷ vp.generate of the 8 samples", r.get("guide", {}).get("guide_best_of_8_ratio"), "≤ 1.05"),
        *[(f"serve hf engine rows, {n} at once: tokens/s", r.get("serve", {}).get(f"serve_rows_{n}_tokens_per_s"), "") for n in (1, 16, 64)],
        ("static cache + torch.compile ÷ eager, plain", r.get("compiled", {}).get("compiled_plain_ratio", r.get("compiled", {}).get("compiled")), ""),
        ("static cache + torch.compile ÷ eager, steered (compiled ÷ eager steered)", r.get("compiled", {}).get("compiled_steered_ratio"), ""),
    ]  # fmt: skip
    print(
        f"\n{result['shape']} on {result['device']} in {result['dtype']} (scale {result['scale']}); random weights: speed and exactness only"
    )
    print("| path | measured | target | peak GPU MB |\n|---|---|---|---|")
    peaks = {"capture": 2, "exact": 1, "generate": 3, "sweep": 1, "guide": 1, "serve": 3, "compiled": 2}
    names = [n for n, k in peaks.items() for _ in range(k)]
    for (label, value, target), row in zip(lines, names, strict=True):
        shown = "—" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)
        peak = r.get(row, {}).get("peak_gpu_mb")
        print(f"| {label} | {shown} | {target} | {'n/a' if peak is None else f'{peak:.0f}'} |")
    print(f"load average before / after: {result['loadavg_before_after']} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
