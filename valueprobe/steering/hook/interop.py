"""Steering vectors other tools read: repeng, llama.cpp's GGUF control vectors, steering-vectors.

    valueprobe export --probe probes/smollm2-135m-value --to gguf-control-vector --out value.gguf
    llama-cli -m SmolLM2-135M-Instruct.gguf --control-vector-scaled value.gguf 2   # as steer --alphas 2
    valueprobe import value.gguf --model smollm2-135m --out probes/imported-value

    >>> cv = control_vector(lm, axis, alpha=1.0)           # {block: α·σ·v̂}, keyed as the others key it (or a SteeringSpec)
    >>> write_control_vector(cv, "value.gguf", to="gguf-control-vector")
    >>> axis = import_axis(lm, read_control_vector("value.gguf"))

Conventions, each checked against the other project's own code in ``tests/test_interop.py``:

- **Layer index.** repeng (``ControlModule`` wraps ``model.model.layers[i]``), llama.cpp
  (``direction.{il}`` lands in ``tensors[il]``, added by ``build_cvec(cur, il)`` to the output of
  block ``il``) and steering-vectors (a forward hook on decoder block ``i``) all add the vector to
  the *output* of 0-based decoder block ``i``: valueprobe's ``resid_post[i]``. An axis at
  ``resid_pre[L]`` is therefore written under ``L - 1`` (``resid_pre[L] == resid_post[L-1]``);
  ``resid_pre[0]``, the embeddings, has no key in any of them and is refused.
- **llama.cpp never steers block 0.** ``common_control_vector_load_one`` rejects ``direction.0``
  ("invalid (zero) direction tensor layer index") and ``llama_adapter_cvec`` keeps no tensor for
  block 0, so ``--to gguf-control-vector`` refuses ``resid_post[0]``; repeng and steering-vectors
  accept it.
- **Sign.** Positive means value up in all four tools: a positive strength there is a positive α here.
- **Scale.** The file holds the vector for ``alpha`` (default 1) in ``unit``: σ·scale·v̂ per layer
  for ``sigma``, mean_norm/100·scale·v̂ for ``norm``, scale·v̂ for ``raw`` (the same sizes as
  `valueprobe.probe.axis.ValueAxis.unit_size`). The other tool's strength multiplies it: repeng's
  ``set_control(vector, coeff)``, llama.cpp's ``--control-vector-scaled FILE s`` and
  steering-vectors' ``apply(model, multiplier=s)`` equal ``vp.steer`` with α = s·alpha.
- **Positions.** All three add at every position, prompt included: valueprobe's
  ``positions="all"`` (its default). repeng skips left padding through ``position_ids``;
  valueprobe never touches padding either.
- **Formats.** ``repeng`` and ``gguf-control-vector`` are one GGUF layout, written with the same
  ``gguf.GGUFWriter`` calls as repeng's ``ControlVector.export_gguf``: ``general.architecture`` =
  ``controlvector``, ``controlvector.model_hint`` (the model's ``config.model_type``),
  ``controlvector.layer_count``, and one 1-D F32 tensor ``direction.{i}`` per block.
  steering-vectors has no file format of its own (its ``SteeringVector`` is a dataclass of
  ``layer_activations: dict[int, Tensor]``), so ``--to steering-vectors`` writes those fields as
  safetensors, one tensor per block named by its index, and no pickle::

      sv = SteeringVector({int(k): v for k, v in safetensors.torch.load_file(path).items()}, "decoder_block")

Import reads a GGUF control vector (either writer) into a `ValueAxis` at ``resid_post``: unit
directions, μ and σ uncalibrated (NaN) until ``valueprobe.probe.fit.calibrate``, and the file's
per-layer norms in ``metrics["control_vector"]``. When every layer's vector has one norm (one
layer, or repeng's PCA vectors of norm 1) that norm is the axis's ``scale``, so ``--unit raw``
α = s adds exactly what the file adds at strength s; otherwise ``scale`` is 1 and raw α adds α·v̂.
A file for another architecture or width is refused in one line.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import gguf
import numpy as np
import torch
from jaxtyping import Float
from safetensors.torch import save_file
from torch import Tensor

from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write
from valueprobe.hooks.addition import addition
from valueprobe.probe.axis import CALIBRATE, ValueAxis
from valueprobe.probe.reference import SigmaReference
from valueprobe.steering.hook.additive import CONTROL_VECTOR, check_additive
from valueprobe.steering.hook.handle import Specified
from valueprobe.steering.hook.spec import as_spec
from valueprobe.vocab import Site, layer_ranges

if TYPE_CHECKING:
    from valueprobe.model.load import LoadedModel

__all__ = [
    "FORMATS",
    "ControlVector",
    "Format",
    "check_fits",
    "check_format",
    "control_vector",
    "import_axis",
    "model_type",
    "read_control_vector",
    "write_control_vector",
]

Format = Literal["repeng", "gguf-control-vector", "steering-vectors"]
ARCH = "controlvector"  # general.architecture of every control-vector GGUF


@dataclass(frozen=True)
class ControlVector:
    """One vector per decoder block, added to that block's output (``resid_post[block]``).

    ``model_hint`` is the model's ``config.model_type`` (what repeng and llama.cpp record).
    """

    vectors: dict[int, Float[Tensor, " d_model"]]  # block index -> float32 vector, in full strength
    model_hint: str

    @property
    def d_model(self) -> int:
        return int(next(iter(self.vectors.values())).shape[0])

    @property
    def layers(self) -> list[int]:
        return sorted(self.vectors)


def model_type(lm: LoadedModel) -> str:
    """The architecture name control-vector files record: the model's ``config.model_type``."""
    return str(getattr(lm.model.config, "model_type", "") or "unknown")


def control_vector(lm: LoadedModel, spec: Specified, *, alpha: float = 1.0) -> ControlVector:
    """The vectors ``vp.steer(lm, spec, alpha)`` adds, keyed by the block whose output receives
    each one (see the module doc for ``resid_pre``).

    Args:
        lm: the model (width, depth and ``config.model_type``).
        spec: what to steer (`valueprobe.steering.hook.spec.SteeringSpec`; an axis: its best layer
            and own site): the ``add`` operator, on every position, as the other tools add.
        alpha: the strength baked into the file, in the spec's unit
            (`valueprobe.probe.axis.ValueAxis.unit_size`).

    >>> control_vector(lm, SteeringSpec(axis, layers="10:20")).layers
    [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    """
    if not math.isfinite(alpha):
        raise ValueprobeError(f"--alpha {alpha} must be a finite number")
    spec = as_spec(spec)
    check_additive(spec, CONTROL_VECTOR)
    # The same resolution steering uses, so the file holds exactly what vp.steer adds.
    vectors: dict[int, Tensor] = {}
    strength = torch.tensor(alpha, dtype=torch.float32)  # α as the hooks route holds it
    for target in spec.points(lm):
        block = target.point.layer - (1 if target.point.site == Site.resid_pre else 0)
        if block < 0:
            raise ValueprobeError(
                "resid_pre of layer 0 is the embedding output, which repeng, llama.cpp and "
                "steering-vectors cannot steer: export resid_post or a later layer (--layers, --site)"
            )
        vectors[block] = addition(strength, target.unit_size, target.direction.float())
    return ControlVector(vectors=vectors, model_hint=model_type(lm))


def _write_gguf(cv: ControlVector, path: Path) -> None:
    # The calls and their order are repeng's ControlVector.export_gguf (repeng 0.4.0).
    writer = gguf.GGUFWriter(path, ARCH)
    writer.add_string(f"{ARCH}.model_hint", cv.model_hint)
    writer.add_uint32(f"{ARCH}.layer_count", len(cv.vectors))
    for block in cv.layers:
        writer.add_tensor(f"direction.{block}", cv.vectors[block].numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _write_llama_cpp(cv: ControlVector, path: Path) -> None:
    if 0 in cv.vectors:
        raise ValueprobeError(
            "llama.cpp never steers block 0's output (it rejects direction.0): "
            "export a later layer, or use --to repeng"
        )
    _write_gguf(cv, path)


def _write_steering_vectors(cv: ControlVector, path: Path) -> None:
    tensors = {str(block): cv.vectors[block].float().contiguous() for block in cv.layers}
    meta = {"format": "steering-vectors", "layer_type": "decoder_block", "model_hint": cv.model_hint}
    save_file(tensors, str(path), metadata=meta)


# format -> (writer, file suffix)
FORMATS: dict[str, tuple[Callable[[ControlVector, Path], None], str]] = {
    "repeng": (_write_gguf, ".gguf"),
    "gguf-control-vector": (_write_llama_cpp, ".gguf"),
    "steering-vectors": (_write_steering_vectors, ".safetensors"),
}


def check_format(to: str) -> str:
    """The format name, or one clear line naming the ones there are."""
    if to not in FORMATS:
        raise ValueprobeError(f"unknown format {to!r} (--to): use one of {', '.join(FORMATS)}")
    return to


def write_control_vector(cv: ControlVector, path: str | Path, *, to: Format | str) -> Path:
    """Write ``cv`` as ``to`` reads it (atomically). The GGUF formats refuse what their reader would."""
    writer, _ = FORMATS[check_format(to)]
    path = Path(path)
    return atomic_write(path, lambda tmp: writer(cv, tmp))


def _field_text(reader: gguf.GGUFReader, key: str) -> str | None:
    field = reader.get_field(key)
    if field is None or not len(field.parts):
        return None
    return bytes(field.parts[-1]).decode("utf-8", errors="replace")


def read_control_vector(path: str | Path) -> ControlVector:
    """Read a GGUF control vector (repeng's or llama.cpp's ``cvector-generator``'s).

    Refuses, in one line, a file that is not a control vector or whose tensors llama.cpp would
    refuse (a name other than ``direction.{i}``, not 1-D F32, unequal widths).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueprobeError(f"{path} does not exist: give a control-vector .gguf file")
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise ValueprobeError(f"{path} is not a readable GGUF file ({exc})") from None
    arch = _field_text(reader, "general.architecture")
    if arch != ARCH:
        raise ValueprobeError(
            f"{path} is not a control vector: its general.architecture is {arch!r}, not {ARCH!r}"
        )
    vectors: dict[int, Tensor] = {}
    for tensor in reader.tensors:
        name = tensor.name
        index = name.removeprefix("direction.")
        if not (name.startswith("direction.") and index.isdigit()):
            raise ValueprobeError(f"{path}: tensor {name!r} is not a direction.{{layer}} tensor")
        if tensor.tensor_type != gguf.GGMLQuantizationType.F32 or len(tensor.shape) != 1:
            raise ValueprobeError(f"{path}: tensor {name} is not a 1-D F32 vector")
        vector = torch.from_numpy(np.array(tensor.data, dtype=np.float32))
        # llama.cpp sums duplicate directions of one layer; so do we
        vectors[int(index)] = vectors.get(int(index), torch.zeros_like(vector)) + vector
    if not vectors:
        raise ValueprobeError(f"{path} holds no direction tensors")
    if len({v.shape[0] for v in vectors.values()}) > 1:
        raise ValueprobeError(f"{path}: its direction tensors have different widths")
    hint = _field_text(reader, f"{ARCH}.model_hint") or "unknown"
    return ControlVector(vectors=vectors, model_hint=hint)


def check_fits(cv: ControlVector, lm: LoadedModel, *, force: bool = False, source: str = "") -> None:
    """Refuse, in one line, a control vector made for another width, depth or (unless ``force``) architecture."""
    what = f"control vector {source}".strip()
    if cv.d_model != lm.d_model:
        raise ValueprobeError(
            f"{what} has width {cv.d_model} but {lm.model_id} has d_model {lm.d_model}:"
            " use a vector made for this model"
        )
    if max(cv.layers) >= lm.n_layers:
        raise ValueprobeError(
            f"{what} steers block {max(cv.layers)} but {lm.model_id} has blocks 0..{lm.n_layers - 1}"
        )
    if not force and cv.model_hint != model_type(lm):
        raise ValueprobeError(
            f"{what} is for architecture {cv.model_hint!r} but {lm.model_id} is {model_type(lm)!r}:"
            " use a vector made for this model (--force reads it anyway)"
        )


def import_axis(lm: LoadedModel, cv: ControlVector, *, force: bool = False, source: str = "") -> ValueAxis:
    """A `ValueAxis` at ``resid_post`` of the file's blocks: unit directions, μ/σ uncalibrated.

    The best layer is the block with the largest vector (the first on ties). ``scale`` is the
    vectors' norm when they share one (raw α = s then adds the file at strength s), else 1; the
    norms stay in ``metrics["control_vector"]["norms"]``.
    """
    check_fits(cv, lm, force=force, source=source)
    layers = cv.layers
    stacked = torch.stack([cv.vectors[layer].float() for layer in layers])
    norms = stacked.norm(dim=1)
    if bool((norms == 0).any()):
        zero = [layer for layer, n in zip(layers, norms.tolist(), strict=True) if n == 0]
        raise ValueprobeError(f"control vector {source}: block {zero[0]} has a zero vector, no direction")
    shared = bool(torch.allclose(norms, norms[0], rtol=1e-5, atol=0))
    nan = torch.full((len(layers),), float("nan"))
    return ValueAxis(
        directions=stacked / norms[:, None],
        layers=tuple(layers),
        mu=nan,
        sigma=nan.clone(),
        mean_norm=nan.clone(),
        best_layer=layers[int(torch.argmax(norms))],
        site=Site.resid_post,
        method=f"control vector ({cv.model_hint})",
        model_id=lm.model_id,
        fingerprint=lm.fingerprint,
        d_model=lm.d_model,
        scale=float(norms[0]) if shared else 1.0,
        sigma_reference=SigmaReference(f"uncalibrated (imported control vector): run {CALIBRATE}"),
        metrics={
            "control_vector": {
                "source": source,
                "model_hint": cv.model_hint,
                "layers": layer_ranges(layers),
                "norms": {str(layer): float(n) for layer, n in zip(layers, norms.tolist(), strict=True)},
            }
        },
    )
