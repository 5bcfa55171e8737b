"""Two-part model fingerprint: an architecture part that must match, a weights part that is recorded.

A probe fitted on a base model reads its fine-tuned descendants (same config shape, same
tokenizer vocabulary, other weights) with a warning, and refuses a model of another architecture::

    >>> import valueprobe as vp
    >>> lm = vp.load("smollm2-135m")
    >>> fp = Fingerprint.parse(lm.fingerprint)
    >>> fp.arch, fp.weights                     # 16 hex digits each
    >>> check_model(axis.fingerprint, lm, what="probe probes/smollm2-135m-value")

A fingerprint travels as one string, ``"<arch>-<weights>"``, in ``probe.json`` and store
manifests. Records written before the split hold one 16-digit hash (config shape + a few
weights, :func:`legacy_fingerprint`); they are still read: against a live model the old hash is
recomputed and compared as the weights part, and the architecture counts as matching when
d_model and the layer count fit (the callers check those).
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import torch

from valueprobe.errors import ValueprobeError

__all__ = [
    "Fingerprint",
    "FingerprintWarning",
    "Match",
    "arch_fingerprint",
    "check_model",
    "check_records",
    "compare",
    "fingerprint",
    "legacy_fingerprint",
    "weights_fingerprint",
]

# Config keys that fix the shape of the residual stream and the vocabulary; nothing trainable.
_CONFIG_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "n_embd",
    "num_hidden_layers",
    "n_layer",
    "num_attention_heads",
    "n_head",
    "num_key_value_heads",
    "intermediate_size",
    "n_inner",
    "tie_word_embeddings",
)
_SAMPLES_PER_TENSOR = 1024
_HEX16 = re.compile(r"[0-9a-f]{16}")


class FingerprintWarning(UserWarning):
    """A probe or store recorded on other weights of the same architecture (e.g. a fine-tune)."""


class Match(StrEnum):
    """How two fingerprints relate."""

    same = "same"  # same architecture, same weights
    weights = "weights"  # same architecture, other weights: warn and proceed
    arch = "arch"  # another architecture or vocabulary: refuse
    unknown = "unknown"  # a legacy record against a new one: the weights cannot be compared


@dataclass(frozen=True)
class Fingerprint:
    """A parsed fingerprint. ``arch`` is None for a legacy single-hash record."""

    arch: str | None  # 16 hex: config shape keys + tokenizer vocabulary
    weights: str  # 16 hex: bf16 samples of every parameter (legacy: the old single hash)

    @property
    def legacy(self) -> bool:
        return self.arch is None

    def __str__(self) -> str:
        return self.weights if self.arch is None else f"{self.arch}-{self.weights}"

    @classmethod
    def parse(cls, text: str) -> Fingerprint:
        """Read ``"<arch>-<weights>"`` or a legacy 16-digit hash."""
        parts = str(text).strip().lower().split("-")
        if len(parts) == 1 and _HEX16.fullmatch(parts[0]):
            return cls(arch=None, weights=parts[0])
        if len(parts) == 2 and all(_HEX16.fullmatch(p) for p in parts):
            return cls(arch=parts[0], weights=parts[1])
        raise ValueprobeError(
            f"unreadable model fingerprint {text!r}: expected '<arch>-<weights>' (16 hex digits each)"
            " or a 16-digit legacy hash; refit the probe or recapture the store"
        )


def _config_shape(model: Any) -> dict:
    config = getattr(model, "config", None)
    return {k: getattr(config, k) for k in _CONFIG_KEYS if config is not None and hasattr(config, k)}


def arch_fingerprint(model: Any, tokenizer: Any) -> str:
    """16 hex digits over the config's shape keys and the tokenizer's vocabulary (token → id)."""
    h = hashlib.sha256(json.dumps(_config_shape(model), sort_keys=True, default=str).encode())
    vocab = tokenizer.get_vocab() if tokenizer is not None else {}
    h.update(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode())
    return h.hexdigest()[:16]


def _bf16_bytes(t: torch.Tensor) -> bytes:
    # bf16 so that one checkpoint loaded in fp32 or bf16, on CPU or GPU, hashes alike.
    return t.detach().to("cpu", torch.bfloat16).view(torch.int16).numpy().tobytes()


def _weights(model: Any) -> list[torch.Tensor]:
    """Every parameter's values in ``named_parameters`` order. A block that accelerate offloaded
    (``device_map`` with ``"disk"``, or CPU offload) holds meta tensors; its values are in its hook's
    ``weights_map``, keyed by the name under the hooked module."""
    maps = {
        name: hook.weights_map
        for name, module in model.named_modules()
        if (hook := getattr(module, "_hf_hook", None)) is not None
        and getattr(hook, "weights_map", None) is not None
    }
    out = []
    for full, p in model.named_parameters():
        if p.device.type == "meta":
            owner = max((m for m in maps if full.startswith(f"{m}.")), key=len, default=None)
            if owner is None:
                raise ValueprobeError(
                    f"cannot fingerprint parameter {full}: it is on no device and no offload map"
                )
            p = maps[owner][full[len(owner) + 1 :]]
        out.append(p)
    return out


def weights_fingerprint(model: Any) -> str:
    """16 hex digits over up to 1024 evenly strided values of every parameter, cast to bf16.

    Sampling every tensor (not a few) is what makes a LoRA merge or a short fine-tune show:
    the update touches the attention and MLP matrices, not the embeddings or norms.
    """
    params = _weights(model)
    if not params:
        raise ValueprobeError("cannot fingerprint a model without parameters")
    h = hashlib.sha256()
    for p in params:
        flat = p.detach().reshape(-1)
        step = max(1, flat.numel() // _SAMPLES_PER_TENSOR)
        h.update(_bf16_bytes(flat[::step][:_SAMPLES_PER_TENSOR]))
    return h.hexdigest()[:16]


def fingerprint(model: Any, tokenizer: Any) -> str:
    """The two-part fingerprint string ``"<arch>-<weights>"`` of a model and its tokenizer."""
    return str(Fingerprint(arch=arch_fingerprint(model, tokenizer), weights=weights_fingerprint(model)))


def legacy_fingerprint(model: Any) -> str:
    """The single hash valueprobe recorded before the two-part split (config shape + 3 tensors).

    Kept only to compare records written then (e.g. the shipped probes) with a live model.
    """
    h = hashlib.sha256(json.dumps(_config_shape(model), sort_keys=True, default=str).encode())
    params = _weights(model)
    if not params:
        raise ValueprobeError("cannot fingerprint a model without parameters")
    picks = [model.get_input_embeddings().weight] if hasattr(model, "get_input_embeddings") else []
    picks += [params[len(params) // 2], params[-1]]
    for p in picks:
        flat = p.detach().reshape(-1)
        h.update(_bf16_bytes(torch.cat([flat[:2048], flat[-2048:]])))
    return h.hexdigest()[:16]


def compare(a: str, b: str) -> Match:
    """Relate two recorded fingerprints (probe, store manifest)."""
    fa, fb = Fingerprint.parse(a), Fingerprint.parse(b)
    if fa.legacy != fb.legacy:
        return Match.unknown
    if fa.arch != fb.arch:
        return Match.arch
    return Match.same if fa.weights == fb.weights else Match.weights


class _Model(Protocol):  # valueprobe.model.load.LoadedModel
    model_id: str
    fingerprint: str

    @property
    def legacy_fingerprint(self) -> str: ...


def _model_match(recorded: str, lm: _Model) -> Match:
    rec = Fingerprint.parse(recorded)
    if rec.legacy:  # the architecture cannot be read from it; callers check d_model and layers
        return Match.same if rec.weights == lm.legacy_fingerprint else Match.weights
    return compare(recorded, lm.fingerprint)


def check_model(recorded: str, lm: _Model, *, what: str, model_id: str = "", force: bool = False) -> Match:
    """Refuse ``lm`` if its architecture differs from ``recorded``; warn if only its weights do.

    Args:
        recorded: the fingerprint a probe or store recorded.
        lm: the model about to be read.
        what: names the record in messages, e.g. ``"probe probes/x"``.
        model_id: the model the record was made on, for the message.
        force: proceed (with a warning) even when the architecture differs.
    """
    match = _model_match(recorded, lm)
    source = f"{what} of {model_id or 'unknown model'} (fingerprint {recorded})"
    if match == Match.arch and not force:
        raise ValueprobeError(
            f"{source} was made on another architecture or vocabulary than {lm.model_id}"
            f" (fingerprint {lm.fingerprint}); use a probe fitted on this model, or pass --force to read it anyway"
        )
    if match == Match.arch:
        warnings.warn(
            f"{source} was made on another architecture or vocabulary than {lm.model_id}"
            f" (fingerprint {lm.fingerprint}); reading it anyway because --force was given",
            FingerprintWarning,
            stacklevel=3,
        )
    elif match != Match.same:
        warnings.warn(
            f"{source} was made on other weights than {lm.model_id} (fingerprint {lm.fingerprint}); reading it as"
            " a descendant (e.g. a fine-tune) of that model",
            FingerprintWarning,
            stacklevel=3,
        )
    return match


def check_records(a: str, b: str, *, what: str, force: bool = False) -> Match:
    """Refuse two records of different architectures; warn when their weights differ or cannot be compared.

    Args:
        a, b: the two recorded fingerprints.
        what: a phrase naming both records, e.g. ``"store runs/x and axis probes/y"``.
        force: proceed (with a warning) even when the architecture differs.
    """
    match = compare(a, b)
    if match == Match.arch and not force:
        raise ValueprobeError(
            f"{what} come from different architectures (fingerprints {a} vs {b}); use records of one model"
        )
    if match != Match.same:
        why = "other weights" if match == Match.weights else "fingerprints of two formats"
        warnings.warn(
            f"{what} carry {why} (fingerprints {a} vs {b}); proceeding as one architecture",
            FingerprintWarning,
            stacklevel=3,
        )
    return match
