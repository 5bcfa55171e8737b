"""Parameter checks every command runs before it loads a model or reads data.

    >>> check_at_least("--splits", 0, 1)
    Traceback (most recent call last):
    valueprobe.errors.ValueprobeError: --splits 0 is too small: it must be >= 1

Output paths are checked by :func:`valueprobe.files.check_output_dir` / ``check_output_file``.
"""

from __future__ import annotations

from valueprobe.errors import ValueprobeError
from valueprobe.vocab import parse_layers

__all__ = ["check_at_least", "check_layer_spec"]


def check_at_least(option: str, value: float | None, minimum: float, why: str = "") -> None:
    """Refuse a numeric option below its minimum (``--splits 0`` once gave a probe full of NaN).

    Args:
        option: the option as typed, e.g. ``"--splits"``.
        value: its value; None (not given) passes.
        minimum: the smallest value that makes sense.
        why: appended to the message, e.g. ``" (a split needs a train, a validation and a test rule)"``.
    """
    if value is not None and value < minimum:
        raise ValueprobeError(f"{option} {value} is too small: it must be >= {minimum}{why}")


def check_layer_spec(option: str, spec: str | None) -> None:
    """Refuse a malformed layer spec before the model loads (its range is checked against the model later)."""
    if spec is not None:
        try:
            parse_layers(spec, n_layers=1 << 20)
        except ValueprobeError:
            raise ValueprobeError(
                f"{option} {spec!r} is not a layer spec: use 'all', '0:10', '-1' or '3,5,-2'"
            ) from None
