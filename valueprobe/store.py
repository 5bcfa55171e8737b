"""Sharded on-disk activation store: stream a capture to safetensors, resume it, memory-map it.

    valueprobe capture --model smollm2-135m --data data/icrl.jsonl --layers all --positions spans --out runs/icrl

    >>> store = vp.ActivationStore.open("runs/icrl")
    >>> X, rows = store.acts(20), store.rows()      # float32 [n_rows, d_model], row metadata

Layout: ``manifest.json`` plus ``shard-00000.safetensors``, ... Each shard holds a range of
examples (``examples_per_shard``, or fewer when ``checkpoint_seconds`` pass first): one tensor per layer key (``resid_post.12``, ``embed``) of shape ``[rows, d_model]``, the
numeric row columns (``row.label``, ``row.token_index``, ``row.n_tokens``) and the string columns as
JSON in the safetensors metadata. A shard is written under a temporary name and renamed when
complete, then the manifest is rewritten (also atomically): a kill -9 at any point leaves a store
that resumes, and never a half-written shard that reads. Opening a store verifies it: every listed
shard present with the size its header promises, and ``complete`` true unless ``allow_partial``.
"""

from __future__ import annotations

import json
import shutil
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from safetensors.torch import save_file

from valueprobe.capture import (
    CaptureResult,
    ChatTemplate,
    LayerKey,
    Positions,
    Rows,
    Site,
    encode,
    regroup,
    run_encoded,
)
from valueprobe.datasets.io import Example
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write, atomic_write_text, check_output_dir
from valueprobe.models import LoadedModel

__all__ = ["ActivationStore", "capture_to_store", "check_store_out", "FORMAT_VERSION"]

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_NP_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I64": np.int64, "BF16": None}


def _key_name(key: LayerKey, site: str) -> str:
    return "embed" if key == "embed" else f"{site}.{key}"


def _read_header(path: Path) -> tuple[int, dict]:
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


def _mmap_safetensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Memory-map every tensor of a safetensors file as numpy arrays (read-only)."""
    n, header = _read_header(path)
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
            arrays[name] = np.zeros(shape, dtype)
            continue
        arrays[name] = np.memmap(path, dtype=dtype, mode="r", offset=8 + n + start, shape=shape)
    return arrays, meta


class ActivationStore:
    """A captured activation store on disk (read side).

    Attributes mirror the manifest: ``model_id``, ``fingerprint``, ``layers``, ``site``,
    ``positions``, ``d_model``, ``n_rows`` (complete shards only), ``dataset_path``, ``dataset_sha256``.
    """

    def __init__(self, path: Path, manifest: dict) -> None:
        self.path = path
        self.manifest = manifest

    @classmethod
    def open(cls, path: str | Path, *, allow_partial: bool = False) -> ActivationStore:
        """Open and verify a store: listed shards present, sizes matching their headers, complete.

        Args:
            path: the store folder.
            allow_partial: accept a capture that did not finish (read the rows it has).

        Raises:
            ValueprobeError: not a store, a missing or truncated shard, or (without
                ``allow_partial``) an unfinished capture; each says how to fix it.
        """
        store = cls._read(Path(path))
        problem = store._first_bad_shard()
        if problem is not None:
            raise ValueprobeError(
                f"store {store.path}: {problem}; rerun the same `valueprobe capture --out {store.path}` to recapture it"
            )
        if not store.complete and not allow_partial:
            raise ValueprobeError(
                f"store {store.path} is partial: its capture stopped after {store.n_examples_done} of"
                f" {store.manifest['dataset']['n_examples']} examples; rerun the same `valueprobe capture`"
                " to finish it, or pass --allow-partial to use the rows it has"
            )
        return store

    def _first_bad_shard(self) -> str | None:
        names = {_key_name(k, self.site) for k in self.keys} | {
            "row.label",
            "row.token_index",
            "row.n_tokens",
        }
        for shard in self.manifest["shards"]:
            try:
                _, header = _read_header(self.path / shard["file"])
            except ValueprobeError as exc:
                return f"shard {exc}"
            if missing := names - header.keys():
                return f"shard {shard['file']} lacks {', '.join(sorted(missing))}"
            if header["row.label"]["shape"] != [shard["rows"]]:
                return f"shard {shard['file']} holds {header['row.label']['shape']} rows, the manifest says {shard['rows']}"
        return None

    @classmethod
    def _read(cls, path: Path) -> ActivationStore:
        """The manifest, unverified (resuming a capture repairs what :meth:`open` would refuse)."""
        mpath = path / MANIFEST
        if not mpath.exists():
            raise ValueprobeError(
                f"{path} is not an activation store (no {MANIFEST}): run `valueprobe capture --out {path}`"
            )
        try:
            manifest = json.loads(mpath.read_text())
        except json.JSONDecodeError as exc:
            raise ValueprobeError(f"{mpath}:{exc.lineno}: manifest is not valid JSON ({exc.msg})") from None
        if manifest.get("format") != "valueprobe.store" or manifest.get("version") != FORMAT_VERSION:
            raise ValueprobeError(
                f"{mpath}: store format {manifest.get('format')!r} v{manifest.get('version')} is not "
                f"valueprobe.store v{FORMAT_VERSION}: capture it again with this valueprobe"
            )
        return cls(path, manifest)

    @property
    def n_examples_done(self) -> int:
        return sum(s["examples"][1] - s["examples"][0] for s in self.manifest["shards"])

    # manifest fields
    model_id = property(lambda self: self.manifest["model_id"])
    fingerprint = property(lambda self: self.manifest["fingerprint"])
    layers = property(lambda self: list(self.manifest["layers"]))
    has_embed = property(lambda self: bool(self.manifest["include_embed"]))
    site = property(lambda self: self.manifest["site"])
    positions = property(lambda self: self.manifest["positions"])
    d_model = property(lambda self: int(self.manifest["d_model"]))
    n_rows = property(lambda self: sum(s["rows"] for s in self.manifest["shards"]))
    complete = property(lambda self: bool(self.manifest.get("complete")))
    dataset_path = property(lambda self: (self.manifest.get("dataset") or {}).get("path"))
    dataset_sha256 = property(lambda self: (self.manifest.get("dataset") or {}).get("sha256"))

    @property
    def keys(self) -> list[LayerKey]:
        return (["embed"] if self.has_embed else []) + self.layers

    def _check_key(self, layer: LayerKey) -> None:
        if layer not in self.keys:
            have = ", ".join(str(k) for k in self.keys)
            raise ValueprobeError(
                f"store {self.path} has no layer {layer!r} (it holds {have}): capture that layer with --layers"
            )

    def __repr__(self) -> str:
        return (f"ActivationStore({str(self.path)!r}, model={self.model_id!r}, layers={len(self.layers)}, "
                f"site={self.site}, positions={self.positions}, rows={self.n_rows})")  # fmt: skip

    def iter_shards(
        self, layers: Sequence[LayerKey] | None = None
    ) -> Iterator[tuple[dict[LayerKey, np.ndarray], Rows]]:
        """Yield ``({layer: memmap [rows, d_model]}, rows)`` per complete shard, in order."""
        keys = list(layers) if layers is not None else self.keys
        for k in keys:
            self._check_key(k)
        for shard in self.manifest["shards"]:
            arrays, meta = _mmap_safetensors(self.path / shard["file"])
            strings = json.loads(meta["rows"])
            rows = Rows(
                example_id=strings["example_id"],
                label=np.asarray(arrays["row.label"], np.float64),
                group=strings["group"],
                span=strings["span"],
                token_index=np.asarray(arrays["row.token_index"], np.int64),
                n_tokens=np.asarray(arrays["row.n_tokens"], np.int64),
            )
            yield {k: arrays[_key_name(k, self.site)] for k in keys}, rows

    def rows(self) -> Rows:
        return Rows.concat([rows for _, rows in self.iter_shards(layers=[])])

    def acts(self, layer: LayerKey) -> np.ndarray:
        """All rows of one layer as float32 ``[n_rows, d_model]`` (materialized in RAM)."""
        self._check_key(layer)
        out = np.empty((self.n_rows, self.d_model), np.float32)
        i = 0
        for arrays, rows in self.iter_shards(layers=[layer]):
            out[i : i + len(rows)] = arrays[layer]
            i += len(rows)
        return out


def _shard_tensors(acts: dict[LayerKey, torch.Tensor], rows: Rows, *, site: str,
                   dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], dict[str, str]]:  # fmt: skip
    tensors = {_key_name(k, site): v.to(dtype).contiguous() for k, v in acts.items()}
    tensors["row.label"] = torch.from_numpy(rows.label.astype(np.float64))
    tensors["row.token_index"] = torch.from_numpy(rows.token_index.astype(np.int64))
    tensors["row.n_tokens"] = torch.from_numpy(rows.n_tokens.astype(np.int64))
    strings = {"example_id": rows.example_id, "group": rows.group, "span": rows.span}
    return tensors, {"rows": json.dumps(strings, ensure_ascii=False)}


def _write_shard(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> None:
    need = sum(t.numel() * t.element_size() for t in tensors.values()) + len(meta["rows"]) + (1 << 16)
    free = shutil.disk_usage(path.parent).free
    if free < need:
        raise ValueprobeError(
            f"no space left for {path.name} ({need / 1e6:.1f} MB needed, {free / 1e6:.1f} MB free in {path.parent}): "
            "free space and rerun the same command to resume"
        )
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))


def capture_to_store(
    lm: LoadedModel,
    examples: Sequence[Example],
    out_dir: str | Path,
    *,
    layers: str | int | Sequence[int] | None = "all",
    site: Site = "resid_post",
    positions: Positions = "last",
    batch_size: int = 8,
    examples_per_shard: int = 256,
    dtype: Literal["float16", "float32"] = "float16",
    include_embed: bool = True,
    padding_side: Literal["left", "right"] = "right",
    max_length: int | None = None,
    span_labels: Sequence[str] | None = None,
    group_by: str | None = None,
    dataset_path: str | None = None,
    dataset_sha256: str | None = None,
    backend: Literal["hooks", "nnsight", "tlens"] = "hooks",
    remote: bool = False,
    chat_template: ChatTemplate = "model",
    checkpoint_seconds: float = 60.0,
    progress: bool = True,
) -> ActivationStore:
    """Capture ``examples`` and stream them to a sharded store at ``out_dir``; resumes if present.

    Memory stays bounded by one shard (``examples_per_shard`` examples' rows), whatever the size
    of the dataset. A shard is also closed after ``checkpoint_seconds`` of work (at a batch
    boundary), so an interruption loses at most about that much. Rerunning the same call after an
    interruption skips the complete shards and gives the same store as an uninterrupted run. A
    capture that fails before its first shard leaves no store behind.

    Raises:
        ValueprobeError: empty dataset, bad layers/positions, a store at ``out_dir`` made with other
            settings, or no disk space.
    """
    if not examples:
        raise ValueprobeError("no examples to capture: the dataset is empty")
    if dtype not in ("float16", "float32"):
        raise ValueprobeError(f"unknown dtype {dtype!r}: use float16 or float32")
    if examples_per_shard < 1 or batch_size < 1 or checkpoint_seconds <= 0:
        raise ValueprobeError("batch_size, examples_per_shard and checkpoint_seconds must be > 0")
    layer_list = lm.resolve_layers(layers)
    examples = regroup(examples, group_by)
    # Validate every example's token selection before writing anything. The token ids are not
    # kept: each shard encodes its own examples again, so memory stays flat on any dataset size.
    options = {"positions": positions, "max_length": max_length, "span_labels": span_labels,
               "chat_template": chat_template}  # fmt: skip
    encode(lm, examples, **options)  # type: ignore[arg-type]
    out = Path(out_dir)
    identity = {
        "model_id": lm.model_id,
        "fingerprint": lm.fingerprint,
        "layers": layer_list,
        "include_embed": include_embed,
        "site": site,
        "positions": positions,
        "span_labels": sorted(span_labels) if span_labels else None,
        "group_by": group_by,
        "dtype": dtype,
        "examples_per_shard": examples_per_shard,
        "chat_template": chat_template,
    }
    created = not out.exists()
    manifest = _open_or_start(out, identity, lm=lm, n_examples=len(examples), dataset_path=dataset_path,
                              dataset_sha256=dataset_sha256)  # fmt: skip
    torch_dtype = torch.float16 if dtype == "float16" else torch.float32
    from tqdm.auto import tqdm

    n = len(examples)
    start = sum(
        s["examples"][1] - s["examples"][0] for s in manifest["shards"]
    )  # shards are contiguous from 0
    run = {"layers": layer_list, "site": site, "include_embed": include_embed, "batch_size": batch_size,
           "padding_side": padding_side, "backend": backend, "remote": remote}  # fmt: skip
    try:
        with tqdm(
            total=n, initial=start, desc=f"capture -> {out.name}", unit="ex", disable=not progress
        ) as bar:
            while start < n:
                chunk = encode(lm, examples[start : start + examples_per_shard], warn=False, **options)  # type: ignore[arg-type]
                deadline = time.monotonic() + checkpoint_seconds
                got, done = _run_until(lm, chunk, deadline=deadline, on_batch=bar.update, **run)
                tensors, meta = _shard_tensors(got.acts, got.rows, site=site, dtype=torch_dtype)
                name = f"shard-{len(manifest['shards']):05d}.safetensors"
                _write_shard(out / name, tensors, meta)
                manifest["shards"].append(
                    {"file": name, "examples": [start, start + done], "rows": len(got.rows)}
                )
                start += done
                manifest["complete"] = start == n
                atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=1))
    except BaseException:
        if created and not manifest["shards"]:  # nothing was captured: leave no empty store behind
            shutil.rmtree(out, ignore_errors=True)
        raise
    return ActivationStore.open(out)


def _run_until(lm: LoadedModel, chunk: list, *, deadline: float, batch_size: int,
               on_batch: Callable[[int], object], **run: Any) -> tuple[CaptureResult, int]:  # fmt: skip
    """Run ``chunk`` batch by batch (the same batches as one pass), stopping at the first batch
    boundary past ``deadline``; returns the result and how many examples of ``chunk`` it covers."""
    parts, done = [], 0
    while done < len(chunk):
        batch = chunk[done : done + batch_size]
        parts.append(run_encoded(lm, batch, batch_size=batch_size, on_batch=on_batch, **run))
        done += len(batch)
        if time.monotonic() >= deadline:
            break
    acts = {k: torch.cat([p.acts[k] for p in parts]) for k in parts[0].acts}
    return CaptureResult(rows=Rows.concat([p.rows for p in parts]), acts=acts), done


def _open_or_start(out: Path, identity: dict, *, lm: LoadedModel, n_examples: int, dataset_path: str | None,
                   dataset_sha256: str | None) -> dict:  # fmt: skip
    from valueprobe import __version__

    dataset = {"path": dataset_path, "sha256": dataset_sha256, "n_examples": n_examples}
    mpath = out / MANIFEST
    if mpath.exists():
        store = ActivationStore._read(out)
        manifest = store.manifest
        for key, want in identity.items():
            if manifest.get(key, _IDENTITY_DEFAULTS.get(key)) != want:
                raise ValueprobeError(
                    f"store {out} was captured with {key}={manifest.get(key)!r}, not {want!r}: "
                    "resume with the same settings, or capture into a new --out"
                )
        old = manifest.get("dataset") or {}
        if (old.get("sha256"), old.get("n_examples")) != (dataset_sha256, n_examples):
            raise ValueprobeError(
                f"store {out} was captured from another dataset ({old.get('path')}, sha256 "
                f"{str(old.get('sha256'))[:12]}, {old.get('n_examples')} examples): use a new --out"
            )
        for stray in out.glob("*.tmp"):  # a shard or manifest killed mid-write
            stray.unlink()
        if store._first_bad_shard() is not None:  # keep the good prefix; recapture from the first bad shard
            good = []
            for shard in manifest["shards"]:
                store.manifest = {**manifest, "shards": [*good, shard]}
                if store._first_bad_shard() is not None:
                    break
                good.append(shard)
            manifest = {**manifest, "shards": good, "complete": False}
        return manifest
    check_store_out(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueprobeError(f"cannot create store folder {out}: {exc.strerror}") from None
    manifest = {
        "format": "valueprobe.store",
        "version": FORMAT_VERSION,
        **identity,
        "d_model": lm.d_model,
        "n_layers": lm.n_layers,
        "dataset": dataset,
        "valueprobe_version": __version__,
        "shards": [],
        "complete": False,
    }
    return manifest  # written with the first shard: a capture that fails before it leaves no store


# Identity keys added after format v1 stores were made, and what those stores mean by them.
_IDENTITY_DEFAULTS = {"chat_template": "model"}


def check_store_out(out: str | Path) -> Path:
    """Fail before any work unless ``out`` can hold a store: new, empty, or a store to resume.

    >>> check_store_out("runs/icrl")   # valueprobe capture calls this before loading the model
    PosixPath('runs/icrl')
    """
    out = check_output_dir(out, holds="store")
    if (out / MANIFEST).exists():
        ActivationStore._read(out)  # a manifest of another format fails here, not after the model loads
    elif out.exists() and any(out.iterdir()):
        raise ValueprobeError(f"{out} exists and is not an activation store: choose an empty or new --out")
    return out
