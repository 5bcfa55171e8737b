"""The CLI's one error boundary: every failure of a command ends in one line on stderr.

``valueprobe.cli.main.main`` runs the typer app through :func:`run_app`; the exit status says what went wrong::

    0 done · 2 bad input (ValueprobeError, unreadable/corrupt files, usage) · 130 interrupted · 1 internal

An internal error's traceback goes to a log file named in the line, never to the terminal.
Also here: :func:`check_at_least`, the check numeric options get before any work (a ``--layers``
spec is parsed as typer reads it, by ``valueprobe.vocab.LayerSelection.parse``).
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
from typing import NoReturn

import typer
from safetensors import SafetensorError
from typer._click.exceptions import NoArgsIsHelpError  # typer vendors click; no public name for it

from valueprobe.errors import ValueprobeError

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "check_at_least",
    "describe_error",
    "run_app",
]


def run_app(app: typer.Typer, argv: list[str] | None = None) -> None:
    """Entry point and the one error boundary: every failure ends in one line on stderr.

    Exit status: 0 done; 2 bad input (ValueprobeError, a file that cannot be read or written,
    corrupt JSON or safetensors, a usage error); 130 interrupted (Ctrl-C); 1 an internal error,
    whose traceback goes to a log file named in the line.
    """
    # The command runs under our own context, not typer's standalone wrapper: that one turns
    # Ctrl-C into a *returned* 130 (easy to lose, and lost before), and usage errors into boxes.
    command = typer.main.get_command(app)
    args = list(sys.argv[1:] if argv is None else argv)
    log_warnings_as_lines()
    try:
        with command.make_context("valueprobe", args) as ctx:
            command.invoke(ctx)
    except KeyboardInterrupt:
        fail(EXIT_INTERRUPTED, "interrupted; finished files are kept (rerun the same command to resume)")
    except typer.Exit as exc:  # --help and friends
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        fail(EXIT_INTERRUPTED, "aborted")
    except NoArgsIsHelpError as exc:
        # bare `valueprobe` / `valueprobe datasets`: the help, as click prints it
        print(exc.ctx.get_help() if exc.ctx else exc.format_message(), file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None
    except typer.TyperException as exc:  # unknown command, missing or bad option
        fail(EXIT_BAD_INPUT, f"{exc.format_message()} (see valueprobe --help)")
    except Exception as exc:  # noqa: BLE001 -- the boundary: everything becomes one line
        code, line = describe_error(exc)
        if code == EXIT_INTERNAL:
            line += f"; the traceback is in {write_traceback(exc)}: please report it"
        fail(code, line)


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
    if type(exc).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError (torch loads lazily)
        return (
            EXIT_BAD_INPUT,
            "out of device memory: rerun with a smaller --batch-size (half the one used) or fewer --max-new-tokens",
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


def fail(code: int, line: str) -> NoReturn:
    print(f"error: {line}", file=sys.stderr)
    raise SystemExit(code)


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
    """``warning: <message>`` on whatever ``sys.stderr`` is now, not the one seen at set-up
    (a second ``main()`` in one process, as in tests, would otherwise write to a closed stream)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"{record.levelname.lower()}: {record.getMessage()}", file=sys.stderr)


def check_at_least(option: str, value: int | float | None, minimum: int | float, why: str = "") -> None:
    """A numeric option below its minimum is refused before any work (``--splits 0`` gave a NaN probe)."""
    if value is not None and value < minimum:
        raise ValueprobeError(f"{option} {value} is too small: it must be >= {minimum}{why}")
