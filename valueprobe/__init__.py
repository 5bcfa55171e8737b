"""valueprobe: find, read and steer the value axis of language models."""

from __future__ import annotations

__version__ = "0.1.0"
