"""`valueprobe serve` under load: 1, 16, 64 and 128 concurrent clients on loopback, steered and not,
checked for lost and wrong responses; then an overload leg against a bounded queue. One run.

    python benchmarks/serve.py                                     # hf engine, SmolLM2-135M; runs/bench-serve.json
    python benchmarks/serve.py --clients 1,4 --new 4 --overload-queue 2 --overload-burst 8   # a quick look
    python benchmarks/serve.py --engines hf,vllm --vllm-python .venv-vllm/bin/python

Each engine is started as its own server (``python -m valueprobe serve --engine E``, ``--model``,
default SmolLM2-135M-Instruct, with the shipped probe) and driven over HTTP by closed-loop clients
(``httpx``, streamed chat completions, the SSE read by hand): each client sends ``--per-client``
requests one after another. A level runs unsteered (no ``steering`` field) and steered (α = ±2σ
at the probe's layer) with the same prompts, greedy, exactly ``--new`` tokens (``ignore_eos``, so
both do the same work), unsteered and steered interleaved for ``--repeats`` rounds, the fastest of
each kept. Reported per (engine, clients, steered): generated tokens per second,
p50 / p95 / p99 time to first token and total latency; steered ÷ unsteered as the ratio of time
per generated token.

Correctness: before the load, every distinct request (prompt and α) is sent alone, not streamed;
under load each response's token ids must equal its request's alone. ``lost`` counts responses
that did not come back whole (not a 200, or a stream without ``[DONE]``), ``wrong`` those whose
tokens differ. The script exits 1 if any level lost or got wrong a response.

Overload: a second server with ``--max-queue Q`` takes a burst of ``--overload-burst`` requests at
once; it reports 200s and 429s (each 429 must carry ``Retry-After``; any other status is an
error), and that the server still serves a request afterwards with nothing left in flight.

Slider (the workbench, ``--slider-moves N``): one client does what the page at ``/`` does on an α
slider move. It streams the steered and the random-direction columns of one chat (temperature 0.7,
a seed, ``--slider-new`` tokens); after ``--slider-after`` tokens of the steered stream it moves
the slider: both streams are dropped (the connections closed, which cancels their rows) and the two
columns are asked again at the next α. Reported: the time from that move to the first token of the
new steered stream, median and max over the moves (the goal: within 1 s on the default model, CPU,
one client), on a server of its own. ``--slider-only`` runs this leg alone:

    python benchmarks/serve.py --slider-only                       # the workbench's figure
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
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from valueprobe.files import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "probes" / "smollm2-135m-value"
TOPICS = ["the sea", "a lost key", "winter", "trains", "a red fox", "coffee", "the moon", "old books",
          "rain", "a city at night", "mountains", "a garden", "friendship", "a storm", "music", "bread"]  # fmt: skip
ALPHA = 2.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(engine: str, python: str, model: str, *flags: str) -> tuple[subprocess.Popen, str]:
    """``valueprobe serve --engine E`` in its own process; returns it and its base URL once it answers."""
    port = free_port()
    cmd = [python, "-m", "valueprobe", "serve", "--engine", engine, "--probe", str(PROBE), "--model", model,
           "--port", str(port), *flags]  # fmt: skip
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    # its log (a line per request) to a file: a pipe nobody reads fills up and stalls the server
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - lives as long as the server, closed with the process
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise SystemExit(f"serve --engine {engine} exited: {log.read()[-4000:]}")
        try:
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"serve --engine {engine} did not answer in 600 s")


def request_body(model: str, i: int, *, steered: bool, new: int) -> dict:
    """Request ``i`` of a level: a topic, and α = ±2σ alternating per round of topics when steered."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Write a few sentences about {TOPICS[i % len(TOPICS)]}."}],
        "max_tokens": new,
        "temperature": 0,
        "ignore_eos": True,
    }
    if steered:
        body["steering"] = {"alpha": ALPHA if (i // len(TOPICS)) % 2 else -ALPHA}
    return body


def key(body: dict) -> str:
    """What makes two requests the same run: the body less the stream flag."""
    return json.dumps({k: v for k, v in body.items() if k != "stream"}, sort_keys=True)


@dataclass
class Answer:
    """One streamed response as the client saw it."""

    status: int
    token_ids: list[int] = field(default_factory=list)
    ttft: float = float("nan")
    total: float = float("nan")
    done: bool = False


async def stream_one(client: httpx.AsyncClient, url: str, body: dict) -> Answer:
    """POST one streamed chat completion; time its first token and its end, gather its token ids."""
    t0 = time.perf_counter()
    async with client.stream("POST", f"{url}/chat/completions", json=body | {"stream": True}) as r:
        answer = Answer(r.status_code)
        if r.status_code != 200:
            await r.aread()
            return answer
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                answer.done = True
                break
            event = json.loads(line[len("data: ") :])
            if "error" in event:
                break
            for choice in event["choices"]:
                if answer.token_ids == [] and choice["token_ids"]:
                    answer.ttft = time.perf_counter() - t0
                answer.token_ids += choice["token_ids"]
    answer.total = time.perf_counter() - t0
    return answer


def references(url: str, bodies: list[dict]) -> dict[str, list[int]]:
    """Each distinct request sent alone (not streamed, one at a time): its greedy token ids."""
    out: dict[str, list[int]] = {}
    with httpx.Client(timeout=600) as client:
        for body in bodies:
            if key(body) not in out:
                r = client.post(f"{url}/chat/completions", json=body)
                r.raise_for_status()
                out[key(body)] = r.json()["choices"][0]["token_ids"]
    return out


def _pct(xs: list[float], p: int) -> float:
    xs = [x for x in xs if x == x]  # NaN: no token came
    if len(xs) < 2:
        return 1000 * xs[0] if xs else float("nan")
    return 1000 * statistics.quantiles(xs, n=100, method="inclusive")[p - 1]


async def one_level(url: str, bodies: list[list[dict]], refs: dict[str, list[int]]) -> dict:
    """One closed-loop client per list of ``bodies``; throughput, latency percentiles, lost, wrong."""
    limits = httpx.Limits(max_connections=len(bodies) + 8, max_keepalive_connections=len(bodies) + 8)
    answers: list[tuple[dict, Answer]] = []
    async with httpx.AsyncClient(timeout=1800, limits=limits) as client:

        async def run(mine: list[dict]) -> None:
            for body in mine:
                answers.append((body, await stream_one(client, url, body)))

        t0 = time.perf_counter()
        await asyncio.gather(*(run(mine) for mine in bodies))
        wall = time.perf_counter() - t0
    lost = sum(not (a.status == 200 and a.done) for _, a in answers)
    wrong = sum(a.status == 200 and a.done and a.token_ids != refs[key(b)] for b, a in answers)
    tokens = sum(len(a.token_ids) for _, a in answers)
    ttft, total = [a.ttft for _, a in answers], [a.total for _, a in answers]
    return {
        "clients": len(bodies),
        "requests": len(answers),
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        **{f"ttft_p{p}_ms": _pct(ttft, p) for p in (50, 95, 99)},
        **{f"latency_p{p}_ms": _pct(total, p) for p in (50, 95, 99)},
        "lost": lost,
        "wrong": wrong,
    }


def _line(engine: str, steered: bool, row: dict) -> str:
    return (
        f"{engine:5} clients {row['clients']:3} {'steered  ' if steered else 'unsteered'} {row['requests']:4} req"
        f"  {row['tokens_per_s']:7.1f} tok/s  TTFT p50/p95/p99 {row['ttft_p50_ms']:6.0f} {row['ttft_p95_ms']:6.0f}"
        f" {row['ttft_p99_ms']:6.0f} ms  latency p50/p95/p99 {row['latency_p50_ms']:6.0f}"
        f" {row['latency_p95_ms']:6.0f} {row['latency_p99_ms']:6.0f} ms"
        f"  lost {row['lost']} wrong {row['wrong']} of {row['requests_checked']}"
    )


def _fastest(kept: dict | None, new: dict) -> dict:
    """The faster of two rounds of a level, with both rounds' lost and wrong counted."""
    if kept is None:
        return new | {"requests_checked": new["requests"]}
    faster = new if new["tokens_per_s"] > kept["tokens_per_s"] else kept
    return faster | {
        "lost": kept["lost"] + new["lost"],
        "wrong": kept["wrong"] + new["wrong"],
        "requests_checked": kept["requests_checked"] + new["requests"],
    }


def load_levels(engine: str, url: str, args: argparse.Namespace) -> list[dict]:
    """Every level, unsteered then steered; the references first (each distinct request alone)."""
    most = max(args.clients) * args.per_client
    plan = {
        s: [request_body(args.model, i, steered=s, new=args.new) for i in range(most)] for s in (False, True)
    }
    refs = references(url, plan[False] + plan[True])
    rows = []
    for clients in args.clients:
        best: dict[bool, dict] = {}
        for _ in range(args.repeats):  # interleaved, the fastest round kept: the machine is shared
            for steered in (False, True):
                bodies = [
                    plan[steered][c * args.per_client : (c + 1) * args.per_client] for c in range(clients)
                ]
                row = {"engine": engine, "steered": steered, **asyncio.run(one_level(url, bodies, refs))}
                best[steered] = _fastest(best.get(steered), row)
        for steered in (False, True):
            rows.append(best[steered])
            print(_line(engine, steered, best[steered]), flush=True)
    return rows


async def burst(url: str, model: str, n: int, new: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n + 4)
    async with httpx.AsyncClient(timeout=1800, limits=limits) as client:
        body = request_body(model, 0, steered=True, new=new)
        return await asyncio.gather(*(client.post(f"{url}/chat/completions", json=body) for _ in range(n)))


def overload(engine: str, python: str, args: argparse.Namespace) -> dict:
    """A burst past ``--max-queue``: 200s against 429s, then one more request once it is over."""
    proc, base = start(engine, python, args.model, "--max-queue", str(args.overload_queue))
    try:
        got = asyncio.run(burst(f"{base}/v1", args.model, args.overload_burst, args.new))
        statuses = [r.status_code for r in got]
        after = httpx.post(
            f"{base}/v1/chat/completions", json=request_body(args.model, 1, steered=False, new=2), timeout=600
        )
        health = httpx.get(f"{base}/health", timeout=60).json()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    row = {
        "engine": engine,
        "max_queue": args.overload_queue,
        "burst": args.overload_burst,
        "ok": statuses.count(200),
        "refused_429": statuses.count(429),
        "retry_after_on_every_429": all("Retry-After" in r.headers for r in got if r.status_code == 429),
        "other": len(statuses) - statuses.count(200) - statuses.count(429),
        "serving_after": after.status_code == 200 and health == {"status": "ok", "in_flight": 0},
    }
    print(
        f"{engine:5} overload: queue {row['max_queue']}, burst {row['burst']}: {row['ok']} ok, {row['refused_429']} x 429"
        f" (Retry-After on each: {row['retry_after_on_every_429']}), {row['other']} other;"
        f" serving after: {row['serving_after']}",
        flush=True,
    )
    return row


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


SLIDER_ALPHAS = (1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 1.5, -1.5)
NULL_SEED = 12345  # the session's random direction (the page draws one per session)


def slider_body(model: str, alpha: float, *, random: bool, new: int) -> dict:
    steering: dict = {"alpha": alpha} | ({"random": NULL_SEED} if random else {})
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Is 91 a prime number? Explain briefly."}],
        "max_tokens": new,
        "temperature": 0.7,
        "seed": 7,
        "ignore_eos": True,
        "stream": True,
        "steering": steering,
    }


async def _first_tokens(
    client: httpx.AsyncClient, url: str, body: dict, want: int, first: asyncio.Future
) -> None:
    """Stream ``body``; set ``first`` at its first token; return after ``want`` tokens (dropping the stream)."""
    seen = 0
    async with client.stream("POST", f"{url}/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            seen += sum(len(c["token_ids"]) for c in json.loads(line[6:])["choices"])
            if seen and not first.done():
                first.set_result(time.perf_counter())
            if seen >= want:
                return  # leaving the block closes the connection: the server cancels the row


async def slider_moves(url: str, model: str, args: argparse.Namespace) -> list[float]:
    """Seconds from each slider move to the new steered stream's first token."""
    out = []
    async with httpx.AsyncClient(timeout=600) as client:
        for i in range(args.slider_moves + 1):
            alpha = SLIDER_ALPHAS[i % len(SLIDER_ALPHAS)]
            loop = asyncio.get_running_loop()
            first, other = loop.create_future(), loop.create_future()
            moved = time.perf_counter()
            steered = asyncio.create_task(
                _first_tokens(
                    client,
                    url,
                    slider_body(model, alpha, random=False, new=args.slider_new),
                    args.slider_after,
                    first,
                )
            )
            random = asyncio.create_task(
                _first_tokens(
                    client, url, slider_body(model, alpha, random=True, new=args.slider_new), 1, other
                )
            )
            await steered  # the user watches a few tokens arrive, then moves the slider again
            random.cancel()
            if i:  # the first request warms the server; every later one follows a move
                out.append(first.result() - moved)
    return out


def slider(engine: str, python: str, args: argparse.Namespace) -> dict:
    proc, base = start(engine, python, args.model)
    try:
        model = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
        got = asyncio.run(slider_moves(f"{base}/v1", model, args))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    row = {
        "engine": engine,
        "moves": len(got),
        "first_token_median_s": statistics.median(got),
        "first_token_max_s": max(got),
        "first_token_s": got,
    }
    print(
        f"{engine:5} slider move -> first steered token: median {row['first_token_median_s']:.3f} s,"
        f" max {row['first_token_max_s']:.3f} s over {row['moves']} moves (1 client, {args.slider_new} new tokens asked,"
        f" moved after {args.slider_after})"
    )
    return row


def bench_engine(engine: str, python: str, args: argparse.Namespace) -> tuple[list[dict], dict | None]:
    proc, base = start(engine, python, args.model)
    try:
        rows = load_levels(engine, f"{base}/v1", args)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return rows, overload(engine, python, args) if args.overload_burst else None


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    parser.add_argument("--engines", default="hf", help="comma-separated: hf, vllm")
    parser.add_argument("--vllm-python", default=sys.executable, help="the python of vLLM's environment")
    parser.add_argument("--model", default="smollm2-135m", help="a model alias or folder the probe fits")
    parser.add_argument("--clients", default="1,16,64,128", type=ints, help="concurrent clients per level")
    parser.add_argument("--per-client", type=int, default=1, help="requests each client sends in turn")
    parser.add_argument("--new", type=int, default=16, help="new tokens per request (exactly: ignore_eos)")
    parser.add_argument(
        "--repeats", type=int, default=1, help="interleaved rounds per level; the fastest kept"
    )
    parser.add_argument("--overload-queue", type=int, default=8, help="the overload server's --max-queue")
    parser.add_argument("--overload-burst", type=int, default=64, help="requests sent at once (0: no leg)")
    parser.add_argument(
        "--slider-moves", type=int, default=8, help="workbench slider moves timed (0: no leg)"
    )
    parser.add_argument("--slider-new", type=int, default=48, help="tokens each slider request asks for")
    parser.add_argument("--slider-after", type=int, default=4, help="steered tokens seen before each move")
    parser.add_argument("--slider-only", action="store_true", help="run the slider leg alone")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-serve.json")
    return parser.parse_args()


def main() -> None:
    args = parse()
    pythons = {"hf": sys.executable, "vllm": args.vllm_python}
    rows, legs, sliders = [], [], []
    for engine in args.engines.split(","):
        if not args.slider_only:
            got, leg = bench_engine(engine, pythons[engine], args)
            rows += got
            legs += [leg] if leg else []
        if args.slider_moves:
            sliders.append(slider(engine, pythons[engine], args))
    load = os.getloadavg()
    result = {"rows": rows, "ratios": ratios(rows), "overload": legs, "slider": sliders, "loadavg": load}
    result["args"] = {k: str(v) for k, v in vars(args).items()}
    for r in result["ratios"]:
        print(
            f"{r['engine']:5} clients {r['clients']:3}  steered ÷ unsteered (time per token) {r['steered_over_unsteered']:.3f}"
        )
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1, 5, 15 min)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    bad = sum(r["lost"] + r["wrong"] for r in rows) + sum(
        leg["other"] + (not leg["serving_after"]) + (not leg["retry_after_on_every_429"]) for leg in legs
    )
    if bad:
        print(f"error: {bad} lost, wrong or failed responses: see {args.out}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
