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
from pathlib import Path
from typing import Any

from torch import nn

from valueprobe.errors import ValueprobeError

__all__ = [
    "TUNE_FILE",
    "ignore_old_checkpointing_reads",
    "is_adapter_dir",
    "merge_adapter",
    "read_tune_record",
]

TUNE_FILE = "valueprobe-tune.json"


def is_adapter_dir(path: Path) -> bool:
    """A folder written by ``valueprobe tune`` with a LoRA adapter (no full config.json)."""
    return (path / TUNE_FILE).exists() and (path / "adapter_config.json").exists()


def read_tune_record(path: Path) -> dict[str, Any]:
    """The adapter's ``valueprobe-tune.json``; one clear error when it is unreadable or has no base."""
    try:
        record = json.loads((path / TUNE_FILE).read_text())
        record["base"]["spec"], record["base"]["fingerprint"]  # noqa: B018 -- the keys load needs
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueprobeError(f"{path / TUNE_FILE} is unreadable ({exc}); retrain or restore it") from None
    return record


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
