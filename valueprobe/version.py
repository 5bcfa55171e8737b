"""valueprobe's version: written here once, read by the build (pyproject ``dynamic``), ``valueprobe
--version`` and every artifact it writes (``valueprobe_version`` in probe.json and store manifests).

    >>> from valueprobe.version import __version__
    valueprobe --version

Bump it in this line and add the release's section to CHANGELOG.md.
"""

from __future__ import annotations

__version__ = "0.1.0"
