"""Atomic writes, file hashes and the JSON edge: every file valueprobe writes goes through :func:`atomic_write`.

    >>> atomic_write(Path("probes/x/axis.safetensors"), lambda tmp: save_file(tensors, str(tmp)))

The content goes to ``NAME.tmp`` beside the target, is flushed to disk, then renamed over the
target, so a reader (or a resumed run after kill -9) sees the old file or the new one, never half
of one. A failed write removes its temporary file and raises one ValueprobeError line.

Commands check where they will write before any work (``check_output_dir``, ``check_output_file``),
so a bad ``--out`` costs a second, not the run::

    >>> check_output_dir(Path("probes/my-axis"), holds="probe")   # before loading a model

A run made of stages (the demo, the audit) keeps each stage's result as one JSON file keyed by the
stage's inputs (`StageCache`): a rerun reuses it, an interrupted run resumes after the last one::

    >>> StageCache(Path("runs/demo/stages")).run("fit", {"splits": 5}, lambda: fit(...).to_dict())
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from rich.console import Console

from valueprobe.errors import ValueprobeError
from valueprobe.records import from_jsonable, record_from_dict
from valueprobe.version import __version__

__all__ = [
    "ARTIFACTS",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_dir",
    "atomic_write_text",
    "check_output_dir",
    "check_output_file",
    "from_jsonable",
    "jsonable",
    "markdown_table",
    "mmap_safetensors",
    "read_safetensors_header",
    "record_from_dict",
    "resolve_shipped",
    "sha256_file",
    "StageCache",
    "stage_key",
    "write_html",
    "write_json",
    "write_summary",
]

# The installed package: shipped axes and datasets live inside it, and no command writes there.
PACKAGE_DIR = Path(__file__).resolve().parent

# What each artifact folder is recognised by: a folder holding one artifact's marker file is never
# reused for another (a probe written into a store folder would look like neither).
ARTIFACTS: dict[str, str] = {
    "store": "manifest.json",
    "probe": "probe.json",
    "audit": "audit.json",
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


def atomic_write_dir(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp)`` to fill a temporary sibling folder, then rename it to ``path``.

    The folder appears under its name only when complete: a reader (or a rerun after kill -9)
    sees the old folder or the new one, never half of one. An existing ``path`` is replaced;
    whether that is allowed is the caller's check, made before the work. A failed write removes
    the temporary folder (a hidden ``.NAME.tmp-*`` sibling) and leaves ``path`` untouched.

    >>> atomic_write_dir(Path("runs/shift"), lambda tmp: (tmp / "shift.json").write_text(text))

    Raises:
        ValueprobeError: the folder is not writable or the disk is full.
    """
    path = Path(path)
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
        write(tmp)
        # mkdtemp creates the folder 0700; the artifact gets the mode a plain mkdir would give it
        os.chmod(tmp, 0o777 & ~_umask())
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno == errno.ENOSPC:
            raise ValueprobeError(f"no space left on device writing {path}: free space and rerun") from None
        raise ValueprobeError(
            f"{path}: cannot write ({exc.strerror or exc}); choose a writable location"
        ) from None
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def write_json(
    path: str | Path,
    obj: object,
    *,
    indent: int | None = 2,
    newline: bool = True,
    sort_keys: bool = False,
    ensure_ascii: bool = True,
    allow_nan: bool = True,
    default: Callable[[Any], Any] | None = None,
) -> Path:
    """Write ``obj`` as JSON at ``path`` atomically: the one way a JSON file is written.

    The options are :func:`json.dumps`'s, kept per file so each artifact keeps its bytes; a
    record's values go through :func:`jsonable` first where NaN or numpy types may appear, and
    ``allow_nan=False`` refuses what would make invalid JSON. ``newline`` ends the file with a line break.

    >>> write_json(out / "settings.json", settings.to_dict())
    """
    text = json.dumps(
        obj,
        indent=indent,
        sort_keys=sort_keys,
        ensure_ascii=ensure_ascii,
        allow_nan=allow_nan,
        default=default,
    )
    return atomic_write_text(path, text + "\n" if newline else text)


class _Figure(Protocol):
    def write_html(self, file: str, *, include_plotlyjs: bool, full_html: bool) -> object: ...


def write_html(page: _Figure | str, path: str | Path) -> Path:
    """Write an HTML page atomically: a plotly figure as one self-contained file (plotly.js inlined,
    so opening it reaches no other host), or a page already rendered to text. The one HTML writer.

    >>> write_html(dose_response_figure(result), out / "dose.html")
    """
    if isinstance(page, str):
        return atomic_write_text(path, page)
    return atomic_write(path, lambda tmp: page.write_html(str(tmp), include_plotlyjs=True, full_html=True))


def markdown_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], cell: Callable[[object], str] = str
) -> list[str]:
    """A markdown table, one line per row: the summary.md of the replicate commands.

    >>> markdown_table(["a", "b"], [[1, 2]])
    ['| a | b |', '|---|---|', '| 1 | 2 |']
    """
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return lines + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]


class Summarized(Protocol):
    """A result that writes itself as a summary: ``to_dict()`` for JSON, ``table()`` for people."""

    def to_dict(self) -> dict: ...

    def table(self) -> tuple[list[str], list[list[object]]]: ...


def write_summary(out: Path, result: Summarized, title: str, notes: Sequence[str]) -> list[Path]:
    """``results.json`` and ``summary.md`` (the title, the result's table, then ``notes``) in ``out``,
    created if missing; returns both paths."""
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "results.json", out / "summary.md"]
    write_json(files[0], result.to_dict(), default=float)
    md = [f"# {title}", "", *markdown_table(*result.table()), "", *notes]
    atomic_write_text(files[1], "\n".join(md) + "\n")
    return files


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


def _check_outside_package(path: Path, option: str) -> None:
    """Nothing is written inside the installed package (its shipped axes and datasets are read-only data)."""
    if path.resolve().is_relative_to(PACKAGE_DIR):
        raise ValueprobeError(
            f"{option} {path} is inside the installed valueprobe package ({PACKAGE_DIR}):"
            f" choose a folder of your own, e.g. runs/{path.name}"
        )


def resolve_shipped(spec: str | os.PathLike[str], shipped: Mapping[str, Path], *, what: str) -> Path:
    """The path ``spec`` stands for: a shipped ``what`` by its name (``shipped``: name → path), or a path.

    A ``str`` equal to a shipped name is that name; any other string, and any ``Path``, is a path
    (not checked here: its reader says what is wrong with it). A name that is also a file or folder
    in the current directory is refused in one line naming both, so neither is read by mistake.

    >>> resolve_shipped("smollm2-135m-value", {"smollm2-135m-value": Path("/pkg/axes/x")}, what="axis")
    PosixPath('/pkg/axes/x')
    """
    if not isinstance(spec, str) or spec not in shipped:
        return Path(spec)
    if Path(spec).exists():
        raise ValueprobeError(
            f"{spec!r} is both a shipped {what} ({shipped[spec]}) and ./{spec} in this folder:"
            f" write ./{spec} for the local one, or run from another folder for the shipped {what}"
        )
    return shipped[spec]


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
    _check_outside_package(path, option)
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
    _check_outside_package(path, option)
    if path.is_dir():
        raise ValueprobeError(f"{option} {path} is a folder; give a file path for {option}")
    if path.exists():
        _check_writable(path.parent, f"{option} {path}: cannot replace it", option)
        return path
    _check_creatable(path, option)
    return path


def jsonable(obj: object) -> Any:
    """JSON-safe copy: the one sanitiser every JSON valueprobe writes goes through.

    Dicts get ``str`` keys, tuples and arrays become lists, numpy scalars become Python ones, and
    NaN/inf become None, so ``json.dumps(jsonable(x), allow_nan=False)`` never fails on a number
    (a NaN, e.g. the value of a generation's last token, is never fed back, becomes ``null``).

    >>> jsonable({"ci": (0.1, float("nan")), 3: np.float32(0.5)})
    {'ci': [0.1, None], '3': 0.5}
    """
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


# numpy has no bfloat16: a BF16 tensor is mapped as its raw 16 bits and widened to float32 (exact)
_NP_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I64": np.int64, "BF16": np.uint16}


def read_safetensors_header(path: Path) -> tuple[int, dict]:
    """(header length, header) of a safetensors file, checked against the file's size.

    Raises:
        ValueprobeError: the file is missing, truncated or not safetensors.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            header = json.loads(f.read(n)) if 0 < n <= size - 8 else None
    except FileNotFoundError:
        raise ValueprobeError(f"{path.name} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        header = None
    if not isinstance(header, dict):
        raise ValueprobeError(f"{path.name} is not a safetensors file (unreadable header, {size} bytes)")
    end = max((info["data_offsets"][1] for k, info in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end != size:
        raise ValueprobeError(
            f"{path.name} is truncated or padded: {size} bytes, its header says {8 + n + end}"
        )
    return n, header


def mmap_safetensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Memory-map every tensor of a safetensors file as numpy arrays (read-only).

    A bfloat16 tensor comes back as float32 in RAM (numpy has no bfloat16): the exact value, its
    16 bits shifted into the high half of a float32.
    """
    n, header = read_safetensors_header(path)
    meta = header.pop("__metadata__", {}) or {}
    arrays: dict[str, np.ndarray] = {}
    for name, info in header.items():
        dtype = _NP_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueprobeError(
                f"{path}: tensor {name} has dtype {info['dtype']}, which the store does not use"
            )
        start, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if end == start:
            arrays[name] = np.zeros(shape, np.float32 if info["dtype"] == "BF16" else dtype)
            continue
        arrays[name] = np.memmap(path, dtype=dtype, mode="r", offset=8 + n + start, shape=shape)
        if info["dtype"] == "BF16":
            arrays[name] = (arrays[name].astype(np.uint32) << 16).view(np.float32)
    return arrays, meta


# --- stages cached by their inputs: what lets the demo and the audit resume ---


def stage_key(name: str, inputs: dict) -> str:
    """sha256 of the stage name, its inputs (JSON, sorted keys) and the valueprobe version."""
    blob = json.dumps({"stage": name, "inputs": inputs, "version": __version__}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class StageCache:
    """Runs named stages once per distinct input; ``ran`` / ``reused`` list what happened."""

    folder: Path
    console: Console = field(default_factory=Console)
    ran: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    keys: dict[str, str] = field(default_factory=dict)

    def run(self, name: str, inputs: dict, fn: Callable[[], dict], *, label: str = "") -> dict:
        """The cached result of stage ``name`` for ``inputs``, running ``fn()`` only if absent."""
        key = stage_key(name, inputs)
        self.keys[name] = key
        path = self.folder / f"{name}.json"
        if path.is_file():
            try:
                saved = json.loads(path.read_text())
            except json.JSONDecodeError:
                saved = {}
            if saved.get("key") == key:
                self.reused.append(name)
                self.console.print(f"[green]✓[/green] {name}: reused ({label or 'cached'}, {path})")
                return saved["result"]
        self.console.print(f"[bold]▶ {name}[/bold]{': ' + label if label else ''}")
        t0 = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - t0
        self.folder.mkdir(parents=True, exist_ok=True)
        payload = {"key": key, "inputs": inputs, "seconds": seconds, "result": result}
        write_json(path, payload, indent=1, default=float)
        self.ran.append(name)
        self.console.print(f"[green]✓[/green] {name}: {seconds:.1f}s")
        return result
