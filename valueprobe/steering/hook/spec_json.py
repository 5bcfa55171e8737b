"""The JSON form of a steering spec: its format, its keys, and each key's reader.

`valueprobe.steering.hook.spec.SteeringSpec.from_dict` reads a spec file through `PARSERS`, one
reader per key, each refusing a bad value in one line that names the file and the field
(``runs/spec.json: window: expected [a, b] ...``); `check_format` refuses another format or a
newer version, and `recorded_references` reads the σ reference each axis was written in (a
format-1 file recorded none, `valueprobe.probe.units.in_units_of`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from valueprobe.errors import ValueprobeError
from valueprobe.probe.units import BEFORE_REFERENCES
from valueprobe.steering.hook.condition import Condition
from valueprobe.vocab import HookSite, LayerSpec, Op, Unit

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "KEYS",
    "PARSERS",
    "WHERE",
    "Where",
    "bad",
    "check_format",
    "condition_dict",
    "recorded_references",
]

FORMAT = "valueprobe.steering"
FORMAT_VERSION = 2  # 2: records the σ reference of its axes (format 1 was written before the neutral one)
Where = Literal["prompt", "generated", "all"]
WHERE: tuple[str, ...] = ("prompt", "generated", "all")

KEYS: tuple[str, ...] = (
    "format", "format_version", "probe", "layers", "site", "unit", "op", "lo", "hi", "target",
    "positions", "window", "condition", "read_layer", "direction", "direction_name", "sigma_reference",
)  # fmt: skip


def bad(where: str, key: str, text: str) -> ValueprobeError:
    return ValueprobeError(f"{where}: {key}: {text}")


def check_format(d: Mapping[str, Any], where: str) -> None:
    if d.get("format", FORMAT) != FORMAT:
        raise bad(where, "format", f"{d.get('format')!r} is not a steering spec ({FORMAT!r})")
    version = d.get("format_version", FORMAT_VERSION)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise bad(where, "format_version", f"expected a whole number >= 1, got {version!r}")
    if version > FORMAT_VERSION:
        raise bad(where, "format_version", f"{version} is newer than this valueprobe reads: upgrade it")


def recorded_references(d: Mapping[str, Any], where: str) -> tuple[str | None, ...]:
    """The σ reference recorded for each probe; a format-1 file recorded none (`in_units_of`)."""
    n = len(d["probe"]) if isinstance(d.get("probe"), list) else 1
    if d.get("format_version", FORMAT_VERSION) < 2:
        return (BEFORE_REFERENCES,) * n
    refs = d.get("sigma_reference", [None] * n)  # none recorded (a sweep's settings): as they are
    if not (isinstance(refs, list) and len(refs) == n and all(isinstance(r, str | None) for r in refs)):
        raise bad(where, "sigma_reference", f"expected one text (or null) per probe ({n}), got {refs!r}")
    return tuple(refs)


def _number(value: Any, where: str, key: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad(where, key, f"expected a finite number, got {value!r}")
    return float(value)


def _whole(value: Any, where: str, key: str) -> int | None:
    return None if value is None else _index(value, where, key)


def _index(value: Any, where: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(where, key, f"expected a whole layer index, got {value!r}")
    return value


def _text(value: Any, where: str, key: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise bad(where, key, f"expected a non-empty string, got {value!r}")
    return value


def _one_of(allowed: Sequence[str], default: str | None) -> Any:
    def parse(value: Any, where: str, key: str) -> str | None:
        if value is None and default is not None:
            return default
        if value is not None and value not in allowed:
            raise bad(where, key, f"{value!r} is not one of {', '.join(allowed)}")
        return value

    return parse


def _probe(value: Any, where: str, key: str) -> str | tuple[str, ...]:
    if isinstance(value, list) and value:
        return tuple(_text(v, where, key) or "" for v in value)
    text = _text(value, where, key)
    if text is None:
        raise bad(where, key, "missing: give the probe folder (probes/NAME), or a list of them")
    return text


def _layer_spec(value: Any, where: str, key: str) -> LayerSpec:
    if isinstance(value, list):
        if not value or any(v is None for v in value):
            raise bad(where, key, f"expected whole layer indices, got {value!r}")
        return tuple(_index(v, where, key) for v in value)
    if value is None or isinstance(value, str):
        return value
    return _whole(value, where, key)


def _window(value: Any, where: str, key: str) -> tuple[int, int] | None:
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 2):
        raise bad(where, key, f"expected [a, b] (generated tokens a <= i < b), got {value!r}")
    if any(v is None for v in value):
        raise bad(where, key, f"expected [a, b] (generated tokens a <= i < b), got {value!r}")
    a, b = (_index(v, where, key) for v in value)
    return (a, b)


def _vector(value: Any, where: str, key: str) -> Tensor | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise bad(where, key, "expected a list of finite numbers (a vector of d_model)")
    return torch.tensor([_number(v, where, key) for v in value], dtype=torch.float32)


def _condition(value: Any, where: str, key: str) -> Condition | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) - {"threshold", "when", "latch", "probe"}:
        raise bad(
            where,
            key,
            'expected {"threshold": σ, "when": "above"|"below", "latch": bool, "probe": folder|null}',
        )
    latch = value.get("latch", False)
    if not isinstance(latch, bool):
        raise bad(where, f"{key}.latch", f"expected true or false, got {latch!r}")
    threshold = _number(value.get("threshold"), where, f"{key}.threshold")
    if threshold is None:
        raise bad(where, f"{key}.threshold", "missing: give the threshold in σ")
    when = _one_of(("above", "below"), "above")(value.get("when"), where, f"{key}.when")
    return Condition(
        threshold, when=when, latch=latch, probe=_text(value.get("probe"), where, f"{key}.probe")
    )


PARSERS: dict[str, Any] = {
    "probe": _probe,
    "layers": _layer_spec,
    "site": _one_of([s.value for s in HookSite], None),
    "unit": _one_of([u.value for u in Unit], Unit.sigma.value),
    "op": _one_of([o.value for o in Op], Op.add.value),
    "lo": _number,
    "hi": _number,
    "target": _number,
    "positions": _one_of(WHERE, "all"),
    "window": _window,
    "condition": _condition,
    "read_layer": _whole,
    "direction": _vector,
    "direction_name": _text,
}


def condition_dict(c: Condition, *, check: bool = True) -> dict[str, Any]:
    if check and c.axis is not None and c.probe is None:
        raise ValueprobeError(
            "the spec's condition reads another axis: give Condition(probe=...) (its folder) to save it"
        )
    return {"threshold": c.threshold, "when": c.when, "latch": c.latch, "probe": c.probe}
