"""The workbench in a notebook: ``vp.explore(lm, axis)``, an α slider over three coloured strips.

    >>> ex = vp.explore(lm, axis, "Is 91 prime?")     # in Jupyter: a slider, then the strips below it
    >>> ex                                             # (pip install 'valueprobe[notebook]' for the slider)
    >>> ex.strips(alpha=2.0)                           # the same three strips as HTML, no widget needed
    >>> ex.run(alpha=2.0)["steered"].values.sigma      # the Generation behind each strip

Each α generates three rows from the same prompt with the same random numbers: steered along the
axis at α, unsteered, and along a random direction at α (the null: one unit direction drawn when
the explorer is made, named ``random-<seed>``, pushed with the axis's unit sizes, so its addition
has the axis's norm). Each generated token is coloured by its value, read in the forward that
produced it after the addition (`valueprobe.read.values.Values`). The slider runs from −1 to +1
times the layer's mean residual norm, in the spec's unit. Without ipywidgets the explorer shows
the strips at its starting α.
"""

from __future__ import annotations

import html
import secrets
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from valueprobe.errors import ValueprobeError
from valueprobe.stats.null import random_directions
from valueprobe.steering.decode.generation import Generation, generate
from valueprobe.steering.decode.sampling import Decoding
from valueprobe.steering.hook.handle import Specified
from valueprobe.steering.hook.spec import SteeringSpec, as_spec

if TYPE_CHECKING:
    from valueprobe.activations.prompts import Prompt
    from valueprobe.model.load import LoadedModel

__all__ = ["COLUMNS", "Explorer", "explore"]

COLUMNS = ("steered", "unsteered", "random")


class Strips:
    """Three coloured strips side by side, as HTML (what a notebook shows for `Explorer.strips`)."""

    def __init__(self, markup: str) -> None:
        self.markup = markup

    def _repr_html_(self) -> str:
        return self.markup


class Explorer:
    """A prompt, a spec and its null, generated at any α (see the module doc).

    Args:
        lm: the model; spec: what to steer (an axis means its best layer, α in σ).
        prompt: a string (a user turn through the chat template), a chat list or token ids.
        alpha: the starting strength; decoding: how tokens are drawn (greedy by default).
        null_seed: the random direction's seed (default: drawn now).
    """

    def __init__(
        self,
        lm: LoadedModel,
        spec: Specified,
        prompt: Prompt,
        *,
        alpha: float = 1.0,
        decoding: Decoding = Decoding(greedy=True, max_new_tokens=32),
        null_seed: int | None = None,
    ) -> None:
        self.lm = lm
        self.spec = as_spec(spec)
        self.spec.points(lm)  # every check of the spec against the model, before any work
        self.prompt = prompt
        self.alpha = alpha
        self.decoding = decoding
        self.null_seed = secrets.randbits(31) if null_seed is None else null_seed
        axis = self.spec.first_axis()
        r = torch.from_numpy(random_directions(axis.d_model, 1, seed=self.null_seed)[0]).float()
        self.null: SteeringSpec = replace(self.spec, direction=r, direction_name=f"random-{self.null_seed}")
        self._runs: dict[float, dict[str, Generation]] = {}

    def cap(self) -> float:
        """|α| at which the addition is the layer's mean residual norm (the slider's end)."""
        axis = self.spec.first_axis()
        layer = self.spec.steered_layers(self.lm.n_layers)[0]
        norm = float(axis.mean_norm[axis.layers.index(layer)])
        return norm / axis.unit_size(layer, self.spec.unit)

    def run(self, alpha: float) -> dict[str, Generation]:
        """The three rows at ``alpha`` (cached per α): steered and unsteered in one batch, then the null."""
        if alpha not in self._runs:
            kw: dict[str, Any] = {"decoding": self.decoding, "trace": True, "progress": False}
            steered, unsteered = generate(self.lm, self.spec, [self.prompt], alphas=[alpha, 0.0], **kw)
            (null,) = generate(self.lm, self.null, [self.prompt], alphas=[alpha], **kw)
            self._runs[alpha] = {"steered": steered, "unsteered": unsteered, "random": null}
        return self._runs[alpha]

    def strips(self, alpha: float | None = None) -> Strips:
        """The three strips at ``alpha`` (default the current α) as HTML."""
        alpha = self.alpha if alpha is None else alpha
        rows = self.run(alpha)
        unit = self.spec.unit.value
        heads = {
            "steered": f"steered: α = {alpha:g} {unit}",
            "unsteered": "unsteered: α = 0",
            "random": f"{self.null.direction_name}: α = {alpha:g} {unit}",
        }
        cells = []
        for name in COLUMNS:
            values = rows[name].values
            assert values is not None  # generate(trace=True) gives every row its values
            cells.append(
                f"<div style='flex:1;min-width:14em'><b>{html.escape(heads[name])}</b>{values._repr_html_()}</div>"
            )
        return Strips(f"<div class='vp-explore' style='display:flex;gap:1em'>{''.join(cells)}</div>")

    def widget(self) -> Any:
        """An ipywidgets slider over the strips (``pip install 'valueprobe[notebook]'``)."""
        try:
            import ipywidgets as widgets  # optional: the notebook extra
        except ImportError:
            raise ValueprobeError(
                "vp.explore's slider needs ipywidgets: pip install 'valueprobe[notebook]'"
            ) from None
        cap = round(self.cap(), 1)
        slider = widgets.FloatSlider(
            value=self.alpha, min=-cap, max=cap, step=0.1, description="α", continuous_update=False
        )
        out = widgets.HTML(self.strips().markup)

        def moved(change: dict) -> None:
            self.alpha = float(change["new"])
            out.value = self.strips().markup

        slider.observe(moved, names="value")
        return widgets.VBox([slider, out])

    def _repr_mimebundle_(self, **kw: Any) -> dict[str, Any]:
        """The slider in a live notebook; the strips at the starting α wherever widgets do not
        render (a saved notebook on the web, the docs site, no ipywidgets)."""
        bundle = {"text/html": self.strips().markup, "text/plain": repr(self)}
        try:
            widget = self.widget()
        except ValueprobeError:
            return bundle
        return {**widget._repr_mimebundle_(**kw), **bundle}

    def __repr__(self) -> str:
        return f"Explorer(α = {self.alpha:g} {self.spec.unit.value}, null {self.null.direction_name})"


def explore(
    lm: LoadedModel,
    spec: Specified,
    prompt: Prompt = "Is 91 a prime number?",
    *,
    alpha: float = 1.0,
    decoding: Decoding = Decoding(greedy=True, max_new_tokens=32),
    null_seed: int | None = None,
) -> Explorer:
    """An `Explorer` of ``prompt`` under ``spec``: in a notebook, an α slider over the steered,
    unsteered and random-direction strips (see the module doc).

    >>> ex = explore(lm, axis, "Is 91 prime?", alpha=2.0)
    """
    return Explorer(lm, spec, prompt, alpha=alpha, decoding=decoding, null_seed=null_seed)
