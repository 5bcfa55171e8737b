"""The reference route: plain forward hooks on the loaded model itself (``route="hooks"``).

>>> from valueprobe.hooks.route import residuals
>>> acts = residuals(lm, ids, mask, layers=[6, -1], site="resid_post")   # route="hooks", the default

It stands on the public hook layer (`valueprobe.hooks.patch`), so it is the one route that runs
Python inside every forward: capture's reductions in the hook, and under ``generate`` the steering
handle's per-token reads and closed-loop α. The nnsight and TransformerLens routes are tested
against it, and it against ``output_hidden_states`` (tests/test_routes.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress

import torch
from jaxtyping import Float, Int
from torch import Tensor

from valueprobe.hooks.decode import Decode
from valueprobe.hooks.forward import Forward, Read, Reduce, as_output
from valueprobe.hooks.patch import Point, StopForward, intervene, record
from valueprobe.vocab import Site

__all__ = ["HooksRoute"]


def _point(read: Read) -> Point:
    block, is_input = read
    return Point(block, Site.resid_pre if is_input else Site.resid_post)


class HooksRoute:
    """Plain forward hooks on the loaded model itself (`valueprobe.hooks.route.Route`)."""

    name = "hooks"

    def read(self, fwd: Forward, reads: Sequence[Read], reduce: Reduce | None) -> dict[Read, Tensor]:
        """The residual at each read in one forward; the last read stops it (no unembed).

        ``reduce`` runs inside the hook (capture's token selection), so only its result is kept.
        """
        points = [_point(r) for r in reads]
        device = fwd.lm.device
        with record(fwd.lm, points, reduce=reduce, stop=True) as rec, torch.no_grad(), suppress(StopForward):
            fwd.lm.model(input_ids=fwd.input_ids.to(device), **fwd.kwargs(device))
        return {r: rec[p] for r, p in zip(reads, points, strict=True)}

    def steered_logits(
        self, fwd: Forward, at: Read, delta: Float[Tensor, "batch pos d_model"]
    ) -> Float[Tensor, "batch pos vocab"]:
        """Logits with ``delta`` added to the residual at ``at``. See `valueprobe.hooks.route.steered_logits`."""
        param = next(fwd.lm.model.parameters())
        delta = delta.to(device=param.device, dtype=param.dtype)
        with intervene(fwd.lm, _point(at), lambda h, step: h + delta), torch.no_grad():
            output = fwd.lm.model(input_ids=fwd.input_ids.to(param.device), **fwd.kwargs(param.device))
        return as_output(output.logits)

    def generate(self, run: Decode) -> Int[Tensor, "batch seq"]:
        """The model's own ``generate`` with the run's steering attached (as Python hooks), removed
        in ``finally``; prompt then new tokens, on the model's device."""
        device = run.lm.device
        with run.steering.attach(), torch.no_grad():
            return run.lm.model.generate(
                input_ids=run.input_ids.to(device),
                attention_mask=run.attention_mask.to(device),
                generation_config=run.config,
                logits_processor=run.processors,
                stopping_criteria=run.stopping,
            )
