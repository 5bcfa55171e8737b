"""The installed valueprobe version, read in this one place (``valueprobe.__version__``)."""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("valueprobe")
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0.0.0+local"
