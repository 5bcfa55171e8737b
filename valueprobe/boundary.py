"""The command line's error boundary: an exception becomes an exit status and one line.

    >>> describe_error(ValueprobeError("--splits 0 is too small: it must be >= 1"))
    (2, '--splits 0 is too small: it must be >= 1')

Exit status: 2 bad input (:class:`ValueprobeError`, a file that cannot be read or written, corrupt
JSON or safetensors), 130 interrupted, 1 internal error (its traceback goes to a log file, see
:func:`write_traceback`; ``VALUEPROBE_LOG_DIR`` chooses the folder). Library warnings go through
``logging.getLogger("valueprobe")`` and print as one ``warning: ...`` line each.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from safetensors import SafetensorError

from valueprobe.errors import ValueprobeError

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "describe_error",
    "log_warnings_as_lines",
    "one_line",
    "write_traceback",
]

EXIT_INTERNAL, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 1, 2, 130


def describe_error(exc: BaseException) -> tuple[int, str]:
    """(exit status, one line) for an exception reaching the CLI boundary."""
    if isinstance(exc, ValueprobeError):
        return EXIT_BAD_INPUT, one_line(str(exc))
    if isinstance(exc, SafetensorError):
        return (
            EXIT_BAD_INPUT,
            f"unreadable safetensors file ({one_line(str(exc))}): it is truncated or corrupt; write it again",
        )
    if isinstance(exc, json.JSONDecodeError):
        return (
            EXIT_BAD_INPUT,
            f"invalid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}): fix or rewrite the file",
        )
    if isinstance(exc, OSError):
        if exc.errno == errno.ENOSPC:
            return EXIT_BAD_INPUT, "no space left on device: free space and rerun"
        where = f"{exc.filename}: " if exc.filename else ""
        what = exc.strerror or one_line(str(exc)) or type(exc).__name__
        return EXIT_BAD_INPUT, f"{where}{what}; check the path, its permissions and the network"
    return EXIT_INTERNAL, f"internal error ({type(exc).__name__}: {one_line(str(exc))[:300]})"


def one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""


def write_traceback(exc: BaseException) -> Path:
    """Save the traceback of an internal error; the CLI prints only its path."""
    folder = Path(os.environ.get("VALUEPROBE_LOG_DIR") or Path(tempfile.gettempdir()) / "valueprobe-logs")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    path.write_text(
        "valueprobe " + " ".join(sys.argv[1:]) + "\n\n" + "".join(traceback.format_exception(exc))
    )
    return path


def log_warnings_as_lines() -> None:
    """Library warnings (``logging.getLogger("valueprobe")``) print as one ``warning: ...`` line each."""
    log = logging.getLogger("valueprobe")
    if not any(isinstance(h, _StderrLines) for h in log.handlers):
        log.addHandler(_StderrLines())
        log.propagate = False


class _StderrLines(logging.Handler):
    """``warning: <message>`` on whatever ``sys.stderr`` is now (not the one seen at set-up)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"{record.levelname.lower()}: {record.getMessage()}", file=sys.stderr)
