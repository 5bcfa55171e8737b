"""The three methods as items of work: what each computes for items [lo, hi), and how chunks summarize.

    >>> work = METHODS["patch"].prepare(lm, setup)          # pairs read and checked, plan made
    >>> tensors, meta = work.run(0, 1)                       # the first pair, both directions
    >>> res = summarize(identity, [read_chunk(p) for p in chunk_files])   # no model needed

``direct``: an item is an example (its rows' terms, `valueprobe.attribute.direct`); ``patch`` and
``attrib-patch``: an item is a matched pair (`valueprobe.attribute.patching`,
`valueprobe.attribute.gradient`). A chunk holds the items' results as tensors and what the
summary needs as JSON metadata, so `summarize` turns a run's chunks (one process's, or a sharded
run's joined) into the same `Attribution` from the run file's identity alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from valueprobe.activations.capture import Rows
from valueprobe.activations.encode import Encoded
from valueprobe.attribute.components import Component
from valueprobe.attribute.direct import DirectRows, Projector, direct_rows
from valueprobe.attribute.gradient import attrib_pair
from valueprobe.attribute.pairs import PatchPair
from valueprobe.attribute.patching import PatchPlan, pair_runs, patch_pair
from valueprobe.attribute.readout import Readout
from valueprobe.attribute.records import Attribution
from valueprobe.attribute.summary import Header, PairResult, summarize_direct, summarize_patch
from valueprobe.model.load import LoadedModel
from valueprobe.vocab import Target

__all__ = ["DirectWork", "PairWork", "Work", "summarize"]

Tensors = dict[str, torch.Tensor]


class Work(Protocol):
    """A method's items: ``run(lo, hi)`` computes items [lo, hi) as one chunk's tensors and metadata."""

    @property
    def n_items(self) -> int: ...

    @property
    def block(self) -> int:  # items computed together (direct: a batch of examples; patching: one pair)
        ...

    def run(self, lo: int, hi: int) -> tuple[Tensors, dict[str, Any]]: ...


@dataclass(frozen=True)
class DirectWork:
    """Direct attribution of encoded examples; ``units`` names each example's unit (meta.pair or id)."""

    lm: LoadedModel
    projector: Projector
    encoded: tuple[Encoded, ...]
    units: tuple[str, ...]
    batch_size: int

    @property
    def n_items(self) -> int:
        return len(self.encoded)

    @property
    def block(self) -> int:
        return self.batch_size

    def run(self, lo: int, hi: int) -> tuple[Tensors, dict[str, Any]]:
        got = direct_rows(self.lm, self.projector, self.encoded[lo:hi], batch_size=self.batch_size)
        units = [u for e, u in zip(self.encoded[lo:hi], self.units[lo:hi], strict=True) for _ in e.selections]
        r = got.rows
        tensors = {
            "contributions": got.contributions.float(),
            "total": got.total.float(),
            "label": torch.from_numpy(r.label.astype(np.float64)),
            "token_index": torch.from_numpy(r.token_index.astype(np.int64)),
            "n_tokens": torch.from_numpy(r.n_tokens.astype(np.int64)),
        }
        rows = {"example_id": r.example_id, "group": r.group, "span": r.span, "unit": units}
        return tensors, {"rows": rows}


@dataclass(frozen=True)
class PairWork:
    """Patching of matched pairs, exact (``exact``) or by attribution patching, both directions."""

    lm: LoadedModel
    read: Readout
    pairs: tuple[PatchPair, ...]
    plan: PatchPlan
    exact: bool
    batch_size: int
    progress: bool = False  # a bar over each pair's patched runs (exact patching takes minutes a pair)

    @property
    def n_items(self) -> int:
        return len(self.pairs)

    @property
    def block(self) -> int:
        return 1

    def one(self, pair: PatchPair) -> PairResult:
        runs = pair_runs(self.lm, self.read, pair, self.plan)
        out = []
        for dest in (1, 0):  # denoising (the corrupt row gets the clean row's activation), then noising
            if self.exact:
                out.append(
                    patch_pair(
                        self.lm,
                        self.read,
                        pair,
                        self.plan,
                        runs,
                        dest=dest,
                        batch_size=self.batch_size,
                        progress=self.progress,
                    )
                )
            else:
                out.append(attrib_pair(self.lm, self.read, pair, self.plan, runs, dest=dest))
        beh = (
            runs.behaviour
            if runs.behaviour is not None
            else torch.full((2,), float("nan"), dtype=torch.float64)
        )
        tokens = tuple(self.lm.tokenizer.convert_ids_to_tokens(pair.clean.input_ids[pair.first_diff :]))
        read_start = min(t for _, toks in pair.clean.selections for t in toks) - pair.first_diff
        return PairResult(
            pair.name, pair.first_diff, read_start, tokens,
            effects=torch.stack([o[0] for o in out]), grid=torch.stack([o[1] for o in out]),
            base=torch.stack([o[2] for o in out]), runs=torch.stack([runs.read.double(), beh.double()]),
        )  # fmt: skip

    def run(self, lo: int, hi: int) -> tuple[Tensors, dict[str, Any]]:
        tensors: Tensors = {}
        pairs = []
        for i in range(lo, hi):
            pair = self.pairs[i]
            res = self.one(pair)
            for key in ("effects", "grid", "base", "runs"):
                tensors[f"{key}.{i}"] = getattr(res, key).double()
            ids = [pair.clean.example.id, pair.corrupt.example.id]
            pairs.append(
                {
                    "index": i,
                    "name": pair.name,
                    "first_diff": pair.first_diff,
                    "read_start": res.read_start,
                    "tokens": list(res.tokens),
                    "ids": ids,
                }
            )
        return tensors, {"pairs": pairs}


def _direct(
    identity: dict[str, Any],
    header: Header,
    chunks: Sequence[tuple[Tensors, dict]],
    keep: Callable[[str], bool],
) -> Attribution:
    parts, units = [], []
    for tensors, meta in chunks:
        r = meta["rows"]
        rows = Rows(
            r["example_id"],
            tensors["label"].numpy(),
            r["group"],
            r["span"],
            tensors["token_index"].numpy(),
            tensors["n_tokens"].numpy(),
        )
        parts.append(DirectRows(rows, tensors["contributions"], tensors["total"]))
        units += r["unit"]
    got = DirectRows.concat(parts)
    mask = np.array([keep(e) for e in got.rows.example_id], dtype=bool)
    idx = np.flatnonzero(mask)
    got = DirectRows(got.rows.select(idx), got.contributions[idx], got.total[idx])
    terms = [Component.parse(n) for n in identity["components"]]
    return summarize_direct(
        header, got, [units[i] for i in idx], terms, target=Target(identity["target"]),
        n_boot=int(identity["bootstrap"]), seed=int(identity["seed"]),
    )  # fmt: skip


def _pairs(
    identity: dict[str, Any],
    header: Header,
    chunks: Sequence[tuple[Tensors, dict]],
    keep: Callable[[str], bool],
) -> Attribution:
    results = []
    for tensors, meta in chunks:
        for p in meta["pairs"]:
            if not keep(p["ids"][0]):
                continue
            i = p["index"]
            results.append(
                PairResult(p["name"], int(p["first_diff"]), int(p["read_start"]), tuple(p["tokens"]), tensors[f"effects.{i}"],
                           tensors[f"grid.{i}"], tensors[f"base.{i}"], tensors[f"runs.{i}"])
            )  # fmt: skip
    components = [Component.parse(n) for n in identity["components"]]
    return summarize_patch(
        header,
        results,
        components,
        identity["resid_layers"],
        n_boot=int(identity["bootstrap"]),
        seed=int(identity["seed"]),
    )


def summarize(
    identity: dict[str, Any],
    chunks: Sequence[tuple[Tensors, dict]],
    *,
    keep: Callable[[str], bool] = lambda _: True,
) -> Attribution:
    """The `Attribution` of a run's chunks (in item order), from its run file's ``identity``;
    ``keep(example_id)`` selects examples (pairs by their clean row), e.g. the fit half."""
    header = Header(**{**identity["header"], "data": tuple(identity["header"]["data"])})
    if identity["method"] == "direct":
        return _direct(identity, header, chunks, keep)
    return _pairs(identity, header, chunks, keep)
