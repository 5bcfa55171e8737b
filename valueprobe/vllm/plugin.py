"""valueprobe's vLLM general plugin: per-request steering and per-token value inside the workers.

    pip install 'valueprobe[vllm]'        # registers the entry point vllm.general_plugins: valueprobe
    llm = LLM(model=path, enable_prefix_caching=True)
    llm.generate(prompts, [SamplingParams(extra_args=VllmArgs(spec, alpha=a, key=k).extra_args()) for a, k in rows])
    values = take_values(llm, keys)       # per-token σ-scores, see `valueprobe.vllm.generate`

vLLM loads general plugins in every process; `register` only patches what each process needs:
- the model runner's ``load_model`` (workers) installs, on the freshly loaded model, one forward
  pre-hook on the whole model and one forward hook on each decoder block (found by
  `valueprobe.model.load.find_layers_path`, the table of decoder-block paths every route uses;
  registered through `valueprobe.hooks.patch.hook_module`, like every hook). The pre-hook lays out
  this step's work from the batch: the request in each row (``input_batch.req_ids``), each
  request's token range in the flattened batch (``query_start_loc`` of the forward context's
  attention metadata), each token's position (the model's ``positions`` argument, so chunked
  prefill and prefix-cache hits need nothing special), and each request's steering
  (``sampling_params.extra_args``: `valueprobe.vllm.request.VllmArgs`, a steering spec and α). The
  block hook calls one custom op, ``valueprobe::block``, which reads the values asked for before
  the addition, adds α·v̂ to the rows of the steered positions, at every block the spec steers,
  then reads the values asked for after it (`VllmArgs.value_at`). An op
  (not Python in the hook) keeps this right under vLLM's torch.compile: Dynamo traces the hook
  once and every later step calls the op. A step without steering or readout touches nothing.
- ``Request.from_engine_core_request`` (engine core) folds a steering's `VllmArgs.salt` into the
  request's ``cache_salt``, so the prefix cache never serves steered KV to another strength.
- the compile cache: the plugin adds itself to the config's ``additional_config`` (part of vLLM's
  compile-cache key), so a graph compiled without the op is never loaded with the plugin on.
- the workers gain two methods that `LLM.collective_rpc` calls by name (no insecure
  serialization): ``valueprobe_take_values`` collects per-token values, and ``valueprobe_status``
  says that the plugin is loaded and how many blocks it hooked, so an engine started where the
  plugin did not load (``VLLM_PLUGINS`` without it, another environment's install) is refused at
  start instead of failing its first request.

Why per-token values come back through ``collective_rpc``: vLLM's outputs carry no per-request
extra field from worker to client (``EngineCoreOutput`` has fixed fields; logprobs have a
meaning of their own), so the worker keeps each request's values under the request's ``key``,
indexed by generated-token position (a recomputed position after preemption overwrites, never
duplicates), and hands them over when asked: one RPC per batch of finished requests offline,
one per streamed delta in the server. It works with every executor vLLM has (in-process,
multiprocess, Ray), since it is vLLM's own RPC.

A worker never raises on a request: a steering that does not resolve (checked already where the
request was taken, `VllmArgs.parse`) is logged once and runs unsteered with NaN values.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor, nn

from valueprobe.errors import ValueprobeError
from valueprobe.hooks.patch import Handle, hook_module
from valueprobe.model.load import find_layers_path
from valueprobe.vllm.request import EXTRA_KEY, Resolved, VllmArgs, resolve

__all__ = ["block_op", "install", "register", "take"]

log = logging.getLogger("valueprobe.vllm")

_MARK = "__valueprobe__"  # set on what the plugin wrapped, so registering twice wraps nothing twice
_GRAPH_ID = "block-op-1"  # in vLLM's compile-cache key: graphs with the op never mix with graphs without
_MAX_KEPT = 65536  # requests whose values wait to be taken; the oldest go first
_LOCK = threading.Lock()
_VALUES: OrderedDict[str, dict[int, float]] = OrderedDict()
# Reads made inside the forward, still on the device: where each value goes, and the values. They
# come to the host when taken (outside the step), or every _SETTLE_EVERY reads if nobody takes.
_PENDING: list[tuple[tuple[tuple[str, int], ...], Tensor]] = []
_SETTLE_EVERY = 1024


@dataclass
class _Reads:
    """Rows of one block whose value is read, at one moment (before or after the additions)."""

    rows: list[int] = field(default_factory=list)
    v: list[Tensor] = field(default_factory=list)
    mu: list[float] = field(default_factory=list)
    sigma: list[float] = field(default_factory=list)
    to: list[tuple[str, int]] = field(default_factory=list)  # (key, generated-token index)


@dataclass
class _BlockWork:
    """One block's share of one step: rows to read before the additions and after them (and
    where the values go), rows to add to."""

    before: _Reads = field(default_factory=_Reads)
    after: _Reads = field(default_factory=_Reads)
    add_rows: list[Tensor] = field(default_factory=list)
    add_delta: list[Tensor] = field(default_factory=list)


class _Step:
    """The work of the step running now, by block (set by the pre-hook, read by the op)."""

    work: dict[int, _BlockWork] = {}


def _spec(extra: Any, req_id: str, cache: dict[str, tuple[VllmArgs, Resolved] | None], n_layers: int) -> Any:
    if req_id in cache:
        return cache[req_id]
    got = None
    raw = extra.get(EXTRA_KEY) if isinstance(extra, dict) else None
    if raw is not None:
        try:
            args = VllmArgs.parse(raw)
            got = (args, resolve(args, n_layers))
        except Exception as e:  # a worker must never take the engine down for one request
            log.error("valueprobe: request %s runs unsteered: %s", req_id, e)
    if len(cache) > 4 * _MAX_KEPT // 16:
        cache.clear()
    cache[req_id] = got
    return got


def _plan(runner: Any, positions: Tensor, cache: dict, n_layers: int) -> dict[int, _BlockWork]:
    """This step's work by block, from the batch the runner laid out (see the module doc)."""
    from vllm.forward_context import get_forward_context, is_forward_context_available  # optional dep

    if not is_forward_context_available():
        return {}
    metadata = get_forward_context().attn_metadata
    if not isinstance(metadata, dict) or not metadata:
        return {}  # profiling and dummy runs, or micro-batching (not steered)
    starts = next(iter(metadata.values())).query_start_loc.tolist()
    batch = runner.input_batch
    work: dict[int, _BlockWork] = {}
    for i, req_id in enumerate(batch.req_ids[: batch.num_reqs]):
        state = runner.requests.get(req_id)
        params = getattr(state, "sampling_params", None)
        extra = getattr(params, "extra_args", None)
        got = _spec(extra, req_id, cache, n_layers) if params is not None else None
        if got is not None:
            _request_work(work, got, state, positions[starts[i] : starts[i + 1]].cpu(), starts[i])
    return work


def _request_work(
    work: dict[int, _BlockWork], got: tuple[VllmArgs, Resolved], state: Any, pos: Tensor, lo: int
) -> None:
    """One request's reads and additions in this step: ``pos`` are its tokens' positions, from row ``lo``."""
    args, res = got
    rows = torch.arange(lo, lo + len(pos))
    first_out = state.num_prompt_tokens - 1  # the position whose forward makes generated token 0
    if args.key is not None:
        keep = pos >= first_out
        w = work.setdefault(res.read_block, _BlockWork())
        reads = w.after if args.value_at == "after" else w.before
        for r, p in zip(rows[keep].tolist(), pos[keep].tolist(), strict=True):
            reads.rows.append(r)
            reads.v.append(res.read_v)
            reads.mu.append(res.mu)
            reads.sigma.append(res.sigma)
            reads.to.append((args.key, p - first_out))
    if args.steers:
        n_prompt = state.num_prompt_tokens
        where = args.spec.positions
        mask = {"all": pos >= 0, "prompt": pos < n_prompt, "generated": pos >= n_prompt}[where]
        if bool(mask.any()):
            for block, delta in res.adds:
                w = work.setdefault(block, _BlockWork())
                w.add_rows.append(rows[mask])
                w.add_delta.append(delta)


def block_op(residual: Tensor, hidden: Tensor, block: int) -> None:
    """Read the rows that read before the additions, steer the residual stream (``hidden +
    residual``) at ``block``'s output in place in ``residual``, then read the rows that read
    after; nothing at all when this step has no work there."""
    w = _Step.work.get(block)
    if w is None:
        return
    _read(w.before, residual, hidden)
    for rows_t, delta in zip(w.add_rows, w.add_delta, strict=True):
        idx = rows_t.to(residual.device)
        residual.index_add_(0, idx, delta.to(residual).expand(len(idx), -1))
    _read(w.after, residual, hidden)


def _read(reads: _Reads, residual: Tensor, hidden: Tensor) -> None:
    if not reads.rows:
        return
    rows = torch.tensor(reads.rows, device=residual.device)
    h = (hidden[rows] + residual[rows]).float()  # the residual stream, as the HF block returns it
    proj = (h * torch.stack(reads.v).to(h.device)).sum(-1)
    mu = torch.tensor(reads.mu, device=h.device)
    sigma = torch.tensor(reads.sigma, device=h.device)
    _keep(reads.to, (proj - mu) / sigma)


def _keep(dest: Sequence[tuple[str, int]], values: Tensor) -> None:
    """Hold one read's σ-scores on the device (no host read inside the step)."""
    with _LOCK:
        _PENDING.append((tuple(dest), values.detach()))
        if len(_PENDING) >= _SETTLE_EVERY:
            _settle()


def _settle() -> None:
    """Copy the pending reads to the host in one copy and file them by key (caller holds _LOCK)."""
    if not _PENDING:
        return
    device = _PENDING[0][1].device
    flat = torch.cat([v.to(device) for _, v in _PENDING]).tolist()
    dest = [d for ds, _ in _PENDING for d in ds]
    _PENDING.clear()
    for (key, t), v in zip(dest, flat, strict=True):
        kept = _VALUES.get(key)
        if kept is None:
            kept = _VALUES[key] = {}
            while len(_VALUES) > _MAX_KEPT:
                _VALUES.popitem(last=False)
        kept[t] = v


def take(keys: Sequence[str]) -> dict[str, tuple[int, list[float]]]:
    """Hand over (and forget) the values kept under ``keys``: per key, the first generated-token
    index held and the values from there on, in order (NaN where a position was never read).
    A stream takes as it goes; values that arrive later are kept again under the same key."""
    out: dict[str, tuple[int, list[float]]] = {}
    with _LOCK:
        _settle()
        for key in keys:
            kept = _VALUES.pop(key, None)
            if kept:
                first = min(kept)
                out[key] = (first, [kept.get(t, math.nan) for t in range(first, max(kept) + 1)])
    return out


def _define_op() -> Any:
    """``torch.ops.valueprobe.block``: opaque to torch.compile, so it runs at every step."""
    if hasattr(torch.ops, "valueprobe") and hasattr(torch.ops.valueprobe, "block"):
        return torch.ops.valueprobe.block

    @torch.library.custom_op("valueprobe::block", mutates_args=("residual",))
    def _op(residual: Tensor, hidden: Tensor, block: int) -> None:
        block_op(residual, hidden, block)

    @_op.register_fake
    def _(residual: Tensor, hidden: Tensor, block: int) -> None:
        return None

    return torch.ops.valueprobe.block


def _blocks(model: nn.Module) -> nn.ModuleList | None:
    """vLLM's decoder blocks, by the table of block paths every route uses (model.load)."""
    try:
        path = find_layers_path(model)
    except ValueprobeError:
        return None
    return cast(nn.ModuleList, model.get_submodule(path))


def install(runner: Any) -> Handle:
    """Hook the runner's model: the step planner and one op call per decoder block."""
    model = runner.model
    blocks = _blocks(model)
    if blocks is None:
        log.warning("valueprobe: no decoder blocks found in %s; steering is off", type(model).__name__)
        return Handle()
    op = _define_op()
    cache: dict[str, Any] = {}
    n_layers = len(blocks)

    def plan(module: nn.Module, args: tuple, kwargs: dict) -> None:
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        _Step.work = {} if positions is None else _plan(runner, positions, cache, n_layers)

    def hook_for(index: int):
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], Tensor):
                op(output[1], output[0], index)  # vLLM blocks return (hidden, residual); h = their sum

        return hook

    handle = hook_module(model, plan, pre=True, with_kwargs=True)
    for i, block in enumerate(blocks):
        if type(block).__name__ != "PPMissingLayer":
            hook_module(block, hook_for(i), into=handle)
    return handle


def _take_values(worker: Any, keys: list[str]) -> dict[str, tuple[int, list[float]]]:
    return take(keys)


def _status(worker: Any) -> dict[str, Any]:
    """What `valueprobe.vllm.generate.check_plugin` reads: the op's graph id and the hooks."""
    runner = getattr(worker, "model_runner", None)
    hooks = getattr(runner, "_valueprobe_hooks", None)
    return {"graph": _GRAPH_ID, "hooks": 0 if hooks is None else hooks.n_hooks}


_WORKER_METHODS = {"valueprobe_take_values": _take_values, "valueprobe_status": _status}


def _salted(original: Any) -> Any:
    def from_engine_core_request(cls: Any, request: Any, block_hasher: Any) -> Any:
        params = getattr(request, "sampling_params", None)
        extra = getattr(params, "extra_args", None)
        if isinstance(extra, dict) and EXTRA_KEY in extra:
            try:
                salt = VllmArgs.parse(extra[EXTRA_KEY]).salt()
            except Exception:
                salt = "valueprobe:unresolved"  # runs unsteered, but never shares either way
            if salt is not None:
                request.cache_salt = salt if not request.cache_salt else f"{request.cache_salt}|{salt}"
        return original.__func__(cls, request, block_hasher)

    setattr(from_engine_core_request, _MARK, True)
    return classmethod(from_engine_core_request)


def _wrap_load(cls: Any) -> None:
    original = cls.__dict__.get("load_model")
    if original is None or getattr(original, _MARK, False):
        return

    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        # vLLM keys its compile cache by the config, not by module hooks: without this, a graph
        # compiled without the plugin (cached on disk) would load and never call the op.
        extra = getattr(getattr(self, "vllm_config", None), "additional_config", None)
        if isinstance(extra, dict):
            extra[EXTRA_KEY] = _GRAPH_ID
        out = original(self, *args, **kwargs)
        self._valueprobe_hooks = install(self)
        return out

    setattr(load_model, _MARK, True)
    cls.load_model = load_model


def register() -> None:
    """The ``vllm.general_plugins`` entry point; safe to call more than once per process."""
    from vllm.v1.request import Request  # optional dependency: only vLLM's processes call this
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.worker_base import WorkerBase

    current = Request.__dict__["from_engine_core_request"]
    if not getattr(current.__func__, _MARK, False):
        Request.from_engine_core_request = _salted(current)
    _wrap_load(GPUModelRunner)
    try:
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner  # optional: CPU builds
    except ImportError:
        pass
    else:
        _wrap_load(CPUModelRunner)
    for name, method in _WORKER_METHODS.items():  # the names collective_rpc calls
        if not hasattr(WorkerBase, name):
            setattr(WorkerBase, name, method)
