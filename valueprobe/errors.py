"""One exception type for every user-facing failure.

The CLI catches :class:`ValueprobeError` and prints its message as one line, with a
non-zero exit, instead of a traceback. Library code raises it for bad input: the
message says what was wrong, where (file:line, layer range, ...) and how to fix it.

>>> raise ValueprobeError("layer 40 out of range: this model has layers 0..29 (or -30..-1)")
"""

from __future__ import annotations


class ValueprobeError(Exception):
    """Bad input or a state the user can fix; the message is one complete line."""
