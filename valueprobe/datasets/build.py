"""Build contrast datasets into a folder, all-or-nothing, with a manifest.

    valueprobe datasets build --family all --out data --seed 0

>>> from valueprobe.datasets import build
>>> files = build("icrl", "/tmp/vp-data", seed=0)
>>> sorted(files)
['icrl', 'icrl_control']

Every file is generated and validated in memory first; only then are the files written (each
through a temporary name and a rename) together with ``MANIFEST.json`` (per-file sha256, row
counts, counts per group, seed, n, Python version). A bad family, ``n`` or folder raises
:class:`ValueprobeError` before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

from valueprobe.datasets import (
    backtracking,
    code_corruption,
    confidence,
    icrl,
    icrl_pairs,
    preference,
    refusal,
    steering,
    tasks,
)
from valueprobe.datasets.io import (
    Example,
    dumps_jsonl,
    example_from_dict,
    example_to_dict,
    read_jsonl,
)
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_bytes, write_json

MANIFEST = "MANIFEST.json"
MANIFEST_VERSION = 1

Generator = Callable[..., dict[str, list[Example]]]
_GENERATORS: dict[str, Generator] = {
    "icrl": icrl.generate,
    "icrl_pairs": icrl_pairs.generate,
    "code": code_corruption.generate,
    "backtracking": backtracking.generate,
    "confidence": confidence.generate,
    "refusal": refusal.generate,
    "preference": preference.generate,
    "steering": steering.generate,
    "tasks": tasks.generate,
}
FAMILIES: tuple[str, ...] = tuple(_GENERATORS)

# What ``n`` counts in each family (documented in data/README.md).
N_MEANING = {
    "icrl": "conversations (each with a matched control)",
    "icrl_pairs": "reward-flip pairs (two rows each)",
    "code": "standard-library functions (each with 4 corruptions)",
    "backtracking": "problems (each a correct and a backtracking rollout)",
    "confidence": "questions (each 12 rows)",
    "refusal": "pairs in refusal.jsonl and in sensitive.jsonl",
    "preference": "training prompts per target word (safety: 8 n pairs)",
    "steering": "prompts per steering set (confidence: problems asked both ways; refusal: n/2 pairs)",
    "tasks": "arithmetic questions per level (3 levels) and code tasks",
}


def _families(family: str) -> list[str]:
    if family == "all":
        return list(FAMILIES)
    if family not in _GENERATORS:
        raise ValueprobeError(f"unknown dataset family {family!r}; choose one of: {', '.join(FAMILIES)}, all")
    return [family]


def _check_n(n: int | None) -> None:
    if n is None:
        return
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueprobeError(f"--n must be a positive integer, got {n!r}")


def _check_writable(out_dir: Path) -> None:
    """Create ``out_dir`` if needed and prove a file can be created and renamed in it."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueprobeError(f"--out {out_dir} exists and is not a folder; give a folder path")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=out_dir)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ValueprobeError(
            f"--out {out_dir} cannot be written ({e.strerror or e}); choose a writable folder"
        ) from None


def _validated(name: str, examples: list[Example]) -> bytes:
    """Serialise and re-read every row, so what is written is exactly what ``read_jsonl`` accepts."""
    data = dumps_jsonl(examples)
    for lineno, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        ex = example_from_dict(json.loads(line), where=f"{name}.jsonl:{lineno}")
        if json.dumps(example_to_dict(ex), sort_keys=True, ensure_ascii=False, separators=(",", ":")) != line:
            raise ValueprobeError(
                f"{name}.jsonl:{lineno}: row does not round-trip; this is a bug in valueprobe"
            )
    return data


def generate(family: str, *, seed: int = 0, n: int | None = None) -> dict[str, list[Example]]:
    """The examples of ``family`` (or ``"all"``) in memory, keyed by file stem; nothing is written."""
    _check_n(n)
    out: dict[str, list[Example]] = {}
    for fam in _families(family):
        out.update(_GENERATORS[fam](seed=seed, n=n))
    return out


def build(family: str, out_dir: str | Path, *, seed: int = 0, n: int | None = None) -> dict[str, Path]:
    """Generate, validate and write ``family`` (one of :data:`FAMILIES` or ``"all"``) into ``out_dir``.

    Args:
        family: a family name or ``"all"``.
        out_dir: destination folder (created if missing).
        seed: the only source of randomness; the same seed gives identical bytes.
        n: family size (see ``N_MEANING``); None = the default committed build.

    Returns ``{file stem: path}`` of the JSONL files written. ``MANIFEST.json`` in ``out_dir`` is
    updated with their sha256, counts and per-group counts (entries of other files are kept).
    """
    _check_n(n)
    out_dir = Path(out_dir)
    examples: dict[str, list[Example]] = {}
    fam_of: dict[str, str] = {}
    for fam in _families(family):
        for name, rows in _GENERATORS[fam](seed=seed, n=n).items():
            examples[name] = rows
            fam_of[name] = fam
    payloads = {name: _validated(name, rows) for name, rows in examples.items()}
    _check_writable(out_dir)

    manifest_path = out_dir / MANIFEST
    manifest = _read_manifest(manifest_path)
    py = ".".join(str(x) for x in sys.version_info[:3])
    for name, data in payloads.items():
        rows = examples[name]
        manifest["files"][f"{name}.jsonl"] = {
            "family": fam_of[name],
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
            "rows": len(rows),
            "groups": dict(sorted(Counter(ex.group for ex in rows).items())),
            "seed": seed,
            "n": n,
            "python": py,
        }
    manifest["files"] = dict(sorted(manifest["files"].items()))

    written: dict[str, Path] = {}
    for name, data in payloads.items():
        path = out_dir / f"{name}.jsonl"
        atomic_write_bytes(path, data)
        written[name] = path
    write_json(manifest_path, manifest, sort_keys=True, ensure_ascii=False)
    return written


def _read_manifest(path: Path) -> dict:
    fresh = {
        "format_version": MANIFEST_VERSION,
        "generator": "valueprobe.datasets.build",
        "files": {},
        "regenerate": "valueprobe datasets build --family all --out data --seed 0",
    }
    if not path.exists():
        return fresh
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return fresh  # an unreadable manifest is rebuilt from the files written now
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        return fresh
    return {**fresh, **manifest}


def summary(files: Mapping[str, str | Path]) -> list[tuple[str, str, int]]:
    """Rows ``(file, group, count)`` for a table of what :func:`build` wrote (reads the files back)."""
    rows: list[tuple[str, str, int]] = []
    for _, path in sorted(files.items()):
        counts = Counter(ex.group for ex in read_jsonl(path))
        rows.extend((Path(path).name, group, k) for group, k in sorted(counts.items()))
    return rows
