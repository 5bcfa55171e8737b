"""A CPU stand-in for ``torch.cuda.set_sync_debug_mode("error")``: count the host syncs that
valueprobe's own code makes, by the line that makes them.

On a GPU a decode step that asks the host for a value (``.item()``, ``.tolist()``, ``.cpu()``,
``bool(t)``, ``.numpy()``, a boolean-mask index, ``nonzero``, ``bincount``, ``unique``) or copies host data to the device
(``.to(device)``, ``torch.tensor(..., device=)``) waits for the GPU to drain. On a CPU these
cost nothing, so nothing would notice one coming back. `SyncCount` patches those calls and
counts each one whose caller (the first frame outside torch) is a valueprobe source line.

A sync made once per call (α to the device, the results to the host) is fine; one made every
step is not. `grown` compares two counts of the same call at two decode lengths and names
each line whose count grew with the number of steps beyond what it is allowed (a checkpoint
every ``--every`` tokens, or one copy per step for a streaming server).

    >>> with SyncCount() as short: run(tokens=6)
    >>> with SyncCount() as long: run(tokens=12)
    >>> assert not grown(short, long, steps=6), grown(short, long, steps=6)

Every ``.to(device)`` is counted, even one that moves nothing: on a CPU the test cannot tell a
host tensor from a device one, so the rule is "no ``.to(device)`` inside a step".
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

import valueprobe

_PACKAGE = str(Path(valueprobe.__file__).parent) + "/"
_TORCH = str(Path(torch.__file__).parent) + "/"
_ROOT = str(Path(valueprobe.__file__).parent.parent) + "/"

# Tensor methods that hand a device value to the host (each one a sync on a GPU).
_TO_HOST = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__")


def _where(roots: tuple[str, ...]) -> str | None:
    """The line that made the call (three frames up: `_where`, `SyncCount._note`, the patched
    call), or None when the first caller outside torch is not under one of ``roots``."""
    frame = sys._getframe(3)
    while frame is not None and frame.f_code.co_filename.startswith(_TORCH):
        frame = frame.f_back
    if frame is None or not frame.f_code.co_filename.startswith(roots):
        return None
    return f"{frame.f_code.co_filename.removeprefix(_ROOT)}:{frame.f_lineno} in {frame.f_code.co_name}"


def _masked(index: Any) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


def _moves(args: tuple, kwargs: dict) -> bool:
    """Whether a ``.to(...)`` call names a device (or a tensor whose device it takes)."""
    if "device" in kwargs or "other" in kwargs:
        return True
    return bool(args) and isinstance(args[0], (str, torch.device, int, torch.Tensor))


class SyncCount:
    """Counts, per valueprobe line, the calls that sync a GPU (see the module doc)."""

    def __init__(self, *, roots: tuple[str, ...] = (_PACKAGE,)) -> None:
        self.roots = roots  # whose lines count: valueprobe's (a test of the guard adds its own)
        self.counts: Counter[tuple[str, str]] = Counter()
        self._saved: list[tuple[Any, str, Any]] = []

    def _note(self, what: str) -> None:
        where = _where(self.roots)
        if where is not None:
            self.counts[(where, what)] += 1

    def _patch(self, owner: Any, name: str, make: Any) -> None:
        self._saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
        setattr(owner, name, make(getattr(owner, name)))

    def __enter__(self) -> SyncCount:
        note = self._note

        def host(name: str) -> Any:
            def make(real: Any) -> Any:
                def wrapped(self: torch.Tensor, *a: Any, **k: Any) -> Any:
                    note(f"Tensor.{name}")
                    return real(self, *a, **k)

                return wrapped

            return make

        def to(real: Any) -> Any:
            def wrapped(self: torch.Tensor, *a: Any, **k: Any) -> Any:
                if _moves(a, k):
                    note("Tensor.to(device)")
                return real(self, *a, **k)

            return wrapped

        def make_tensor(name: str) -> Any:
            def make(real: Any) -> Any:
                def wrapped(*a: Any, **k: Any) -> Any:
                    if k.get("device") is not None:
                        note(f"torch.{name}(device=)")
                    return real(*a, **k)

                return wrapped

            return make

        for name in _TO_HOST:
            self._patch(torch.Tensor, name, host(name))
        self._patch(torch.Tensor, "to", to)
        self._patch(torch.Tensor, "cuda", host("cuda"))
        # boolean-mask indexing through a torch function mode: patching ``Tensor.__getitem__`` and
        # deleting it again leaves CPython's sequence slot set on the class, after which
        # ``torch.tensor([list(t)])`` takes 0-d tensors for sequences in every later test
        self._mode = _MaskIndexing(note)
        self._mode.__enter__()
        for name in ("tensor", "as_tensor"):
            self._patch(torch, name, make_tensor(name))
        # output sizes known only from the data: the host waits for them on a GPU
        for name in ("nonzero", "bincount", "unique", "masked_select"):
            self._patch(torch, name, host(name))
        for name in ("bincount", "unique", "masked_select"):
            self._patch(torch.Tensor, name, host(name))
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(None, None, None)
        for owner, name, old in reversed(self._saved):
            if old is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
        self._saved.clear()


_MISSING = object()


class _MaskIndexing(TorchFunctionMode):
    """Counts ``t[mask]`` and ``t[mask] = v`` with a boolean index (the host learns how many)."""

    def __init__(self, note: Any) -> None:
        super().__init__()
        self.note = note

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is torch.Tensor.__getitem__ and _masked(args[1]):
            self.note("boolean-mask index")
        elif func is torch.Tensor.__setitem__ and _masked(args[1]):
            self.note("boolean-mask assignment")
        return func(*args, **(kwargs or {}))


def grown(
    short: SyncCount, long: SyncCount, *, steps: int, allowed: dict[str, int] | None = None
) -> list[str]:
    """The lines whose sync count grew by more than allowed when decoding ``steps`` more tokens.

    ``allowed`` maps a piece of the report line (``rows.py``, ``in _cpu_shortlist_pick``) to the
    growth it may show (e.g. the checkpoints in those extra steps); every other line must not grow."""
    allowed = allowed or {}
    out = []
    for key in sorted(set(long.counts) | set(short.counts)):
        where, what = key
        more = long.counts[key] - short.counts[key]
        budget = next((n for name, n in allowed.items() if name in f"{where}: {what}"), 0)
        if more > budget:
            out.append(f"{where}: {what} ×{more} more over {steps} more decode steps (allowed {budget})")
    return out
