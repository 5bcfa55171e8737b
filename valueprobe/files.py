"""Atomic writes and file hashes: every file valueprobe writes goes through :func:`atomic_write`.

    >>> atomic_write(Path("probes/x/axis.safetensors"), lambda tmp: save_file(tensors, str(tmp)))

The content goes to ``NAME.tmp`` beside the target, is flushed to disk, then renamed over the
target, so a reader (or a resumed run after kill -9) sees the old file or the new one, never half
of one. A failed write removes its temporary file and raises one ValueprobeError line.

Commands check where they will write before any work (``check_output_dir``, ``check_output_file``),
so a bad ``--out`` costs a second, not the run::

    >>> check_output_dir(Path("probes/my-axis"), holds="probe")   # before loading a model
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from valueprobe.errors import ValueprobeError

__all__ = [
    "ARTIFACTS",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_output_dir",
    "check_output_file",
    "sha256_file",
]

# What each artifact folder is recognised by: a folder holding one artifact's marker file is never
# reused for another (a probe written into a store folder would look like neither).
ARTIFACTS: dict[str, str] = {
    "store": "manifest.json",
    "probe": "probe.json",
    "scores": "scores.csv",
    "shift": "shift.json",
}


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp)`` to produce the content, then rename ``tmp`` over ``path``.

    Raises:
        ValueprobeError: the folder is not writable or the disk is full (the target is untouched).
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        # Writers that go through a temp file create it 0600; the artifact gets the mode a plain
        # open() would give it (0644 under the usual umask), like the JSON beside it.
        os.chmod(tmp, 0o666 & ~_umask())
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


def _umask() -> int:
    mask = os.umask(0o022)  # the only portable way to read the umask is to set it and restore it
    os.umask(mask)
    return mask


def _check_creatable(path: Path, option: str) -> None:
    """``path`` does not exist yet: its nearest existing ancestor must be a writable folder."""
    parent = path.parent
    while not parent.exists():
        if parent == parent.parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        raise ValueprobeError(f"{option} {path}: {parent} is a file, not a folder; choose another {option}")
    _check_writable(parent, f"{option} {path}: cannot create it in {parent}", option)


def _check_writable(folder: Path, what: str, option: str) -> None:
    """Create and remove a scratch file: the one check that also holds for root, read-only mounts and quotas."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".valueprobe-check-")
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise ValueprobeError(f"{what} ({exc.strerror or exc}); choose another {option}") from None


def check_output_dir(path: str | Path, *, holds: str, option: str = "--out") -> Path:
    """Fail now, before any work, if ``path`` cannot become the ``holds`` artifact folder.

    The folder may not exist yet (then its nearest existing parent must be writable); if it
    exists it must be a writable folder that does not already hold a different artifact
    (:data:`ARTIFACTS`). Nothing is created.

    Args:
        path: the output folder.
        holds: what the command writes there: a key of :data:`ARTIFACTS` or another short name.
        option: the command-line option named in the error.

    >>> check_output_dir("runs/icrl", holds="store")
    PosixPath('runs/icrl')
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueprobeError(f"{option} {path} is a file, not a folder; choose a folder path for {option}")
    if not path.exists():
        _check_creatable(path, option)
        return path
    _check_writable(path, f"{option} {path}: cannot write in this folder", option)
    for kind, marker in ARTIFACTS.items():
        if kind != holds and (path / marker).exists():
            raise ValueprobeError(
                f"{option} {path} already holds a {kind} ({marker}); choose another {option} for the {holds}"
            )
    return path


def check_output_file(path: str | Path, *, option: str = "--out") -> Path:
    """Fail now, before any work, if the file ``path`` cannot be written (a folder, or no write access)."""
    path = Path(path)
    if path.is_dir():
        raise ValueprobeError(f"{option} {path} is a folder; give a file path for {option}")
    if path.exists():
        _check_writable(path.parent, f"{option} {path}: cannot replace it", option)
        return path
    _check_creatable(path, option)
    return path
