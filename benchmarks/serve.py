"""`valueprobe serve` under load: throughput and p50/p95 latency at 1, 4 and 16 concurrent clients,
steered ÷ unsteered, measured in one run.

    flock /tmp/vp-heavy.lock timeout 900 python benchmarks/serve.py            # hf engine; runs/bench-serve.json
    python benchmarks/serve.py --engines hf,vllm --vllm-python .venv-vllm/bin/python

Each engine is started as its own server (``python -m valueprobe serve --engine E``, SmolLM2-135M
and the shipped probe) and driven over HTTP by closed-loop clients (the official ``openai``
async client): each client sends its requests one after another. A level runs unsteered
(no ``steering`` field) and steered (α = ±2σ, alternating, at the probe's layer) with the same
prompts, greedy, exactly ``--new`` tokens (``ignore_eos``, so both do the same work); the two alternate for ``--repeats`` rounds and the
best round of each is kept (the machine is shared). Reported per (engine, clients, steered): requests,
generated tokens per second, requests per second, p50 / p95 request latency; and steered ÷
unsteered as the ratio of time per generated token (the target for the vLLM engine is <= 1.10).

The vLLM engine's rows: ``--engines hf,vllm`` starts ``valueprobe serve --engine vllm`` with
``--vllm-python`` (vLLM lives in its own environment, see the README); everything else is the same.
The machine is shared: the load average is printed and saved with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import openai

from valueprobe.files import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "probes" / "smollm2-135m-value"
TOPICS = ["the sea", "a lost key", "winter", "trains", "a red fox", "coffee", "the moon", "old books",
          "rain", "a city at night", "mountains", "a garden", "friendship", "a storm", "music", "bread"]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(engine: str, python: str, model: str) -> tuple[subprocess.Popen, str]:
    """``valueprobe serve --engine E`` in its own process; returns it and its base URL once it answers."""
    port = free_port()
    cmd = [python, "-m", "valueprobe", "serve", "--engine", engine, "--probe", str(PROBE), "--model", model,
           "--port", str(port)]  # fmt: skip
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/v1"
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"serve --engine {engine} exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            client.models.list()
            return proc, url
        except openai.APIConnectionError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"serve --engine {engine} did not answer in 600 s")


async def one_level(url: str, model: str, *, clients: int, per_client: int, steered: bool, new: int) -> dict:
    """``clients`` closed-loop clients, ``per_client`` requests each; latencies and token counts."""
    client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
    latencies: list[float] = []
    tokens = 0

    async def run(c: int) -> None:
        nonlocal tokens
        for r in range(per_client):
            i = c * per_client + r
            extra = {"ignore_eos": True} | (
                {"steering": {"alpha": 2.0 if i % 2 else -2.0}} if steered else {}
            )
            t0 = time.perf_counter()
            got = await client.chat.completions.create(
                model=model,
                messages=[
                    {"role": "user", "content": f"Write a few sentences about {TOPICS[i % len(TOPICS)]}."}
                ],
                max_tokens=new,
                temperature=0,
                extra_body=extra,
            )
            latencies.append(time.perf_counter() - t0)
            tokens += len(got.choices[0].model_extra["token_ids"])

    t0 = time.perf_counter()
    await asyncio.gather(*(run(c) for c in range(clients)))
    wall = time.perf_counter() - t0
    await client.close()
    q = statistics.quantiles(latencies, n=20, method="inclusive") if len(latencies) > 1 else latencies * 19
    return {
        "clients": clients,
        "steered": steered,
        "requests": len(latencies),
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "requests_per_s": len(latencies) / wall,
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * q[18],
    }


def bench_engine(engine: str, python: str, args: argparse.Namespace) -> list[dict]:
    proc, url = start(engine, python, args.model)
    rows = []
    try:
        asyncio.run(one_level(url, args.model, clients=1, per_client=1, steered=True, new=4))  # warm-up
        for clients in args.clients:
            per_client = max(1, args.requests // clients)
            best: dict[bool, dict] = {}
            for _ in range(args.repeats):  # interleaved, best of repeats: the machine is shared
                for steered in (False, True):
                    row = asyncio.run(
                        one_level(
                            url,
                            args.model,
                            clients=clients,
                            per_client=per_client,
                            steered=steered,
                            new=args.new,
                        )
                    )
                    if steered not in best or row["tokens_per_s"] > best[steered]["tokens_per_s"]:
                        best[steered] = row
            for steered in (False, True):
                row = best[steered]
                rows.append({"engine": engine, **row})
                print(
                    f"{engine:5} clients {clients:2} {'steered  ' if steered else 'unsteered'} "
                    f"{row['requests']:3} req  {row['tokens_per_s']:7.1f} tok/s  {row['requests_per_s']:5.2f} req/s  "
                    f"p50 {row['p50_ms']:7.0f} ms  p95 {row['p95_ms']:7.0f} ms",
                    flush=True,
                )
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return rows


def ratios(rows: list[dict]) -> list[dict]:
    """Steered ÷ unsteered time per generated token, per (engine, clients)."""
    plain = {(r["engine"], r["clients"]): r["tokens_per_s"] for r in rows if not r["steered"]}
    return [
        {
            "engine": r["engine"],
            "clients": r["clients"],
            "steered_over_unsteered": plain[r["engine"], r["clients"]] / r["tokens_per_s"],
        }
        for r in rows
        if r["steered"]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="hf", help="comma-separated: hf, vllm")
    parser.add_argument("--vllm-python", default=sys.executable, help="the python of vLLM's environment")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--clients", default="1,4,16", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument(
        "--requests", type=int, default=16, help="requests per level (split over the clients)"
    )
    parser.add_argument(
        "--repeats", type=int, default=2, help="interleaved rounds per level; the best is kept"
    )
    parser.add_argument("--new", type=int, default=32, help="new tokens per request at most")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-serve.json")
    args = parser.parse_args()
    pythons = {"hf": sys.executable, "vllm": args.vllm_python}
    rows = [r for engine in args.engines.split(",") for r in bench_engine(engine, pythons[engine], args)]
    load = os.getloadavg()
    result = {
        "rows": rows,
        "ratios": ratios(rows),
        "loadavg": load,
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    for r in result["ratios"]:
        print(
            f"{r['engine']:5} clients {r['clients']:2}  steered ÷ unsteered (time per token) {r['steered_over_unsteered']:.3f}"
        )
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1, 5, 15 min)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
