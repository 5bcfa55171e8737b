"""Activation stores seen as one table, and whole-group train/val/test splits.

:class:`Source` is what :mod:`valueprobe.probe.layer_sweep` and :mod:`valueprobe.probe.transfer` fit on::

    from valueprobe.probe.source import Source, grouped_splits
    src = Source({"icrl": "runs/icrl", "code": "runs/code"})    # targets, groups, shard stream
    for x, rows in src.iter_layer(18): ...                      # x: [rows, d_model] float64
    splits = grouped_splits(src.group[src.keep], src.y[src.keep], n_splits=5)

Targets: in a store whose rows carry ``pre``/``post`` span labels (ICRL), positive = ``post``
rows and negative = ``pre`` rows, other rows are ignored; otherwise the example label
(``>= 0.5`` = success).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from valueprobe.activations.capture import Rows
from valueprobe.activations.manifest import StoreManifest
from valueprobe.activations.store import ActivationStore
from valueprobe.errors import ValueprobeError
from valueprobe.model.fingerprint import check_records
from valueprobe.probe.baselines import PositionScores
from valueprobe.vocab import LayerKey, LayerSelection, LayerSpec, Target, layer_ranges


class StoreLike(Protocol):
    """What a :class:`Source` reads: an :class:`~valueprobe.activations.store.ActivationStore`, or a test double."""

    path: Path
    manifest: StoreManifest

    def rows(self) -> Rows: ...
    def iter_shards(
        self, layers: Sequence[LayerKey] | None = None
    ) -> Iterator[tuple[dict[LayerKey, np.ndarray], Rows]]: ...


StoreArg = StoreLike | str | Path
Stores = StoreArg | Sequence[StoreArg] | Mapping[str, StoreArg]


def _open(store: StoreArg) -> StoreLike:
    return ActivationStore.open(store) if isinstance(store, (str, Path)) else store


class Source:
    """One or more stores seen as one table: targets, groups and a per-layer shard stream.

    Columns, one entry per row: ``y`` (bool target), ``keep`` (a fitting row), ``group``,
    ``example_id``, ``family`` (the store's name), and ``position`` (:class:`PositionScores`).

    With several stores, groups and example ids are prefixed ``name:`` so they never collide;
    ``share_groups=True`` keeps group names as they are, for stores that hold matched rows of the
    same groups (ICRL and its control), so a held-out rule is held out in every store.
    """

    def __init__(
        self,
        stores: Stores,
        *,
        target: Target = Target.auto,
        need_both: bool = True,
        share_groups: bool = False,
    ) -> None:
        if isinstance(stores, Mapping):
            named = [(str(k), _open(v)) for k, v in stores.items()]
        else:
            items = (
                [stores] if isinstance(stores, (str, Path)) or not isinstance(stores, Sequence) else stores
            )
            named = [(Path(str(s.path)).name, s) for s in map(_open, items)]
        if not named:
            raise ValueprobeError("no activation store given; pass --store DIR")
        self.names = [n for n, _ in named]
        self.stores = [s for _, s in named]
        first = self.stores[0].manifest
        for name, store in named[1:]:
            m = store.manifest
            if (m.d_model, m.site) != (first.d_model, first.site):
                raise ValueprobeError(
                    f"stores disagree: {self.names[0]} is {first.model_id} ({first.site}, d_model"
                    f" {first.d_model}) but {name} is {m.model_id} ({m.site}, d_model {m.d_model});"
                    " capture every store with the same model and site"
                )
            check_records(first.fingerprint, m.fingerprint, what=f"stores {self.names[0]} and {name}")
        self.model_id, self.fingerprint = first.model_id, first.fingerprint
        self.d_model, self.site = first.d_model, first.site
        self.layers = [x for x in first.layers if all(x in s.manifest.layers for s in self.stores)]
        self.has_embed = all(s.manifest.has_embed for s in self.stores)
        self.n_layers = first.n_layers  # the model's depth: negative layer indices count from it
        parts, self.offsets = [], [0]
        for name, s in named:
            parts.append(self._table(name, s, target, prefix=len(named) > 1, share_groups=share_groups))
            self.offsets.append(self.offsets[-1] + len(parts[-1]["y"]))
        cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        self.y, self.keep, self.group = cols["y"], cols["keep"], cols["group"]
        n_pos, n_neg = int((self.y & self.keep).sum()), int((~self.y & self.keep).sum())
        if need_both and (n_pos == 0 or n_neg == 0):
            what = "post/pre spans" if set(cols["mode"]) == {"span"} else "labels"
            where = ", ".join(f"{n} ({s.path})" for n, s in named)
            raise ValueprobeError(
                f"store {where} has a single class: {n_pos} success and {n_neg} failure rows by {what};"
                " a probe needs both (add the other class, or fit on several stores together)"
            )
        self.example_id = cols["example_id"]
        self.family = cols["family"]
        self.position = PositionScores.of(self.example_id, cols["token_index"], cols["n_tokens"])

    @staticmethod
    def _table(
        name: str, store: StoreLike, target: Target, *, prefix: bool, share_groups: bool
    ) -> dict[str, np.ndarray]:
        rows = store.rows()
        span = np.asarray(rows.span, dtype=str)
        is_span = np.isin(span, ["pre", "post"])
        mode = (Target.span if is_span.any() else Target.label) if target == Target.auto else target
        if mode == Target.span:
            keep, y = is_span, span == "post"
        else:
            keep, y = np.ones(len(span), dtype=bool), np.asarray(rows.label, dtype=np.float64) >= 0.5
        pre = f"{name}:" if prefix else ""
        return {
            "y": y,
            "keep": keep,
            "group": np.asarray([("" if share_groups else pre) + g for g in rows.group], dtype=str),
            "example_id": np.asarray([pre + e for e in rows.example_id], dtype=str),
            "token_index": np.asarray(rows.token_index, dtype=np.float64),
            "n_tokens": np.asarray(rows.n_tokens, dtype=np.float64),
            "family": np.full(len(span), name, dtype=object),
            "mode": np.full(len(span), mode, dtype=object),
        }

    def check_layer(self, layer: LayerKey) -> None:
        if layer == "embed":
            if not self.has_embed:
                raise ValueprobeError(
                    f"store {self._missing('embed')} has no 'embed' layer; re-capture with include_embed"
                )
        elif layer not in self.layers:
            raise ValueprobeError(
                f"store {self._missing(layer)} has no layer {layer}; layers shared by the stores:"
                f" {layer_ranges(self.layers) if self.layers else 'none'} (re-capture with --layers)"
            )

    def _missing(self, layer: LayerKey) -> str:
        for name, s in zip(self.names, self.stores, strict=True):
            m = s.manifest
            if (layer == "embed" and not m.has_embed) or (layer != "embed" and layer not in m.layers):
                return f"{name} ({s.path})"
        return self.names[0]

    def keys(self, pair_by: str | None) -> np.ndarray | None:
        """Pairing keys for paired fitters; ``auto`` pairs by example when examples hold both classes."""
        if pair_by is None:
            return None
        if pair_by == "auto":
            k = self.keep
            both = set(self.example_id[k & self.y]) & set(self.example_id[k & ~self.y])
            pair_by = "example_id" if both else "group"
        return self.example_id if pair_by == "example_id" else self.group

    def iter_layer(self, layer: LayerKey) -> Iterator[tuple[np.ndarray, slice]]:
        """Yield (x float64 [rows, d_model], global row slice) shard by shard."""
        self.check_layer(layer)
        for i, store in enumerate(self.stores):
            offset = self.offsets[i]
            for acts, rows in store.iter_shards([layer]):
                x = np.asarray(acts[layer], dtype=np.float64)
                n = len(rows)
                bad = ~np.isfinite(x).all(axis=1)
                if bad.any():
                    ids = [rows.example_id[j] for j in np.flatnonzero(bad)[:5]]
                    raise ValueprobeError(
                        f"store {self.names[i]} layer {layer}: NaN or inf in {int(bad.sum())} rows"
                        f" (examples {ids}); re-capture in float32 or drop those examples"
                    )
                yield x, slice(offset, offset + n)
                offset += n
            if offset != self.offsets[i + 1]:
                raise ValueprobeError(
                    f"store {self.names[i]}: shards hold {offset - self.offsets[i]} rows"
                    f" but rows() lists {self.offsets[i + 1] - self.offsets[i]}; re-capture"
                )

    def provenance(self) -> tuple[dict, ...]:
        return tuple(
            {
                "name": n,
                "store": str(s.path),
                "dataset_path": s.manifest.dataset.path,
                "dataset_sha256": s.manifest.dataset.sha256,
                "positions": str(s.manifest.positions),
                "n_rows": self.offsets[i + 1] - self.offsets[i],
            }
            for i, (n, s) in enumerate(zip(self.names, self.stores, strict=True))
        )


@dataclass(frozen=True)
class Split:
    """Disjoint group sets; whole groups are held out."""

    train: frozenset[str]
    val: frozenset[str]
    test: frozenset[str]


def grouped_splits(
    groups: np.ndarray,
    y: np.ndarray,
    *,
    n_splits: int = 5,
    val_frac: float = 0.2,
    test_frac: float = 0.2,
    train_groups: int | None = None,
    seed: int = 0,
) -> list[Split]:
    """Repeated random train/val/test partitions of the groups, each part holding both classes.

    Args:
        groups: [n] group of each row (e.g. the ICRL rule).
        y: [n] bool target of each row.
        train_groups: exact number of training groups (the paper trains on 35 rules); the rest
            is halved into val and test. Otherwise ``val_frac``/``test_frac`` of the groups.
    """
    names = sorted(set(groups.tolist()))
    n = len(names)
    if train_groups is not None:
        n_train = train_groups
        n_val = (n - n_train) // 2
    else:
        n_val, n_test = max(1, round(val_frac * n)), max(1, round(test_frac * n))
        n_train = n - n_val - n_test
    if n < 3 or n_train < 1 or n_val < 1 or n - n_train - n_val < 1:
        raise ValueprobeError(
            f"only {n} groups ({', '.join(names[:5])}{'...' if n > 5 else ''}): too few to hold out whole groups"
            f" for train/val/test (train {n_train}); give at least 3 groups with both classes across them"
        )
    pos_groups = set(groups[y].tolist())
    neg_groups = set(groups[~y].tolist())
    rng = np.random.default_rng(seed)
    splits: list[Split] = []
    for _ in range(n_splits):
        for _attempt in range(500):
            perm = [names[i] for i in rng.permutation(n)]
            parts = perm[:n_train], perm[n_train : n_train + n_val], perm[n_train + n_val :]
            if all(pos_groups & set(p) and neg_groups & set(p) for p in parts):
                splits.append(Split(*(frozenset(p) for p in parts)))
                break
        else:
            raise ValueprobeError(
                f"cannot split {n} groups so that train, val and test each hold both classes"
                f" ({len(pos_groups)} groups have successes, {len(neg_groups)} failures); use groups that mix"
                " both labels (e.g. one group per pair or per rule), or more groups"
            )
    return splits


def resolve_layers(spec: LayerSpec, src: Source) -> list[int]:
    """The stored layers named by ``spec``, parsed by :meth:`valueprobe.vocab.LayerSelection.parse` against
    the model's depth (so ``-4:`` and ``::2`` mean what they mean in capture); "all" or None is
    every layer the stores share. Each named layer must be in every store.

    >>> resolve_layers("::2", Source("runs/icrl"))   # doctest: +SKIP
    [0, 2, 4, ...]
    """
    selection = LayerSelection.parse(spec)
    if selection.parts is None:
        return list(src.layers)
    out = selection.resolve(src.n_layers)
    for layer in out:
        src.check_layer(layer)
    return out
