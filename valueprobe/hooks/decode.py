"""Steered generation as every route receives it: one `Decode` record per batched ``generate``.

`valueprobe.steering.decode.generation` builds one per chunk of rows and hands it to
``route(backend).generate``; it never asks which route it has:

    >>> from valueprobe.hooks.route import route
    >>> seqs = route("nnsight").generate(Decode(lm, ids, mask, config=config, processors=processors,
    ...     additions=plan, alpha=alpha, where="all", hooks=lambda: steer(lm, axis, alpha)))

The steering comes in two forms, one for each kind of route, and both describe the same additions:
- as data (``additions``, ``alpha``, ``where``), for routes that build the run as a graph before it
  starts (nnsight, and so NDIF): row r adds ``alpha[r] · unit_size · direction`` at each addition's
  point, on the prompt's real cells (``where`` ``all`` or ``prompt``) and on every generated cell
  (``all`` or ``generated``);
- as Python (``hooks``), for routes that run the model's own forward here (plain hooks): a factory
  that attaches the hook-layer handle doing that steering, and maybe more (per-token value traces,
  closed-loop α). The route holds the handle for the run and removes it in ``finally``.

``live`` says the hooks do more than the data: a route that only takes data refuses such a run.
``beyond`` names what else the hooks do that the data form cannot say (an operator other than
``add``, a site off the residual stream, a window of generated tokens, a condition): a route that
only takes data refuses such a run in one line that names it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from jaxtyping import Float, Int
from torch import Tensor
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from valueprobe.hooks.patch import Handle, Point

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel

__all__ = ["Addition", "Decode"]


class Addition(Protocol):
    """One point open-loop steering writes to (`valueprobe.steering.hook.handle.SteerPoint` is one)."""

    @property
    def point(self) -> Point: ...  # the block and site, blocks already resolved to 0-based

    @property
    def direction(self) -> Float[Tensor, " d_model"]: ...  # unit vector, float32, on the CPU

    @property
    def unit_size(self) -> float: ...  # the size of one unit of α there


@dataclass(frozen=True)
class Decode:
    """One batched, steered ``generate`` (see the module doc for the two forms of the steering).

    Attributes:
        lm: the loaded model.
        input_ids, attention_mask: the prompts, left padded (`valueprobe.hooks.padding.pad_rows`).
        config: the ``GenerationConfig`` (lengths, pad and EOS ids; greedy unless ``processors`` sample).
        processors: logits processors, e.g. the per-row sampler of `valueprobe.steering.decode.sampling`.
        additions, alpha, where: the steering as data; ``alpha`` holds one strength per row.
        hooks: the steering as Python: attaches it and returns its handle.
        live: the hooks read values or set α while the run goes (data cannot say that).
        beyond: what the hooks steer that the additions do not say, e.g. ``"--op ablate"``
            (empty when the data form is the whole steering).
        remote: NDIF execution, for the nnsight route (`valueprobe.hooks.route.route` checks it).
        stopping: stopping criteria, called after every step with the tokens so far; they may stop
            rows one by one (a per-request length) and report each step as it ends (serving
            streams tokens this way, `valueprobe.steering.decode.rows`). Python at every step: ``live``.
    """

    lm: LoadedModel
    input_ids: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    config: GenerationConfig
    processors: LogitsProcessorList
    additions: Sequence[Addition]
    alpha: Float[Tensor, " batch"]
    where: str
    hooks: Callable[[], Handle]
    live: bool = False
    beyond: str = ""
    remote: bool | str = False
    stopping: StoppingCriteriaList | None = None
