"""The shipped axes by name: one registry, read from the index file inside the package.

    >>> import valueprobe as vp
    >>> axis = vp.ValueAxis.load("smollm2-135m-value")      # from any folder, after pip install
    >>> sorted(shipped_axes())
    ['smollm2-135m-reward-history', 'smollm2-135m-value']

On the command line every ``--probe`` takes a name or a folder::

    valueprobe score --probe smollm2-135m-reward-history --data code --out runs/score-code

``axes/index.json`` beside this module lists each name with its model and its source in the
repository (``probes/NAME``, where the results live); ``axes/NAME/`` holds a byte-for-byte copy of
that folder's ``axis.safetensors`` and ``probe.json``, and ``tests/test_registry.py`` fails when the
two drift apart. A path still works; a name that is also a folder in the current directory is
refused in one line (``valueprobe.files.resolve_shipped``).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

from valueprobe.errors import ValueprobeError
from valueprobe.files import resolve_shipped

__all__ = ["AXES_DIR", "ShippedAxis", "portable_name", "probe_path", "resolve_axis_name", "shipped_axes"]

AXES_DIR = Path(__file__).resolve().parent / "axes"
INDEX_FORMAT = "valueprobe.probe.registry"
INDEX_FORMAT_VERSION = 1


@dataclass(frozen=True)
class ShippedAxis:
    """One entry of the registry: a name, the model it was fitted on, where it came from."""

    name: str
    model: str
    source: str  # its folder in the repository, e.g. probes/smollm2-135m-value
    about: str

    @property
    def path(self) -> Path:
        """The installed copy: a probe folder (``axis.safetensors`` + ``probe.json``)."""
        return AXES_DIR / self.name


@functools.cache
def shipped_axes() -> dict[str, ShippedAxis]:
    """Every shipped axis by name, in the index's order."""
    raw = json.loads((AXES_DIR / "index.json").read_text(encoding="utf-8"))
    if raw.get("format") != INDEX_FORMAT or int(raw.get("format_version", 0)) > INDEX_FORMAT_VERSION:
        raise ValueprobeError(
            f"{AXES_DIR / 'index.json'}: not a registry this valueprobe reads; reinstall it"
        )
    return {name: ShippedAxis(name=name, **entry) for name, entry in raw["axes"].items()}


def resolve_axis_name(spec: str | os.PathLike[str]) -> Path:
    """``spec`` as a path: a shipped axis's folder when it is a name, else ``spec`` itself (unchecked)."""
    return resolve_shipped(spec, {name: a.path for name, a in shipped_axes().items()}, what="axis")


def portable_name(folder: str | os.PathLike[str]) -> str:
    """How a file should name the probe in ``folder``: a shipped axis's installed folder by its name
    (it moves with each install), any other folder as written.

    >>> portable_name(shipped_axes()["smollm2-135m-value"].path)
    'smollm2-135m-value'
    """
    try:
        here = Path(folder).resolve()
    except (OSError, ValueError):  # not a path this system can hold (a NUL byte, too long): as written
        return str(folder)
    for name, axis in shipped_axes().items():
        if axis.path.resolve() == here:
            return name
    return str(folder)


def probe_path(spec: str | os.PathLike[str]) -> Path:
    """The probe folder ``spec`` names: a shipped axis by name, or a path (a ``Path`` is always a path).

    Raises:
        ValueprobeError: ``spec`` is neither a shipped name nor an existing path (the line lists
            the names), or it is a name and also a folder here (the line names both).
    """
    path = resolve_axis_name(spec)
    if not path.exists():
        raise ValueprobeError(
            f"{spec} is not a probe folder nor a shipped axis (shipped: {', '.join(shipped_axes())});"
            " give one of those names or the path of a folder with probe.json and axis.safetensors"
        )
    return path
