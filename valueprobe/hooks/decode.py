"""Steered generation as every route receives it: one `Decode` record per batched ``generate``.

`valueprobe.steering.decode.generation` builds one per chunk of rows and hands it to
``route_for(name).generate``; it never asks which route it has:

    >>> from valueprobe.hooks.route import route_for
    >>> seqs = route_for("nnsight").generate(Decode(lm, ids, mask, config=config, processors=processors,
    ...     steering=Steering(lm, spec, alpha, prompt_length=ids.shape[1])))

The steering is one object, a `Plan` (`valueprobe.steering.hook.handle.Steering` is one), that a
route takes in the form it can run:
- as Python (`Plan.attach`), for routes that run the model's own forward here (plain hooks): the
  plan attaches the hook-layer handle doing the steering, and maybe more (per-token value traces,
  closed-loop α); the route removes it in ``finally``;
- as data (`Plan.as_additions`), for routes that build the run as a graph before it starts
  (nnsight, and so NDIF): row r adds ``alpha[r] · unit_size · direction`` at each addition's
  point, on the prompt's real cells (``where`` ``all`` or ``prompt``) and on every generated cell
  (``all`` or ``generated``). `Additions.live` says the plan does more than the data while the run
  goes (reads values, sets α); `Additions.beyond` is the one line refusing what else it steers
  that data cannot say (an operator other than ``add``, a site off the residual stream, a window,
  a condition: `valueprobe.steering.hook.additive`), which a route that only takes data raises.

A route never reads α itself: it attaches the plan, or hands its data to the graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from jaxtyping import Float, Int
from torch import Tensor
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from valueprobe.hooks.patch import Handle, Point

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel

__all__ = ["Addition", "Additions", "Decode", "Plan"]


class Addition(Protocol):
    """One point open-loop steering writes to (`valueprobe.steering.hook.spec.SteerPoint` is one)."""

    @property
    def point(self) -> Point: ...  # the block and site, blocks already resolved to 0-based

    @property
    def direction(self) -> Float[Tensor, " d_model"]: ...  # unit vector, float32, on the CPU

    @property
    def unit_size(self) -> float: ...  # the size of one unit of α there


@dataclass(frozen=True)
class Additions:
    """A plan's steering as data (see the module doc).

    Attributes:
        points: where each unit of α is added; alpha: one strength per row; where: the phase.
        live: the plan reads values or sets α while the run goes (data cannot say that).
        beyond: the one-line refusal of what else the plan steers (empty: the data is all of it).
    """

    points: Sequence[Addition]
    alpha: Float[Tensor, " batch"]
    where: str
    live: bool = False
    beyond: str = ""


class Plan(Protocol):
    """One batch's steering, in the two forms a route can run (see the module doc)."""

    def attach(self) -> Handle: ...

    def as_additions(self) -> Additions: ...


@dataclass(frozen=True)
class Decode:
    """One batched, steered ``generate``.

    Attributes:
        lm: the loaded model.
        input_ids, attention_mask: the prompts, left padded (`valueprobe.hooks.padding.pad_rows`).
        config: the ``GenerationConfig`` (lengths, pad and EOS ids; greedy unless ``processors`` sample).
        processors: logits processors, e.g. the per-row sampler of `valueprobe.steering.decode.sampling`.
        steering: the batch's steering (a `Plan`).
        remote: NDIF execution, for the nnsight route (`valueprobe.hooks.route.route_for` checks it).
        stopping: stopping criteria, called after every step with the tokens so far; they may stop
            rows one by one (a per-request length) and report each step as it ends (serving
            streams tokens this way, `valueprobe.steering.decode.rows`): Python at every step.
    """

    lm: LoadedModel
    input_ids: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    config: GenerationConfig
    processors: LogitsProcessorList
    steering: Plan
    remote: bool | str = False
    stopping: StoppingCriteriaList | None = None
