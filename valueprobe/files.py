"""Atomic writes, file hashes and the JSON edge: every file valueprobe writes goes through :func:`atomic_write`.

    >>> atomic_write(Path("probes/x/axis.safetensors"), lambda tmp: save_file(tensors, str(tmp)))

The content goes to ``NAME.tmp`` beside the target, is flushed to disk, then renamed over the
target, so a reader (or a resumed run after kill -9) sees the old file or the new one, never half
of one. A failed write removes its temporary file and raises one ValueprobeError line.
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from valueprobe.errors import ValueprobeError

__all__ = ["atomic_write", "atomic_write_bytes", "atomic_write_text", "sha256_file"]


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp)`` to produce the content, then rename ``tmp`` over ``path``.

    Raises:
        ValueprobeError: the folder is not writable or the disk is full (the target is untouched).
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno == errno.ENOSPC:
            raise ValueprobeError(f"no space left on device writing {path}: free space and rerun") from None
        raise ValueprobeError(
            f"{path}: cannot write ({exc.strerror or exc}); choose a writable location"
        ) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def sha256_file(path: str | Path) -> str:
    """The sha256 hex digest of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def jsonable(obj: object) -> object:
    """JSON-safe copy: tuples to lists, numpy scalars to Python, NaN/inf to None (strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (np.integer, np.bool_)):
        return obj.item()
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    return obj
