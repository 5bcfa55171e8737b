"""The record base: a frozen dataclass's ``to_dict`` / ``from_dict`` derived from its fields.

    >>> @dataclass(frozen=True)
    ... class Curve(Record):
    ...     KEYS: ClassVar = {"alphas": "alpha"}   # the JSON key where it is not the field's name
    ...     alphas: tuple[float, ...]
    >>> Curve((0.0, 1.0)).to_dict()
    {'alpha': [0.0, 1.0]}
    >>> Curve.from_dict({"alpha": [0.0, 1.0]})
    Curve(alphas=(0.0, 1.0))

``to_dict`` writes one key per field, in field order: nested records as their ``to_dict``, tuples
and lists as lists, enums by value, paths as text, dict keys as text. NaN stays a float here; the
file writer's `valueprobe.files.jsonable` turns it into ``null``. ``from_dict`` reads each key back
by the field's annotation (`from_jsonable`), ignores keys it does not know (a newer writer may add
some) and gives a missing key the field's default.

A file's layout that is not one key per field is said by class variables, not by a hand-written
method: ``KEYS`` renames, ``OMIT`` leaves a key out at one value (a key added after files were
written without it, so old files keep their bytes), ``INLINE`` writes a nested record's keys into
this one, and ``FORMAT`` / ``FORMAT_VERSION`` head a versioned file (probe.json, a store's
manifest, shift.json) and refuse a newer one in one line. What is left (a key derived from others,
a legacy key) is the ``_written`` / ``_read`` hook of the one class that needs it.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from valueprobe.errors import ValueprobeError
from valueprobe.version import __version__

__all__ = ["Record", "from_jsonable", "insert_after", "record_from_dict", "refuse_newer", "to_json"]

R = TypeVar("R")
Rec = TypeVar("Rec", bound="Record")


class Record:
    """Mixin for a frozen dataclass whose JSON is one key per field (see the module docstring).

    Class variables say where the file differs from that:

    - ``KEYS``: field → JSON key, where they differ (``{"alphas": "alpha"}``);
    - ``OMIT``: field → the value at which its key is left out, and which a missing key reads as;
    - ``INLINE``: fields holding a record whose keys are written into this dict, not under a key;
    - ``FORMAT`` / ``FORMAT_VERSION``: the ``format`` and ``format_version`` keys of a versioned
      file, written first (``FORMAT_AT = "end"``: last); `from_dict` refuses a newer version and
      another format (``LEGACY_FORMATS``: names it was once written with) in one line.
    """

    KEYS: ClassVar[Mapping[str, str]] = {}
    OMIT: ClassVar[Mapping[str, Any]] = {}
    INLINE: ClassVar[tuple[str, ...]] = ()
    FORMAT: ClassVar[str | None] = None
    FORMAT_VERSION: ClassVar[int] = 1
    FORMAT_AT: ClassVar[Literal["start", "end"]] = "start"
    LEGACY_FORMATS: ClassVar[tuple[str, ...]] = ()  # other names a file of this format was written with

    def to_dict(self) -> dict[str, Any]:
        """The record's JSON object (NaN still a float: the file writer sanitises)."""
        out: dict[str, Any] = {}
        for name in _names(type(self)):
            value = getattr(self, name)
            if name in self.OMIT and _same(value, self.OMIT[name]):
                continue
            if name in self.INLINE:
                out.update(to_json(value))
            else:
                out[self.KEYS.get(name, name)] = to_json(value)
        out = self._written(out)
        if self.FORMAT is None:
            return out
        head = {"format": self.FORMAT, "format_version": self.FORMAT_VERSION}
        return {**head, **out} if self.FORMAT_AT == "start" else {**out, **head}

    def _written(self, d: dict[str, Any]) -> dict[str, Any]:
        """Hook: the derived dict as the file has it (a derived key, a legacy shape). As is by default."""
        return d

    @classmethod
    def _read(cls, d: Mapping[str, Any]) -> Mapping[str, Any]:
        """Hook: the file's dict as the fields read it (undo `_written`). As is by default."""
        return d

    @classmethod
    def from_dict(cls: type[Rec], d: Mapping[str, Any], *, where: str | Path | None = None) -> Rec:
        """The record again from its ``to_dict()`` (or the JSON of it).

        Args:
            where: the file it was read from, named in a refusal of its format.

        Raises:
            ValueprobeError: another format, a newer version, a missing field or an unreadable value.
        """
        if cls.FORMAT is not None:
            cls._check_format(d, where)
        d = cls._read(d)
        kwargs = dict(d)
        for name, key in cls.KEYS.items():
            if key in d:
                kwargs[name] = d[key]
        for name, value in cls.OMIT.items():
            kwargs.setdefault(name, value)
        for name in cls.INLINE:
            kwargs[name] = d
        try:
            return record_from_dict(cls, kwargs)
        except ValueprobeError as exc:
            if where is None:
                raise
            raise ValueprobeError(f"{where}: {exc}") from None

    @classmethod
    def _check_format(cls, d: Mapping[str, Any], where: str | Path | None) -> None:
        """Refuse another format or a newer version; a dict without ``format`` is this one (a
        record nested in another file keeps no format key of its own)."""
        name = where or cls.__name__
        fmt = d.get("format", cls.FORMAT)
        if fmt != cls.FORMAT and fmt not in cls.LEGACY_FORMATS:
            raise ValueprobeError(f"{name}: not a {cls.FORMAT} file (format {fmt!r})")
        refuse_newer(d.get("format_version", cls.FORMAT_VERSION), reads=cls.FORMAT_VERSION, where=name)


def refuse_newer(version: Any, *, reads: int, where: str | Path, what: str = "") -> None:
    """One line when a file's ``format_version`` is newer than this valueprobe reads.

    >>> refuse_newer(2, reads=1, where="probes/x/probe.json")
    Traceback (most recent call last):
    ValueprobeError: probes/x/probe.json: format_version 2 is newer than this valueprobe 0.1.0 reads (1): ...
    """
    if isinstance(version, int) and not isinstance(version, bool) and version > reads:
        raise ValueprobeError(
            f"{where}: {what}format_version {version} is newer than this valueprobe {__version__}"
            f" reads ({reads}): upgrade valueprobe (pip install -U valueprobe)"
        )


def insert_after(d: Mapping[str, Any], key: str, **extra: Any) -> dict[str, Any]:
    """``d`` with ``extra``'s keys right after ``key`` (a `Record._written` hook's derived keys).

    >>> insert_after({"a": 1, "c": 3}, "a", b=2)
    {'a': 1, 'b': 2, 'c': 3}
    """
    out: dict[str, Any] = {}
    for k, v in d.items():
        out[k] = v
        if k == key:
            out.update(extra)
    return out


# Per record class, looked up once: a sweep writes and resumes its rows by the thousand, and
# resolving annotations (get_type_hints) per row made reading them 40x slower.
_NAMES: dict[type, tuple[str, ...]] = {}
_READERS: dict[type, tuple[tuple[str, Any], ...]] = {}


def _fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    """A record class's dataclass fields, in order (a Record that is not a dataclass is a bug)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} derives from Record but is not a dataclass")
    return dataclasses.fields(cls)


def _names(cls: type) -> tuple[str, ...]:
    """The field names of a record class, in order."""
    if cls not in _NAMES:
        _NAMES[cls] = tuple(f.name for f in _fields(cls))
    return _NAMES[cls]


def _readers(cls: type) -> tuple[tuple[str, Any], ...]:
    """(name, annotation) of each field ``__init__`` takes."""
    if cls not in _READERS:
        hints = get_type_hints(cls)
        _READERS[cls] = tuple((f.name, hints[f.name]) for f in _fields(cls) if f.init)
    return _READERS[cls]


def _same(value: Any, omitted: Any) -> bool:
    return value is omitted if omitted is None else bool(value == omitted)


def to_json(value: Any) -> Any:
    """The JSON form of one field's value: records by their ``to_dict``, tuples as lists, enums by
    value, paths as text, int and enum dict keys as text; numbers, text, None and plain JSON as
    they are."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Enum):
        return value.value
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {_key(k): to_json(v) for k, v in value.items()}
    if isinstance(value, Path):
        return str(value)
    return value


def _key(k: Any) -> Any:
    # an int key is text in JSON (as json.dumps writes it, but before a sort_keys sorts it)
    if isinstance(k, Enum):
        return k.value
    return str(k) if isinstance(k, int) and not isinstance(k, bool) else k


def from_jsonable(tp: Any, value: Any) -> Any:
    """The value of type ``tp`` whose JSON form (`jsonable`) is ``value``: the way back from the JSON edge.

    Lists become the annotated tuples, string keys the annotated ints, ``null`` a NaN where the
    type is a plain ``float`` (``float | None`` keeps None), nested records come back through
    their ``from_dict`` (or `record_from_dict`).

    >>> from_jsonable(tuple[float, float], [0.5, None])
    (0.5, nan)
    >>> from_jsonable(dict[int, tuple[int, ...]], {"3": [1, 2]})
    {3: (1, 2)}
    """
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        for option in options[:-1]:
            try:
                return from_jsonable(option, value)
            except (TypeError, ValueError, KeyError, AttributeError):
                continue
        return from_jsonable(options[-1], value)
    if tp is float:
        return float("nan") if value is None else float(value)
    if tp in (int, str, bool):
        if not isinstance(value, (int, float, str, bool)):
            raise TypeError(f"expected {tp.__name__}, got {type(value).__name__}")
        return tp(value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_jsonable(args[0], v) for v in value)
        return tuple(from_jsonable(a, v) for a, v in zip(args, value, strict=True))
    if origin is list:
        return [from_jsonable(args[0], v) for v in value]
    if origin in (dict, Mapping):
        key, item = args
        return {from_jsonable(key, k): from_jsonable(item, v) for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        rebuild = getattr(tp, "from_dict", None)
        return rebuild(value) if rebuild is not None else record_from_dict(tp, value)
    if isinstance(tp, type) and issubclass(tp, Enum):
        return tp(value)
    if tp is Path:
        return Path(value)
    return value  # Any, dict, list: plain JSON


def record_from_dict(cls: type[R], d: Mapping[str, Any]) -> R:
    """The record ``cls`` (a dataclass) from a dict with one key per field, each read by its annotation.

    Unknown keys are ignored (a newer writer may add some); a missing key takes the field's default.

    Raises:
        ValueprobeError: a field without a default is missing, or a value has the wrong shape.
    """
    kwargs = {}
    for name, tp in _readers(cls):
        if name not in d:
            continue
        try:
            kwargs[name] = from_jsonable(tp, d[name])
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise ValueprobeError(f"{cls.__name__}.{name}: unreadable value ({exc})") from None
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ValueprobeError(f"{cls.__name__}: a field is missing from the record ({exc})") from None
