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

import functools
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from valueprobe.activations.capture import CaptureSettings, Rows, run_until
from valueprobe.activations.encode import encode, warn_truncated
from valueprobe.activations.manifest import FORMAT_VERSION, DatasetInfo, Shard, StoreManifest
from valueprobe.datasets.io import Example, regroup
from valueprobe.errors import ValueprobeError
from valueprobe.files import (
    atomic_write,
    check_output_dir,
    mmap_safetensors,
    read_safetensors_header,
    write_json,
)
from valueprobe.model.load import LoadedModel
from valueprobe.version import __version__
from valueprobe.vocab import (
    ChatTemplate,
    Dtype,
    LayerKey,
    Positions,
    ShardSpec,
    Site,
    choice,
    layer_ranges,
    parse_layers,
)

__all__ = ["ActivationStore", "capture_to_store", "check_store_out", "FORMAT_VERSION"]

MANIFEST = "manifest.json"
_TORCH_DTYPES = {Dtype.float16: torch.float16, Dtype.float32: torch.float32, Dtype.bfloat16: torch.bfloat16}


def _key_name(key: LayerKey, site: str) -> str:
    return "embed" if key == "embed" else f"{site}.{key}"


class ActivationStore:
    """A captured activation store on disk (read side): its folder and its :class:`StoreManifest`."""

    def __init__(self, path: Path, manifest: StoreManifest) -> None:
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
        m = store.manifest
        if not m.complete and not allow_partial:
            raise ValueprobeError(
                f"store {store.path} is partial: its capture stopped after {m.n_examples_done} of"
                f" {len(m.example_range)} examples; rerun the same `valueprobe capture`"
                " to finish it, or pass --allow-partial to use the rows it has"
            )
        if not m.complete:
            logging.getLogger("valueprobe").warning(
                f"{store.path} is a partial store: using its {m.n_rows} rows ({m.n_examples_done} of"
                f" {len(m.example_range)} examples)"
            )
        return store

    def _first_bad_shard(self) -> str | None:
        m = self.manifest
        names = {_key_name(k, m.site) for k in m.keys} | {"row.label", "row.token_index", "row.n_tokens"}
        for shard in m.shards:
            try:
                _, header = read_safetensors_header(self.path / shard.file)
            except ValueprobeError as exc:
                return f"shard {exc}"
            if missing := names - header.keys():
                return f"shard {shard.file} lacks {', '.join(sorted(missing))}"
            if header["row.label"]["shape"] != [shard.rows]:
                return f"shard {shard.file} holds {header['row.label']['shape']} rows, the manifest says {shard.rows}"
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
        return (
            f"ActivationStore({str(self.path)!r}, model={m.model_id!r}, layers={len(m.layers)}, "
            f"site={m.site}, positions={m.positions}, rows={m.n_rows})"
        )

    def iter_shards(
        self, layers: Sequence[LayerKey] | None = None
    ) -> Iterator[tuple[dict[LayerKey, np.ndarray], Rows]]:
        """Yield ``({layer: memmap [rows, d_model]}, rows)`` per complete shard, in order."""
        keys = list(layers) if layers is not None else self.manifest.keys
        for k in keys:
            self._check_key(k)
        for shard in self.manifest.shards:
            arrays, meta = mmap_safetensors(self.path / shard.file)
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

    def table(self) -> tuple[list[str], list[list[object]]]:
        """The store in one row: model, layers, site, positions, examples, rows, shards, dtype, part."""
        m = self.manifest
        headers = [
            "model",
            "fingerprint",
            "layers",
            "site",
            "positions",
            "examples",
            "rows",
            "shards",
            "dtype",
            "part",
        ]
        row: list[object] = [
            m.model_id, m.fingerprint, layer_ranges(m.layers), m.site, m.positions, len(set(self.rows().example_id)),
            m.n_rows, len(m.shards), m.dtype, "-" if m.part is None else str(m.part),
        ]  # fmt: skip
        return headers, [row]

    def acts(self, layer: LayerKey) -> np.ndarray:
        """All rows of one layer as float32 ``[n_rows, d_model]`` (materialized in RAM)."""
        self._check_key(layer)
        out = np.empty((self.manifest.n_rows, self.manifest.d_model), np.float32)
        i = 0
        for arrays, rows in self.iter_shards(layers=[layer]):
            out[i : i + len(rows)] = arrays[layer]
            i += len(rows)
        return out


def _shard_tensors(
    acts: dict[LayerKey, torch.Tensor], rows: Rows, *, site: str, dtype: torch.dtype
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
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
    settings: CaptureSettings = CaptureSettings(include_embed=True),
    *,
    examples_per_shard: int = 256,
    dtype: Dtype = Dtype.float16,
    dataset_path: str | None = None,
    dataset_sha256: str | None = None,
    checkpoint_seconds: float = 60.0,
    shard: ShardSpec | None = None,
    progress: bool = True,
) -> ActivationStore:
    """Capture ``examples`` and stream them to a sharded store at ``out_dir``; resumes if present.

    Memory stays bounded by one shard (``examples_per_shard`` examples' rows) on any dataset. A
    shard also closes after ``checkpoint_seconds`` of work, so a kill loses at most that much;
    shards end at multiples of ``examples_per_shard``, so every run, resumed or not, feeds the
    same batches and gives the same store. A capture that fails before its first shard leaves no
    store. With ``shard`` (``--shard I/N``) only that part's blocks are captured, into a store whose
    manifest names the part and the whole dataset; ``valueprobe merge`` joins the N parts into the
    store one process makes (:meth:`ShardSpec.examples`).

    Args:
        settings: what to read and how (`valueprobe.activations.capture.CaptureSettings`; a store
            keeps the embedding output by default).
        dtype: what the store keeps the activations in; dataset_path, dataset_sha256: recorded.

    Raises:
        ValueprobeError: empty dataset, bad layers/positions, a store at ``out_dir`` made with other
            settings, or no disk space.
    """
    s = settings
    _check_sizes(examples, s.batch_size, examples_per_shard, checkpoint_seconds)
    dtype, site = choice(Dtype, dtype, what="dtype"), choice(Site, s.site, what="site")
    positions = choice(Positions, s.positions, what="positions")
    chat_template = choice(ChatTemplate, s.chat_template, what="chat template")
    layer_list = parse_layers(s.layers, n_layers=lm.n_layers)  # the CLI's spec is resolved here, once
    examples = regroup(examples, s.group_by)
    tokens: dict[str, Any] = dict(positions=positions, span_labels=s.span_labels, chat_template=chat_template)
    select: Callable[..., list] = functools.partial(encode, lm, max_length=s.max_length, **tokens)
    out = Path(out_dir)
    wanted = _wanted(
        lm,
        layer_list,
        dataset=DatasetInfo(dataset_path, dataset_sha256, len(examples)),
        include_embed=s.include_embed,
        site=site,
        group_by=s.group_by,
        dtype=dtype,
        examples_per_shard=examples_per_shard,
        part=shard,
        **tokens,
    )
    _check_selections(select, examples, wanted.example_range, examples_per_shard, s.max_length)
    run = functools.partial(run_until, lm, settings=s, layers=layer_list)
    _write_shards(
        examples, out, wanted, select, run, checkpoint_seconds=checkpoint_seconds, progress=progress
    )
    return ActivationStore.open(out)


def _check_selections(
    select: Callable[..., list], examples: Sequence[Example], todo: range, block: int, max_length: int | None
) -> None:
    """Check every token selection (this part's) before writing anything, one shard's block at a
    time: the ids are dropped block by block (each shard encodes its examples again), so memory
    stays flat however many examples there are; truncations make one warning for all of them."""
    truncated: list[tuple[str, int]] = []
    for lo in range(todo.start, todo.stop, block):
        select(examples[lo : min(todo.stop, lo + block)], truncated=truncated)
    warn_truncated(truncated, len(todo), max_length)


def _check_sizes(
    examples: Sequence[Example], batch_size: int, examples_per_shard: int, checkpoint_seconds: float
) -> None:
    if not examples:
        raise ValueprobeError("no examples to capture: the dataset is empty")
    if examples_per_shard < 1 or batch_size < 1 or checkpoint_seconds <= 0:
        raise ValueprobeError("batch_size, examples_per_shard and checkpoint_seconds must be > 0")


def _wanted(
    lm: LoadedModel, layers: Sequence[int], *, span_labels: Sequence[str] | None, **settings
) -> StoreManifest:
    """The manifest a capture with these settings makes (a store on disk must match it to resume)."""
    return StoreManifest(
        model_id=lm.model_id,
        fingerprint=lm.fingerprint,
        layers=tuple(layers),
        span_labels=tuple(sorted(span_labels)) if span_labels else None,
        d_model=lm.d_model,
        n_layers=lm.n_layers,
        valueprobe_version=__version__,
        model_dtype=str(lm.dtype).removeprefix("torch."),
        **settings,
    )


def _write_shards(
    examples: Sequence[Example],
    out: Path,
    wanted: StoreManifest,
    select: Callable[..., list],
    run: Callable[..., tuple],
    *,
    checkpoint_seconds: float,
    progress: bool,
) -> None:
    """Capture the examples after the last complete shard, one shard per ``examples_per_shard``
    examples or ``checkpoint_seconds`` of work, each written before the manifest that lists it.
    A capture that fails before its first shard leaves no store behind."""
    created = not out.exists()
    manifest = _open_or_start(out, wanted)
    try:
        _write_from(
            examples, out, manifest, select, run, checkpoint_seconds=checkpoint_seconds, progress=progress
        )
    except BaseException:
        if created and not (out / MANIFEST).exists():  # nothing was captured
            shutil.rmtree(out, ignore_errors=True)
        raise


def _write_from(
    examples: Sequence[Example],
    out: Path,
    manifest: StoreManifest,
    select: Callable[..., list],
    run: Callable[..., tuple],
    *,
    checkpoint_seconds: float,
    progress: bool,
) -> None:
    """The shard loop, from the first example no shard holds to the last of the store's range."""
    todo, block = manifest.example_range, manifest.examples_per_shard
    start = todo.start + manifest.n_examples_done  # shards are contiguous from the range's start
    torch_dtype = _TORCH_DTYPES[manifest.dtype]
    if not todo and not (out / MANIFEST).exists():  # a part with no blocks (more parts than blocks)
        write_json(out / MANIFEST, replace(manifest, complete=True).to_dict(), indent=1, newline=False)
    with tqdm(
        total=len(todo),
        initial=start - todo.start,
        desc=f"capture -> {out.name}",
        unit="ex",
        disable=not progress,
    ) as bar:
        while start < todo.stop:
            end = min(todo.stop, (start // block + 1) * block)  # the next block boundary
            chunk = select(examples[start:end], warn=False)
            got, done = run(chunk, deadline=time.monotonic() + checkpoint_seconds, on_batch=bar.update)
            tensors, meta = _shard_tensors(got.acts, got.rows, site=manifest.site, dtype=torch_dtype)
            name = f"shard-{len(manifest.shards):05d}.safetensors"
            _write_shard(out / name, tensors, meta)
            manifest = manifest.with_shard(Shard(name, (start, start + done), len(got.rows)))
            start += done
            write_json(out / MANIFEST, manifest.to_dict(), indent=1, newline=False)


def _open_or_start(out: Path, wanted: StoreManifest) -> StoreManifest:
    """The manifest of the store at ``out`` if it was captured the way ``wanted`` says, else a new
    one (written with the first shard: a capture that fails before it leaves no store)."""
    if (out / MANIFEST).exists():
        store = ActivationStore._read(out)
        manifest = store.manifest
        differ = manifest.settings_differ(wanted)
        if differ is not None:
            key, have, want = differ
            raise ValueprobeError(
                f"store {out} was captured with {key}={have!r}, not {want!r}: "
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
        if store._first_bad_shard() is not None:  # keep the good prefix; recapture from the first bad shard
            good: list[Shard] = []
            for shard in manifest.shards:
                store.manifest = replace(manifest, shards=(*good, shard))
                if store._first_bad_shard() is not None:
                    break
                good.append(shard)
            manifest = replace(manifest, shards=tuple(good), complete=False)
        return manifest
    check_store_out(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueprobeError(f"cannot create store folder {out}: {exc.strerror}") from None
    return wanted


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
