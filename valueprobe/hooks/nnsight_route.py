"""Capture and steering through nnsight 0.8, the route to NDIF remote execution.

Local runs wrap a twin of the loaded model (sharing its weights) in
``nnsight.modeling.transformers.TransformersModel``; ``remote=True`` instead builds an
un-dispatched (meta) ``TransformersModel(lm.model_id)`` and ships the trace to NDIF, which
runs it on its own copy of that checkpoint. Configure the NDIF key first
(``NDIF_API_KEY=...`` or ``nnsight.CONFIG.set_default_api_key``); ``remote="local"``
serializes the trace exactly as for NDIF and runs it here, a serverless dry run.

>>> from valueprobe.hooks.route import residuals
>>> acts = residuals(lm, ids, mask, layers=[12], site="resid_post", route="nnsight", remote=True)

The bodies of the ``with model.trace(...)`` blocks below are shipped to the server as
source: they must use only torch, builtins and values defined before the block, never
valueprobe names (the server does not have valueprobe installed).
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import nnsight
import torch
from jaxtyping import Float, Int
from torch import Tensor

from valueprobe.errors import ValueprobeError
from valueprobe.hooks.addition import addition
from valueprobe.hooks.decode import Decode
from valueprobe.hooks.forward import (
    Forward,
    Read,
    Reduce,
    as_output,
    module_path,
    reduced,
    state_signature,
    twin,
)

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel

Remote = bool | str  # False, True (NDIF), "local" (dry run), or an NDIF host URL

# model -> (signature of its weights when wrapped, wrapper); rebuilt when the weights move.
_LOCAL: weakref.WeakKeyDictionary[torch.nn.Module, tuple[Any, Any]] = weakref.WeakKeyDictionary()
_REMOTE: dict[str, Any] = {}


def nnsight_model(lm: LoadedModel, *, remote: Remote = False) -> Any:
    """The ``TransformersModel`` a trace runs on (cached per model).

    Args:
        lm: the loaded model; its module tree names the decoder blocks.
        remote: truthy (other than ``"local"``) for NDIF: a meta model built from
            ``lm.model_id``, which must then be a Hugging Face repo id NDIF serves.
    """
    from nnsight.modeling.transformers import TransformersModel

    if remote and remote != "local":
        if lm.model_id not in _REMOTE:
            _REMOTE[lm.model_id] = TransformersModel(lm.model_id, task="text-generation")
        return _REMOTE[lm.model_id]
    signature = state_signature(lm.model)
    cached = _LOCAL.get(lm.model)
    if cached is not None and cached[0] == signature:
        return cached[1]
    if lm.tokenizer is None:
        raise ValueprobeError(
            "the nnsight route needs the model's tokenizer: load it with valueprobe.model.load.load"
        )
    # nnsight sets pad token and padding side on the tokenizer it is given: give it a copy.
    wrapped = TransformersModel(twin(lm.model), task="text-generation", tokenizer=copy.deepcopy(lm.tokenizer))
    _LOCAL[lm.model] = (signature, wrapped)
    return wrapped


def _envoys(model: Any, lm: LoadedModel, blocks: Sequence[int]) -> list[Any]:
    return [model.get(module_path(lm.model, lm.layers[b])) for b in blocks]


class NnsightRoute:
    """nnsight traces over a twin of the model, locally or on NDIF (`valueprobe.hooks.route.Route`)."""

    name = "nnsight"

    def read(self, fwd: Forward, reads: Sequence[Read], reduce: Reduce | None) -> dict[Read, Tensor]:
        """The residual at each read (in execution order, as nnsight requires), in one trace."""
        model = nnsight_model(fwd.lm, remote=fwd.remote)
        envoys = _envoys(model, fwd.lm, [b for b, _ in reads])
        reads_input = [is_input for _, is_input in reads]
        with torch.no_grad(), model.trace(**_inputs(fwd), remote=fwd.remote) as tracer:
            acts = []
            for envoy, is_input in zip(envoys, reads_input, strict=True):
                value = envoy.input if is_input else envoy.output
                acts.append(value[0] if isinstance(value, tuple) else value)
            acts = nnsight.save(acts)
            tracer.stop()
        return reduced(dict(zip(reads, acts, strict=True)), reduce)

    def steered_logits(
        self, fwd: Forward, at: Read, delta: Float[Tensor, "batch pos d_model"]
    ) -> Float[Tensor, "batch pos vocab"]:
        """Logits with ``delta`` added to the residual at ``at``, in an nnsight trace."""
        model = nnsight_model(fwd.lm, remote=fwd.remote)
        (envoy,) = _envoys(model, fwd.lm, [at[0]])
        add_to_input = at[1]
        with torch.no_grad(), model.trace(**_inputs(fwd), remote=fwd.remote):
            _add(envoy, delta, to_input=add_to_input)
            logits = nnsight.save(model.output.logits)
        return as_output(logits)

    def generate(self, run: Decode) -> Int[Tensor, "batch seq"]:
        """Open-loop steered ``generate`` in one nnsight trace: the route for NDIF-sized models.

        Takes the steering as data (`Plan.as_additions`). The deltas are built before the trace, so
        the graph needs no valueprobe names: the prompt pass adds ``α·size·v̂`` at the prompt's real
        cells when ``where`` is ``all``/``prompt``, every later step at its one new cell when
        ``where`` is ``all``/``generated``: the hooks route's tokens, as its additions are. A live
        plan (or stopping criteria) is refused: the graph cannot hand a value read in one step back
        to Python before that step's addition. So is a plan that does more than add, in the one line
        the plan words (``beyond``: another operator, a site off the residual stream, a window, a
        condition; `valueprobe.steering.hook.additive`).
        """
        data = run.steering.as_additions()
        if data.live or run.stopping is not None:
            raise ValueprobeError(
                "traces and closed-loop control run on route 'hooks' only: nnsight's generate graph "
                "cannot hand a value read in one step back to Python before that step's addition"
            )
        if data.beyond:
            raise ValueprobeError(data.beyond)
        model = nnsight_model(run.lm, remote=run.remote)
        envoys = _envoys(model, run.lm, [a.point.layer for a in data.points])
        on_input = [a.point.site == "resid_pre" for a in data.points]
        real = run.attention_mask.to(torch.float32)
        prompt_on = float(data.where in ("all", "prompt"))
        gen_on = float(data.where in ("all", "generated"))
        alpha = data.alpha.to(torch.float32)[:, None]  # [batch, 1]: the prompt's cells, then one new cell
        first = [addition(alpha * real * prompt_on, a.unit_size, a.direction) for a in data.points]
        later = [addition(alpha * gen_on, a.unit_size, a.direction) for a in data.points]
        inputs = {"input_ids": run.input_ids, "attention_mask": run.attention_mask}
        with warnings.catch_warnings():
            # The open loop ends with the run, and nnsight warns so at every call.
            warnings.filterwarnings("ignore", message=".*was never reached.*")
            with (
                torch.no_grad(),
                model.generate(
                    generation_config=run.config, logits_processor=run.processors, remote=run.remote
                ) as tracer,
            ):
                with tracer.invoke(**inputs):
                    for step in tracer.iter[:]:  # open: ends with the generation, and nothing after it runs
                        for envoy, is_input, d0, d1 in zip(envoys, on_input, first, later, strict=True):
                            delta = d0 if step == 0 else d1
                            _add(envoy, delta, to_input=is_input)
                with tracer.invoke():
                    seqs = nnsight.save(tracer.result)
        return seqs.detach().cpu()


def _inputs(fwd: Forward) -> dict[str, Tensor]:
    # Left on the CPU: nnsight moves them to the model (or ships them to NDIF) itself.
    return {
        "input_ids": fwd.input_ids,
        "attention_mask": fwd.attention_mask,
        "position_ids": fwd.position_ids,
    }


def _add(envoy: Any, delta: Tensor, *, to_input: bool) -> None:
    """Inside a trace, add ``delta`` to a block's input or output (the first element of a tuple).

    The delta is cast where it lands: on NDIF the residual's device and dtype are the server's.
    """
    if to_input:
        hidden = envoy.input
        envoy.input = hidden + delta.to(device=hidden.device, dtype=hidden.dtype)
        return
    hidden = envoy.output
    if isinstance(hidden, tuple):
        first = hidden[0]
        envoy.output = (first + delta.to(device=first.device, dtype=first.dtype), *hidden[1:])
    else:
        envoy.output = hidden + delta.to(device=hidden.device, dtype=hidden.dtype)
