"""Sharded on-disk activation store: stream a capture to safetensors, resume it, memory-map it.

    valueprobe capture --model smollm2-135m --data data/icrl.jsonl --layers all --positions spans --out runs/icrl

    >>> store = vp.ActivationStore.open("runs/icrl")
    >>> X, rows = store.acts(20), store.rows()      # float32 [n_rows, d_model], row metadata

Layout: ``manifest.json`` plus ``shard-00000.safetensors``, ... Each shard holds a fixed range of
examples: one tensor per layer key (``resid_post.12``, ``embed``) of shape ``[rows, d_model]``, the
numeric row columns (``row.label``, ``row.token_index``, ``row.n_tokens``) and the string columns as
JSON in the safetensors metadata. A shard is written under a temporary name and renamed when
complete, then the manifest is rewritten (also atomically): a kill -9 at any point leaves a store
that opens and resumes, and never a half-written shard that reads.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Iterator, Sequence
from enum import StrEnum
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from valueprobe.capture import Rows, encode, run_encoded
from valueprobe.datasets.io import Example, regroup
from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write, atomic_write_text
from valueprobe.manifest import FORMAT_VERSION, DatasetInfo, Shard, StoreManifest
from valueprobe.models import LoadedModel
from valueprobe.version import __version__
from valueprobe.vocab import Backend, Dtype, LayerKey, LayerSpec, PaddingSide, Positions, Site, choice

__all__ = ["ActivationStore", "capture_to_store", "FORMAT_VERSION"]

MANIFEST = "manifest.json"
_NP_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I64": np.int64, "BF16": None}


def _key_name(key: LayerKey, site: str) -> str:
    return "embed" if key == "embed" else f"{site}.{key}"


def _mmap_safetensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Memory-map every tensor of a safetensors file as numpy arrays (read-only)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
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
    """A captured activation store on disk (read side): its folder and its :class:`StoreManifest`."""

    def __init__(self, path: Path, manifest: StoreManifest) -> None:
        self.path = path
        self.manifest = manifest

    @classmethod
    def open(cls, path: str | Path) -> ActivationStore:
        path = Path(path)
        mpath = path / MANIFEST
        if not mpath.exists():
            raise ValueprobeError(
                f"{path} is not an activation store (no {MANIFEST}): run `valueprobe capture --out {path}`"
            )
        try:
            raw = json.loads(mpath.read_text())
        except json.JSONDecodeError as exc:
            raise ValueprobeError(f"{mpath}:{exc.lineno}: manifest is not valid JSON ({exc.msg})") from None
        return cls(path, StoreManifest.from_dict(raw, where=mpath))

    def _check_key(self, layer: LayerKey) -> None:
        if layer not in self.manifest.keys:
            have = ", ".join(str(k) for k in self.manifest.keys)
            raise ValueprobeError(
                f"store {self.path} has no layer {layer!r} (it holds {have}): capture that layer with --layers"
            )

    def __repr__(self) -> str:
        m = self.manifest
        return (f"ActivationStore({str(self.path)!r}, model={m.model_id!r}, layers={len(m.layers)}, "
                f"site={m.site}, positions={m.positions}, rows={m.n_rows})")  # fmt: skip

    def iter_shards(
        self, layers: Sequence[LayerKey] | None = None
    ) -> Iterator[tuple[dict[LayerKey, np.ndarray], Rows]]:
        """Yield ``({layer: memmap [rows, d_model]}, rows)`` per complete shard, in order."""
        keys = list(layers) if layers is not None else self.manifest.keys
        for k in keys:
            self._check_key(k)
        for shard in self.manifest.shards:
            arrays, meta = _mmap_safetensors(self.path / shard.file)
            strings = json.loads(meta["rows"])
            rows = Rows(
                example_id=strings["example_id"],
                label=np.asarray(arrays["row.label"], np.float64),
                group=strings["group"],
                span=strings["span"],
                token_index=np.asarray(arrays["row.token_index"], np.int64),
                n_tokens=np.asarray(arrays["row.n_tokens"], np.int64),
            )
            yield {k: arrays[_key_name(k, self.manifest.site)] for k in keys}, rows

    def rows(self) -> Rows:
        return Rows.concat([rows for _, rows in self.iter_shards(layers=[])])

    def acts(self, layer: LayerKey) -> np.ndarray:
        """All rows of one layer as float32 ``[n_rows, d_model]`` (materialized in RAM)."""
        self._check_key(layer)
        out = np.empty((self.manifest.n_rows, self.manifest.d_model), np.float32)
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
    layers: LayerSpec = "all",
    site: Site = Site.resid_post,
    positions: Positions = Positions.last,
    batch_size: int = 8,
    examples_per_shard: int = 256,
    dtype: Dtype = Dtype.float16,
    include_embed: bool = True,
    padding_side: PaddingSide = PaddingSide.right,
    max_length: int | None = None,
    span_labels: Sequence[str] | None = None,
    group_by: str | None = None,
    dataset_path: str | None = None,
    dataset_sha256: str | None = None,
    backend: Backend = Backend.hooks,
    remote: bool = False,
    progress: bool = True,
) -> ActivationStore:
    """Capture ``examples`` and stream them to a sharded store at ``out_dir``; resumes if present.

    Memory stays bounded by one shard (``examples_per_shard`` examples' rows), whatever the size
    of the dataset. Rerunning the same call after an interruption skips the complete shards.

    Raises:
        ValueprobeError: empty dataset, bad layers/positions, a store at ``out_dir`` made with other
            settings, or no disk space.
    """
    if not examples:
        raise ValueprobeError("no examples to capture: the dataset is empty")
    dtype = choice(Dtype, dtype, what="dtype")
    site = choice(Site, site, what="site")
    positions = choice(Positions, positions, what="positions")
    if examples_per_shard < 1 or batch_size < 1:
        raise ValueprobeError("batch_size and examples_per_shard must be >= 1")
    layer_list = lm.resolve_layers(layers)
    examples = regroup(examples, group_by)
    # Validate every example's token selection before writing anything. The token ids are not
    # kept: each shard encodes its own examples again, so memory stays flat on any dataset size.
    encode(lm, examples, positions=positions, max_length=max_length, span_labels=span_labels)
    out = Path(out_dir)
    wanted = StoreManifest(
        model_id=lm.model_id,
        fingerprint=lm.fingerprint,
        layers=tuple(layer_list),
        include_embed=include_embed,
        site=site,
        positions=positions,
        span_labels=tuple(sorted(span_labels)) if span_labels else None,
        group_by=group_by,
        dtype=dtype,
        examples_per_shard=examples_per_shard,
        d_model=lm.d_model,
        n_layers=lm.n_layers,
        dataset=DatasetInfo(dataset_path, dataset_sha256, len(examples)),
        valueprobe_version=__version__,
    )
    manifest = _open_or_start(out, wanted)
    done = {s.examples[0] for s in manifest.shards}
    torch_dtype = torch.float16 if dtype == Dtype.float16 else torch.float32
    n = len(examples)
    with tqdm(
        total=n,
        initial=manifest.n_examples_done,
        desc=f"capture -> {out.name}",
        unit="ex",
        disable=not progress,
    ) as bar:
        for index, start in enumerate(range(0, n, examples_per_shard)):
            if start in done:
                continue
            chunk = encode(
                lm,
                examples[start : start + examples_per_shard],
                positions=positions,
                max_length=max_length,
                span_labels=span_labels,
            )
            got = run_encoded(lm, chunk, layers=layer_list, site=site, include_embed=include_embed,
                              batch_size=batch_size, padding_side=padding_side, backend=backend, remote=remote,
                              on_batch=bar.update)  # fmt: skip
            tensors, meta = _shard_tensors(got.acts, got.rows, site=site, dtype=torch_dtype)
            name = f"shard-{index:05d}.safetensors"
            _write_shard(out / name, tensors, meta)
            manifest = manifest.with_shard(Shard(name, (start, start + len(chunk)), len(got.rows)))
            atomic_write_text(out / MANIFEST, json.dumps(manifest.to_dict(), indent=1))
    return ActivationStore.open(out)


def _open_or_start(out: Path, wanted: StoreManifest) -> StoreManifest:
    """The manifest of the store at ``out`` if it was captured the way ``wanted`` says, else a new one."""
    mpath = out / MANIFEST
    if mpath.exists():
        manifest = ActivationStore.open(out).manifest
        differ = manifest.settings_differ(wanted)
        if differ is not None:
            key, have, want = differ
            raise ValueprobeError(
                f"store {out} was captured with {key}={_plain(have)!r}, not {_plain(want)!r}: "
                "resume with the same settings, or capture into a new --out"
            )
        old, new = manifest.dataset, wanted.dataset
        if (old.sha256, old.n_examples) != (new.sha256, new.n_examples):
            raise ValueprobeError(
                f"store {out} was captured from another dataset ({old.path}, sha256 "
                f"{str(old.sha256)[:12]}, {old.n_examples} examples): use a new --out"
            )
        for stray in out.glob("*.tmp"):  # a shard or manifest killed mid-write
            stray.unlink()
        return manifest
    if out.exists() and any(out.iterdir()):
        raise ValueprobeError(f"{out} exists and is not an activation store: choose an empty or new --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueprobeError(f"cannot create store folder {out}: {exc.strerror}") from None
    atomic_write_text(mpath, json.dumps(wanted.to_dict(), indent=1))
    return wanted


def _plain(value: object) -> object:
    """A setting as the manifest spells it (lists, not tuples; strings, not enums)."""
    if isinstance(value, tuple):
        return list(value)
    return str(value) if isinstance(value, StrEnum) else value
