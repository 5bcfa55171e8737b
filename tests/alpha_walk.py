"""α's walk: the valueprobe modules a steering strength crosses from where it is read to the hook.

    python tests/alpha_walk.py            # both walks on the default model (SmolLM2-135M), printed
    python tests/alpha_walk.py --tiny     # on a tiny random model (tests/test_alpha_walk.py runs this)

Two real runs, traced with ``sys.setprofile`` (``threading.setprofile`` too: serving generates in a
worker thread):

- ``valueprobe steer --alphas -1.2345,2.469 ...``, in-process, on two prompts;
- one request to ``valueprobe serve``'s app (the hf engine), ``"steering": {"alpha": 2.469}``.

The rule, applied to every Python call the runs make until an operator first applies α to h:

- a call *receives* α when one of its arguments other than ``self`` holds α's value as a number:
  the float itself, inside a tuple, list or dict, an element of a tensor (exact in float32), or a
  field of a dataclass record passed as an argument (one level: records are how values travel
  between modules). Objects with behaviour (a steering handle, a closure) are not opened: a route
  that attaches a handle, or the hook layer that calls a hook, is handed behaviour, not α.
  A dataclass's generated ``__init__`` counts for the module that defines the record;
- the walk starts in the module that first holds α (the caller of the first call that receives
  it: where the command line's text or the HTTP body is parsed), then lists the module of each
  call that receives α, in time order, one entry per stretch of consecutive calls in one module;
- writing a record to disk is where α is recorded, not a step toward the hook: the one JSON
  writer (``valueprobe/files.py``'s ``write_json``, which ``settings.json`` goes through) is left
  out, as ``json.dumps`` (not a valueprobe module) was before every JSON file went through it;
- it ends at the first call of an operator (`valueprobe.steering.hook.operators.Operator`) that
  receives α: the moment α changes h.

A module *entered twice* appears in the walk, then another module, then it again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = str(ROOT / "valueprobe") + "/"
ALPHAS = (-1.2345, 2.469)  # nonzero and unlike any other number the runs hold
OPERATOR = "valueprobe/steering/hook/operators.py"
SINKS = {"valueprobe/files.py"}  # where α is written down (see the module doc)


def _holds(value: Any, records: int = 1) -> bool:
    """Whether ``value`` holds one of `ALPHAS` as a number (see the module doc)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return any(abs(value - a) <= 1e-9 for a in ALPHAS)
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point() or value.numel() > 1_000_000 or value.device.type == "meta":
            return False
        flat = value.detach().reshape(-1).float().cpu()
        return any(bool((flat == torch.tensor(a, dtype=torch.float32)).any()) for a in ALPHAS)
    if isinstance(value, tuple | list | set | frozenset):
        return len(value) < 10_000 and any(_holds(v, records) for v in value)
    if isinstance(value, dict):
        return len(value) < 10_000 and any(_holds(v, records) for v in value.values())
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and records > 0:
        return any(_holds(getattr(value, f.name, None), records - 1) for f in dataclasses.fields(value))
    return False


def _module(frame: FrameType) -> str | None:
    """The package-relative file of a valueprobe frame (a record's ``__init__`` by its class), else None."""
    path = frame.f_code.co_filename
    if path.startswith(PACKAGE):
        return path[len(str(ROOT)) + 1 :]
    if path == "<string>" and frame.f_code.co_name == "__init__":
        self = frame.f_locals.get("self")
        module = type(self).__module__ if self is not None else ""
        if module.startswith("valueprobe."):
            return module.replace(".", "/") + ".py"
    return None


def _arguments(frame: FrameType) -> list[Any]:
    code = frame.f_code
    n = code.co_argcount + code.co_kwonlyargcount
    n += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)  # *args, **kwargs
    names = [name for name in code.co_varnames[:n] if name not in ("self", "cls")]
    return [frame.f_locals.get(name) for name in names]


def _caller(frame: FrameType) -> str | None:
    back = frame.f_back
    while back is not None and _module(back) is None:
        back = back.f_back
    return None if back is None else _module(back)


class Tracer:
    """Records the calls that receive α (see the module doc) until an operator applies it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []  # (module, function) in time order
        self.start: str | None = None
        self.done = False
        self.lock = threading.Lock()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or self.done:
            return
        module = _module(frame)
        if module is None or module in SINKS or not any(_holds(v) for v in _arguments(frame)):
            return
        with self.lock:
            if self.start is None:
                self.start = _caller(frame)
            self.calls.append((module, frame.f_code.co_qualname))
            self.done = module == OPERATOR

    def __enter__(self) -> Tracer:
        threading.setprofile(self)
        sys.setprofile(self)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]

    def walk(self) -> list[str]:
        """The modules in order, consecutive calls in one module as one entry."""
        out = [] if self.start is None else [self.start]
        for module, _ in self.calls:
            if not out or out[-1] != module:
                out.append(module)
        return out


def entered_twice(walk: list[str]) -> list[str]:
    return sorted({m for m in walk if walk.count(m) > 1})


def steer_walk(model: str, probe: str, prompts: Path, out: Path) -> Tracer:
    """``valueprobe steer --alphas -1.2345,2.469`` in-process, traced."""
    from valueprobe.cli.main import main

    argv = ["steer", "--model", model, "--probe", probe, "--prompts", str(prompts), "--out", str(out)]
    argv += ["--alphas", ",".join(map(str, ALPHAS)), "--max-new-tokens", "2", "--greedy"]
    argv += ["--random-directions", "1", "--limit", "2", "--bootstrap", "0"]
    with Tracer() as tracer:
        try:
            main(argv)
        except SystemExit as exc:
            if exc.code:
                raise
    return tracer


def serve_walk(lm: Any, probe: str) -> Tracer:
    """One steered request to ``valueprobe serve``'s app on the hf engine, traced from the HTTP body."""
    import httpx
    import uvicorn

    from valueprobe.serve.app import bind, build_app
    from valueprobe.serve.hf_engine import HFEngine
    from valueprobe.serve.limits import Limits
    from valueprobe.steering.hook.spec import SteeringSpec

    engine = HFEngine(lm, model="served", window_s=0.0)
    limits = Limits("served", SteeringSpec(probe=probe))
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(build_app(engine, limits), log_level="warning", lifespan="on"))
    with Tracer() as tracer:  # before the server starts: its threads inherit the profile
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        while not server.started:
            thread.join(0.02)
        body = {"model": "served", "prompt": "Is 91 prime?", "max_tokens": 2, "temperature": 0}
        body["steering"] = {"alpha": ALPHAS[1]}
        port = sock.getsockname()[1]
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", content=json.dumps(body), timeout=120)
        r.raise_for_status()
    server.should_exit = True
    thread.join(10)
    sock.close()
    return tracer


def tiny_model_and_probe(folder: Path) -> tuple[str, str]:
    """A tiny random llama saved as a model folder, and a random calibrated axis for it."""
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import build_model, build_tokenizer

    from valueprobe.model.load import wrap
    from valueprobe.probe.axis import ValueAxis

    tok = build_tokenizer()
    lm = wrap(build_model("llama", len(tok)), tok, model_id="tiny-llama")
    lm.model.save_pretrained(folder / "model")
    lm.tokenizer.save_pretrained(folder / "model")
    v = torch.randn(lm.n_layers, lm.d_model, generator=torch.Generator().manual_seed(0))
    n = lm.n_layers
    axis = ValueAxis(
        directions=v / v.norm(dim=1, keepdim=True), layers=tuple(range(n)), mu=torch.zeros(n),
        sigma=torch.full((n,), 2.0), mean_norm=torch.full((n,), 10.0), best_layer=1, site="resid_post",
        method="random", model_id=lm.model_id, fingerprint=lm.fingerprint, d_model=lm.d_model,
    )  # fmt: skip
    axis.save(folder / "probe")
    return str(folder / "model"), str(folder / "probe")


def report(name: str, tracer: Tracer) -> str:
    walk = tracer.walk()
    lines = [f"{name}: {len(walk)} modules, entered twice: {entered_twice(walk) or 'none'}"]
    lines.append("  " + " → ".join(walk))
    lines += [f"    {m} :: {f}" for m, f in tracer.calls]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="a tiny random model (seconds) instead of SmolLM2")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if args.tiny:
            model, probe = tiny_model_and_probe(Path(tmp))
        else:
            model, probe = "smollm2-135m", str(ROOT / "probes" / "smollm2-135m-value")
        from valueprobe.model.load import load

        steer = steer_walk(model, probe, ROOT / "data" / "steer_open.jsonl", Path(tmp) / "steer")
        served = serve_walk(load(model), probe)
    print(report("steer --alphas", steer))
    print(report("served request (hf engine)", served))
    return 0


if __name__ == "__main__":
    sys.exit(main())
