"""Option groups: options that go together, taken by a command as one parameter.

    @app.command("trace")
    @grouped
    def trace_command(prompt: ..., steering: SpecOptions = SpecOptions(), load: LoadOptions = LoadOptions()):
        spec = steering.spec().check()        # before the model loads
        lm = load.check().load(model)

A group is a frozen dataclass marked by `OptionGroup` whose fields are typer options
(``Annotated[T, typer.Option(...)]``, each with a default). `grouped` shows typer every field of
every group a command takes as one option of the command, named as the field, gathers them back
into the group and calls the command with it. So a command's own signature stays short (a group is
one parameter: tests/test_layout.py's 12-parameter rule counts it once), and every command that
takes a group spells its options alike. A command sets its own defaults with the group's default
instance: ``decoding: DecodingOptions = DecodingOptions(max_new_tokens=128)``.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable
from dataclasses import fields
from typing import Annotated, Any, ClassVar, TypeVar, cast, get_args, get_origin, get_type_hints

from typer.models import ParameterInfo

__all__ = ["OptionGroup", "grouped"]

F = TypeVar("F", bound=Callable[..., Any])


class OptionGroup:
    """Marks a dataclass whose fields are options a command takes together (see the module doc);
    ``panel`` titles the group's box in ``--help``."""

    panel: ClassVar[str] = "Options"


def _in_panel(annotation: Any, panel: str) -> Any:
    """The option's annotation with its typer info shown under ``panel`` (unless it names its own)."""
    if get_origin(annotation) is not Annotated:
        return annotation
    tp, *meta = get_args(annotation)
    shown = []
    for m in meta:
        if isinstance(m, ParameterInfo) and m.rich_help_panel is None:
            m = copy.copy(m)
            m.rich_help_panel = panel
        shown.append(m)
    # Annotated built from values at run time, which mypy's static annotations cannot express
    annotated: Any = Annotated
    return annotated[(tp, *shown)]


def _is_group(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, OptionGroup)


def grouped(command: F) -> F:
    """``command`` with each option-group parameter shown to typer as the group's options."""
    hints = get_type_hints(command, include_extras=True)
    params: list[inspect.Parameter] = []
    groups: dict[str, tuple[type, list[str]]] = {}
    for p in inspect.signature(command).parameters.values():
        annotation = hints.get(p.name, p.annotation)
        if not _is_group(annotation):
            params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=annotation))
            continue
        default = annotation() if p.default is inspect.Parameter.empty else p.default
        field_hints = get_type_hints(annotation, include_extras=True)
        names = [f.name for f in fields(annotation)]
        groups[p.name] = (annotation, names)
        params += [
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=_in_panel(field_hints[name], annotation.panel),
                default=getattr(default, name),
            )
            for name in names
        ]
    seen = [p.name for p in params]
    twice = sorted({n for n in seen if seen.count(n) > 1})
    if twice:
        raise TypeError(f"{command.__name__}: options named twice by its groups and parameters: {twice}")

    @functools.wraps(command)
    def run(**kwargs: Any) -> Any:
        for name, (group, names) in groups.items():
            kwargs[name] = group(**{n: kwargs.pop(n) for n in names})
        return command(**kwargs)

    # typer reads the signature the wrapper carries: the options, not F's parameters
    wrapper: Any = run
    wrapper.__signature__ = inspect.Signature(params)
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return cast(F, wrapper)
