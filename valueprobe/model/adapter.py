"""LoRA adapter folders written by ``valueprobe tune``: recognise one, read its record, merge it.

    >>> lm = vp.load("runs/tune/dolphin")   # `load` sees the adapter, loads its base, merges it

The loader knows adapter folders through this module alone, so `valueprobe.model` never imports
the training code above it (``tune/`` writes these folders; ``model/`` only reads them).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from valueprobe.errors import ValueprobeError
from valueprobe.records import Record

__all__ = [
    "TUNE_FILE",
    "TunedBase",
    "ignore_old_checkpointing_reads",
    "is_adapter_dir",
    "merge_adapter",
    "read_tune_record",
]

TUNE_FILE = "valueprobe-tune.json"


def is_adapter_dir(path: Path) -> bool:
    """A folder written by ``valueprobe tune`` with a LoRA adapter (no full config.json)."""
    return (path / TUNE_FILE).exists() and (path / "adapter_config.json").exists()


@dataclass(frozen=True)
class TunedBase(Record):
    """The model a checkpoint was tuned from (``base`` in ``valueprobe-tune.json``): how to load it
    again, and its shape. `valueprobe.tune.train.TuneRecord` holds it; loading an adapter reads it."""

    spec: str
    fingerprint: str
    model_type: str | None
    d_model: int
    n_layers: int
    vocab_size: int


def read_tune_record(path: Path) -> tuple[TunedBase, dict[str, Any]]:
    """The adapter's base, and its whole ``valueprobe-tune.json``; one clear error when it is
    unreadable or its base is not a `TunedBase`."""
    try:
        record = json.loads((path / TUNE_FILE).read_text())
        base = TunedBase.from_dict(record["base"])
    except (OSError, ValueError, KeyError, TypeError, ValueprobeError) as exc:
        raise ValueprobeError(f"{path / TUNE_FILE} is unreadable ({exc}); retrain or restore it") from None
    return base, record


@contextmanager
def ignore_old_checkpointing_reads() -> Iterator[None]:
    """Silence the one FutureWarning valueprobe cannot fix by renaming: peft's ``PeftModel`` (0.21)
    and TRL's DPO reference pass (1.16) read ``model.is_gradient_checkpointing`` themselves, a
    property transformers 5 renamed ``is_activation_checkpointing``. Every other warning,
    FutureWarnings included, still shows (tests/test_tune.py turns them into errors)."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
        )
        yield


def merge_adapter(base: nn.Module, path: Path) -> nn.Module:
    """``base`` with the LoRA adapter in ``path`` merged into its weights."""
    from peft import PeftModel  # optional heavy dependency: only adapter checkpoints need it

    with ignore_old_checkpointing_reads():
        return PeftModel.from_pretrained(base, str(path)).merge_and_unload()
