"""The ``ValueAxis`` artifact: one unit direction per layer, with σ calibration and provenance.

Fitted by :func:`valueprobe.probe.layer_sweep.fit_store` / :func:`valueprobe.probe.fit.fit_probe`, saved as a
folder (``axis.safetensors`` + ``probe.json``), and read back checked against the model::

    from valueprobe.probe.axis import ValueAxis
    axis = ValueAxis.load("smollm2-135m-value", lm=lm)          # a shipped axis; checks d_model + fingerprint
    axis.score(h, layer=18)                                     # (h·v̂ − μ)/σ
    (axis_a - axis_b).save("probes/diff")                       # μ, σ uncalibrated until vp.calibrate

Sign convention everywhere: positive = success / value up (label 1, span ``post``).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write, jsonable, write_json
from valueprobe.hooks.addition import addition
from valueprobe.model.fingerprint import check_model, check_records
from valueprobe.probe.reference import SigmaReference
from valueprobe.probe.registry import probe_path
from valueprobe.records import Record, refuse_newer
from valueprobe.version import __version__
from valueprobe.vocab import Site, Unit, choice, layer_ranges

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel

FORMAT_VERSION = 1
CALIBRATE = "vp.calibrate(axis, lm), or valueprobe calibrate --probe P --out DIR"
log = logging.getLogger("valueprobe")
ArrayOrTensor = TypeVar("ArrayOrTensor", torch.Tensor, np.ndarray)


@dataclass(frozen=True)
class ProbeRef(Record):
    """Which probe a result was read on, and its units at one layer: what a score or a shift keeps
    of the axis (``"probe"`` in summary.json and shift.json). ``axis.ref(layer)`` makes one."""

    model_id: str
    fingerprint: str
    method: str
    site: str
    mu: float
    sigma: float
    sigma_reference: str


def check_combinable(axes: Sequence[ValueAxis]) -> None:
    """Refuse, in one line, axes that cannot be combined: other widths or other architectures.

    Axes of one architecture with other weights (a base model and its tuned descendant) combine
    with a `valueprobe.model.fingerprint.FingerprintWarning`.
    """
    first = axes[0]
    for other in axes[1:]:
        if other.d_model != first.d_model:
            raise ValueprobeError(
                f"cannot combine axes of different widths: {first.model_id} (d_model {first.d_model})"
                f" and {other.model_id} (d_model {other.d_model})"
            )
        check_records(
            first.fingerprint, other.fingerprint, what=f"axes of {first.model_id} and {other.model_id}"
        )


# unit -> (the axis statistic one unit is a fraction of, its name in errors, that fraction, the fix)
_UNIT_STATS: dict[Unit, tuple[str, str, float, str]] = {
    Unit.sigma: ("sigma", "σ", 1.0, f"calibrate it ({CALIBRATE}) or use --unit raw"),
    Unit.norm: (
        "mean_norm",
        "mean residual norm",
        0.01,
        f"calibrate it ({CALIBRATE}) or use --unit sigma",
    ),
}


@dataclass(frozen=True, eq=False)
class ValueAxis:
    """The value axis: one unit direction per layer plus what is needed to use it.

    ``mu``/``sigma`` are the mean and standard deviation of ``h @ v̂`` over ``sigma_reference``:
    :func:`valueprobe.probe.calibrate.calibrate` measures them over the one neutral reference every
    axis shares (`valueprobe.probe.reference`), so 1σ is a comparable push on every axis; a fitter
    leaves its fitting set's until then. ``mean_norm`` is the mean L2 norm of the residual at each
    layer over the rows the axis was fitted on, for α as a % of norm. ``formerly`` keeps the
    statistics a recalibration replaced (`former`): what was written in their units is read in them.

    Arithmetic: ``-axis`` flips every direction (and μ); ``k * axis`` keeps the unit
    directions and multiplies ``scale``, the steering strength (negative k also flips);
    ``a - b`` / ``a + b`` combine ``scale·v̂`` per shared layer and renormalize, and
    ``a.orthogonalize(b)`` projects b's direction out of a's, each leaving μ and σ uncalibrated
    (NaN) until :func:`valueprobe.probe.calibrate.calibrate` and recording in ``made`` (``probe.json``)
    the operation, the layers and the `provenance` of both axes. ``axis[18]`` keeps one layer.
    Readouts (``project``, ``score``) ignore ``scale``.

    >>> axis = ValueAxis.load("smollm2-135m-value", lm=lm)
    >>> (-axis).score(h, layer=18) == -axis.score(h, layer=18)
    """

    directions: torch.Tensor  # [n_layers_kept, d_model] float32, unit rows
    layers: tuple[int, ...]
    mu: torch.Tensor  # [n_layers_kept]
    sigma: torch.Tensor  # [n_layers_kept]
    mean_norm: torch.Tensor  # [n_layers_kept]
    best_layer: int
    site: Site
    method: str
    model_id: str
    fingerprint: str
    d_model: int
    scale: float = 1.0
    sigma_reference: SigmaReference = SigmaReference("fitting set")
    metrics: dict = field(default_factory=dict)
    datasets: tuple[dict, ...] = ()
    ops: tuple[str, ...] = ()
    version: str = __version__
    made: dict = field(default_factory=dict)  # how axis arithmetic made it: {"op", "layers", "from": [...]}
    # the statistics a recalibration replaced: {"sigma_reference": {...}, "mu", "sigma", "mean_norm": [...]}
    formerly: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.layers)
        if tuple(self.directions.shape) != (n, self.d_model):
            raise ValueprobeError(
                f"axis: directions {tuple(self.directions.shape)} do not match {n} layers × d_model {self.d_model}"
            )
        for name in ("mu", "sigma", "mean_norm"):
            if tuple(getattr(self, name).shape) != (n,):
                raise ValueprobeError(
                    f"axis: {name} has shape {tuple(getattr(self, name).shape)}, expected ({n},)"
                )
        if self.best_layer not in self.layers:
            raise ValueprobeError(
                f"axis: best layer {self.best_layer} is not among its layers {list(self.layers)}"
            )

    def _index(self, layer: int | None) -> int:
        layer = self.best_layer if layer is None else layer
        if layer not in self.layers:
            raise ValueprobeError(
                f"layer {layer} is not in this axis; it has layers {layer_ranges(self.layers)}"
            )
        return self.layers.index(layer)

    def ref(self, layer: int) -> ProbeRef:
        """This axis's identity and its units (μ, σ) at ``layer``, as results record it."""
        i = self.layers.index(layer)
        return ProbeRef(
            model_id=self.model_id,
            fingerprint=self.fingerprint,
            method=self.method,
            site=str(self.site),
            mu=float(self.mu[i]),
            sigma=float(self.sigma[i]),
            sigma_reference=str(self.sigma_reference),
        )

    def direction(self, layer: int | None = None) -> torch.Tensor:
        """Unit direction [d_model] at ``layer`` (default: the best layer)."""
        return self.directions[self._index(layer)]

    def project(self, h: ArrayOrTensor, layer: int | None = None) -> ArrayOrTensor:
        """``h @ v̂`` for h [..., d_model]; returns [...] of the input's kind."""
        i = self._index(layer)
        if isinstance(h, np.ndarray):
            return np.asarray(h, dtype=np.float64) @ self.directions[i].double().numpy()
        return h @ self.directions[i].to(device=h.device, dtype=h.dtype)

    def calibrated(self, layer: int | None = None) -> bool:
        """Whether ``layer`` has a usable σ (axis arithmetic leaves it NaN until calibrate)."""
        sigma = float(self.sigma[self._index(layer)])
        return math.isfinite(sigma) and sigma > 0

    def sigma_at(self, layer: int | None = None) -> float:
        """σ of the projection at ``layer``; the one place an uncalibrated axis is refused."""
        i = self._index(layer)
        if not self.calibrated(self.layers[i]):
            raise ValueprobeError(
                f"axis layer {self.layers[i]} has no σ calibration ({self.sigma_reference}):"
                f" calibrate it first ({CALIBRATE})"
            )
        return float(self.sigma[i])

    def standardize(self, proj: ArrayOrTensor | float, layer: int | None = None) -> ArrayOrTensor | float:
        """Projections in σ units, ``(proj − μ) / σ``."""
        sigma = self.sigma_at(layer)
        return (proj - float(self.mu[self._index(layer)])) / sigma

    def score(self, h: ArrayOrTensor, layer: int | None = None) -> ArrayOrTensor:
        """Projection in σ units, ``(h @ v̂ − μ) / σ``, for h [..., d_model]."""
        return (self.project(h, layer) - float(self.mu[self._index(layer)])) / self.sigma_at(layer)

    def unit_size(self, layer: int, unit: Unit | str) -> float:
        """The size of one unit of α at ``layer``, in raw units (along v̂): σ, 1 % of the mean
        residual norm, or 1, times ``scale``. α·unit_size is what steering adds; this is the one
        place α's units are defined (`vector`, the steering handle, the vLLM plugin and the
        exported control vectors all size α here).

        Raises one clear `ValueprobeError` when the axis lacks the layer or the statistics the unit
        needs. Needs no model, so commands check a unit before one loads.

        >>> axis.unit_size(axis.best_layer, "norm")   # 1 % of that layer's mean residual norm
        """
        unit = choice(Unit, str(unit), what="unit")
        if layer not in self.layers:
            raise ValueprobeError(
                f"the axis has no layer {layer}: pick one of its layers {list(self.layers)} (--layer)"
            )
        if unit == Unit.raw:
            return float(self.scale)
        stat, name, fraction, fix = _UNIT_STATS[unit]
        value = float(getattr(self, stat)[self.layers.index(layer)])
        if not (math.isfinite(value) and value > 0):
            raise ValueprobeError(
                f"axis layer {layer} has no {name} statistics for --unit {unit.value}: {fix}"
            )
        return value * fraction * float(self.scale)

    def vector(
        self, layer: int | None = None, *, alpha: float = 1.0, units: Unit = Unit.sigma
    ) -> torch.Tensor:
        """The steering vector α·unit_size·v̂ [d_model] with α in ``units`` (see `unit_size`):
        α·σ, α % of the layer's mean norm, or α as given, each times ``scale``."""
        i = self._index(layer)
        size = self.unit_size(self.layers[i], units)
        return addition(torch.tensor(alpha, dtype=torch.float32), size, self.directions[i].float())

    def __getitem__(self, layer: int) -> ValueAxis:
        i = self._index(layer)
        keep = slice(i, i + 1)
        return replace(
            self,
            directions=self.directions[keep],
            layers=(layer,),
            mu=self.mu[keep],
            sigma=self.sigma[keep],
            mean_norm=self.mean_norm[keep],
            best_layer=layer,
            formerly=self._formerly_map(lambda name, xs: xs[keep]),
        )

    def __neg__(self) -> ValueAxis:
        flip = lambda name, xs: [None if x is None else -x for x in xs] if name == "mu" else xs  # noqa: E731
        return replace(
            self,
            directions=-self.directions,
            mu=-self.mu,
            ops=(*self.ops, "neg"),
            formerly=self._formerly_map(flip),
        )

    def _formerly_map(self, fn: Any) -> dict:
        """``formerly`` with ``fn(name, values)`` applied to each per-layer list (μ, σ, mean norm)."""
        return {k: v if k == "sigma_reference" else fn(k, v) for k, v in self.formerly.items()}

    def __mul__(self, k: float) -> ValueAxis:
        if not isinstance(k, (int, float)) or not math.isfinite(k):
            return NotImplemented
        base = -self if k < 0 else self
        return replace(base, scale=self.scale * abs(k), ops=(*base.ops, f"scale {abs(k):g}"))

    __rmul__ = __mul__

    def provenance(self) -> dict[str, Any]:
        """What this axis is and how it was made: the record `made` keeps of each axis it combines."""
        out: dict[str, Any] = {
            "model_id": self.model_id,
            "fingerprint": self.fingerprint,
            "method": self.method,
            "site": str(self.site),
            "layers": list(self.layers),
            "scale": self.scale,
            "ops": list(self.ops),
            **({"made": self.made} if self.made else {}),
            "datasets": list(self.datasets),
        }
        return out | ({"made": self.made} if self.made else {})

    def _shared(self, other: ValueAxis) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """The layers both axes have, and each axis's scale·v̂ there ``[shared, d_model]``."""
        check_combinable([self, other])
        shared = [layer for layer in self.layers if layer in other.layers]
        if not shared:
            raise ValueprobeError(
                f"axes share no layer: {layer_ranges(self.layers)} vs {layer_ranges(other.layers)}"
            )
        a = torch.stack([self.direction(layer) * self.scale for layer in shared])
        b = torch.stack([other.direction(layer) * other.scale for layer in shared])
        return shared, a, b

    def _made(self, other: ValueAxis, shared: list[int], v: torch.Tensor, how: str, symbol: str) -> ValueAxis:
        """The axis of directions ``v`` (renormalized) at ``shared``, made from self and ``other`` by ``how``."""
        norms = v.norm(dim=1, keepdim=True)
        if (norms < 1e-6).any():
            raise ValueprobeError(
                f"axis arithmetic ({how}) gave a zero direction: the axes are parallel or cancel"
            )
        nan = torch.full((len(shared),), float("nan"))
        return ValueAxis(
            directions=v / norms,
            layers=tuple(shared),
            mu=nan,
            sigma=nan.clone(),
            mean_norm=torch.stack([self.mean_norm[self._index(layer)] for layer in shared]),
            best_layer=self.best_layer if self.best_layer in shared else shared[0],
            site=self.site,
            method=f"({self.method}) {symbol} ({other.method})",
            model_id=self.model_id,
            fingerprint=self.fingerprint,
            d_model=self.d_model,
            sigma_reference=SigmaReference(f"uncalibrated (axis arithmetic): run {CALIBRATE}"),
            datasets=self.datasets + other.datasets,
            ops=(*self.ops, f"{symbol} axis"),
            made={"op": how, "layers": list(shared), "from": [self.provenance(), other.provenance()]},
        )

    def _combine(self, other: ValueAxis, sign: float) -> ValueAxis:
        if not isinstance(other, ValueAxis):
            return NotImplemented
        shared, a, b = self._shared(other)
        how, symbol = ("difference", "-") if sign < 0 else ("sum", "+")
        return self._made(other, shared, a + sign * b, how, symbol)

    def orthogonalize(self, other: ValueAxis) -> ValueAxis:
        """This axis with ``other``'s direction projected out at each shared layer: v̂ − (v̂·ŵ)ŵ,
        renormalized (its own scale kept). μ and σ are left uncalibrated, as for ``a - b``.

        >>> value_only = value_axis.orthogonalize(length_axis)    # steer value, not length
        >>> float(value_only.direction(18) @ length_axis.direction(18))   # 0 up to rounding
        """
        shared, a, b = self._shared(other)
        w = b / b.norm(dim=1, keepdim=True)
        v = a - (a * w).sum(dim=1, keepdim=True) * w
        made = self._made(other, shared, v, "orthogonalize", "⊥")
        return replace(made, scale=self.scale)

    def __sub__(self, other: ValueAxis) -> ValueAxis:
        return self._combine(other, -1.0)

    def __add__(self, other: ValueAxis) -> ValueAxis:
        return self._combine(other, 1.0)

    def check(self, lm: LoadedModel, *, force: bool = False) -> None:
        """Refuse ``lm`` unless it has this axis's width, layers and architecture; warn if only its weights differ.

        A fine-tuned descendant of the axis's model (same config shape and vocabulary, other
        weights) is read with a :class:`~valueprobe.model.fingerprint.FingerprintWarning`. ``force``
        reads a model of another architecture too (d_model and layers are always checked).
        """
        if lm.d_model != self.d_model:
            raise ValueprobeError(
                f"probe has d_model {self.d_model} ({self.model_id}) but the model has d_model {lm.d_model}"
                f" ({lm.model_id}); use a probe fitted on this model"
            )
        if max(self.layers) >= lm.n_layers:
            raise ValueprobeError(
                f"probe uses layer {max(self.layers)} but the model has layers 0..{lm.n_layers - 1}"
            )
        check_model(self.fingerprint, lm, what="probe", model_id=self.model_id, force=force)

    def save(self, path: str | Path) -> Path:
        """Write ``path/axis.safetensors`` and ``path/probe.json`` (each atomically; JSON last)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        tensors = {
            "directions": self.directions.float().contiguous(),
            "mu": self.mu.float().contiguous(),
            "sigma": self.sigma.float().contiguous(),
            "mean_norm": self.mean_norm.float().contiguous(),
            "layers": torch.tensor(self.layers, dtype=torch.int64),
        }
        atomic_write(
            path / "axis.safetensors",
            lambda p: save_file(tensors, str(p), metadata={"format": "valueprobe.probe.axis"}),
        )
        info = {
            "format": "valueprobe.probe.axis",
            "format_version": FORMAT_VERSION,
            "model_id": self.model_id,
            "fingerprint": self.fingerprint,
            "d_model": self.d_model,
            "layers": list(self.layers),
            "best_layer": self.best_layer,
            "site": str(self.site),
            "method": self.method,
            "scale": self.scale,
            "sigma_reference": self.sigma_reference.to_dict(),
            **({"formerly": self.formerly} if self.formerly else {}),
            "ops": list(self.ops),
            **({"made": self.made} if self.made else {}),
            "datasets": list(self.datasets),
            "metrics": self.metrics,
            "valueprobe_version": self.version,
        }
        write_json(path / "probe.json", jsonable(info), sort_keys=True, allow_nan=False)
        return path

    @classmethod
    def load(cls, path: str | Path, *, lm: LoadedModel | None = None, force: bool = False) -> ValueAxis:
        """Read a probe folder, or a shipped axis by name; with ``lm``, also :meth:`check` it against the model.

        >>> ValueAxis.load("smollm2-135m-value").best_layer      # a shipped axis (valueprobe.probe.registry)
        20
        >>> ValueAxis.load("probes/my-axis", lm=lm)                # a folder written by fit or save
        """
        given, path = str(path), probe_path(path)
        meta_path, tensor_path = path / "probe.json", path / "axis.safetensors"
        if not meta_path.is_file() or not tensor_path.is_file():
            raise ValueprobeError(f"{path} is not a probe folder: it needs probe.json and axis.safetensors")
        try:
            info = json.loads(meta_path.read_text(encoding="utf-8"))
            version = int(info["format_version"])
            # a newer format is named as such before its tensors are read (their layout may have changed)
            tensors = load_file(str(tensor_path)) if version <= FORMAT_VERSION else {}
        except (json.JSONDecodeError, KeyError, ValueError, OSError, SafetensorError) as e:
            raise ValueprobeError(f"{path}: unreadable probe ({type(e).__name__}: {e}); refit it") from None
        refuse_newer(version, reads=FORMAT_VERSION, where=meta_path)
        try:
            axis = cls(
                directions=tensors["directions"],
                layers=tuple(int(x) for x in info["layers"]),
                mu=tensors["mu"],
                sigma=tensors["sigma"],
                mean_norm=tensors["mean_norm"],
                best_layer=int(info["best_layer"]),
                site=Site(info["site"]),
                method=info["method"],
                model_id=info["model_id"],
                fingerprint=info["fingerprint"],
                d_model=int(info["d_model"]),
                scale=float(info.get("scale", 1.0)),
                sigma_reference=SigmaReference.read(info.get("sigma_reference")),
                formerly=info.get("formerly", {}),
                metrics=info.get("metrics", {}),
                datasets=tuple(info.get("datasets", [])),
                ops=tuple(info.get("ops", [])),
                made=info.get("made", {}),
                version=info.get("valueprobe_version", "unknown"),
            )
        except KeyError as e:
            raise ValueprobeError(f"{path}: probe is missing {e}; refit it") from None
        if tensors["layers"].tolist() != list(axis.layers):
            raise ValueprobeError(f"{path}: layers in probe.json and axis.safetensors disagree; refit it")
        if lm is not None:
            axis.check(lm, force=force)
        if not isinstance(info.get("sigma_reference"), dict):  # written before σ references
            axis.note_units(given)
        return axis

    def note_units(self, where: str) -> None:
        """One line when α in σ means another push here than on every other axis: statistics from
        another reference than the shared neutral one (an axis written before that reference) are
        read as recorded, never rescaled."""
        ref = self.sigma_reference
        if ref.standard or not self.calibrated(self.best_layer):
            return
        layer = self.best_layer
        share = self.unit_size(layer, Unit.sigma) / self.unit_size(layer, Unit.norm)
        log.warning(
            f"{where}: σ is measured over {ref}, not the neutral reference every axis shares;"
            f" α in σ is read in those units (1σ = {share:.1f}% of the mean residual norm at layer"
            f" {layer}): recalibrate it with {CALIBRATE}"
        )

    def former(self) -> ValueAxis:
        """This axis with the statistics its last recalibration replaced (``formerly``): what a
        spec or result written before then meant by α in σ. Raises when there are none."""
        if not self.formerly:
            raise ValueprobeError(f"this axis ({self.model_id}, {self.method}) keeps no former calibration")
        f = self.formerly
        t = lambda xs: torch.tensor([math.nan if x is None else x for x in xs], dtype=torch.float32)  # noqa: E731
        return replace(
            self,
            mu=t(f["mu"]),
            sigma=t(f["sigma"]),
            mean_norm=t(f["mean_norm"]),
            sigma_reference=SigmaReference.read(f["sigma_reference"]),
            formerly={},
        )
