"""A griffe extension for the API reference (mkdocs.yml, mkdocstrings ``extensions``): valueprobe's
docstrings read as markdown. The ``>>>`` examples become Python code blocks, and Sphinx roles
(``:func:`x` ``) plain code.

The docstrings are written for ``help()`` and the source (a usage line, ``>>>`` examples),
where a ``>>>`` line at the left margin is plain text; in markdown it would be a quotation, and
``x[:3]`` in it a link. Each run of ``>>>`` / ``...`` lines and the output lines after them, up to a
blank line, is fenced as ``pycon``. Lines indented four spaces are already code in markdown and are
left alone.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

# :func:`x`, :class:`~a.b.C`, :meth:`...`: the role goes, the name stays code (a leading ~ dropped)
ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj):`~?([^`]+)`")


def fence_doctests(text: str) -> str:
    """``text`` with every left-margin doctest run fenced.

    >>> fence_doctests(">>> 1 + 1\\n2")
    '```pycon\\n>>> 1 + 1\\n2\\n```'
    """
    out: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        indent = len(line) - len(line.lstrip(" "))
        if indent < 4 and line.lstrip(" ").startswith(">>>"):
            pad = " " * indent
            out.append(f"{pad}```pycon")
            while i < len(lines) and lines[i].strip() and lines[i].startswith(pad):
                out.append(lines[i])
                i += 1
            out.append(f"{pad}```")
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def plain_roles(text: str) -> str:
    """``text`` with Sphinx roles as plain code.

    >>> plain_roles("see :func:`valueprobe.load` and :class:`~valueprobe.ValueAxis`")
    'see `valueprobe.load` and `valueprobe.ValueAxis`'
    """
    return ROLE.sub(r"`\1`", text)


class DocstringsAsMarkdown(griffe.Extension):
    """Fence the doctest examples and unwrap the roles of every object's docstring as it is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(fence_doctests(obj.docstring.value))
