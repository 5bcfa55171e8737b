"""Code family: real Python functions from the interpreter's standard library, and four corruptions.

    valueprobe datasets build --family code --out data --seed 0

Functions are mined with :mod:`ast` from ``sysconfig.get_paths()["stdlib"]``: top-level, undecorated,
self-contained (every name they read is a parameter, a local, an in-function import or a builtin),
5–40 lines once the docstring, comment-only lines and blank lines are dropped. The output therefore
depends on the Python version (recorded in ``meta.python``); the committed ``data/code.jsonl`` was
built with Python 3.11. Each original (``code/original``, label 1) has four corrupted twins (label 0,
``meta.pair`` = the original's id):

* ``code/shuffled``: the body lines in a new order (the signature stays first); never the original;
* ``code/renamed``: parameters, locals and the function name replaced by obfuscated names,
  consistently, by position from the AST (attributes and keyword names untouched); it parses;
* ``code/syntax``: one edit that makes ``ast.parse`` fail;
* ``code/logic``: one operator swap, constant change, off-by-one or condition flip that still
  parses and changes the AST.

The corruptions themselves are in :mod:`valueprobe.datasets.code_edits`. The source is the Python
standard library, under the PSF License Agreement.
"""

from __future__ import annotations

import ast
import functools
import random
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from valueprobe.datasets.code_edits import (
    BUILTIN_NAMES,
    SUBTYPES,
    break_syntax,
    corrupt,
    inject_logic_bug,
    parses,
    rename_identifiers,
    signature_lines,
)
from valueprobe.datasets.io import Example
from valueprobe.errors import ValueprobeError

DEFAULT_N = 200
_SKIP_DIRS = frozenset(
    {
        "test",
        "tests",
        "idlelib",
        "tkinter",
        "turtledemo",
        "lib2to3",
        "ensurepip",
        "site-packages",
        "dist-packages",
        "__phello__",
        "__pycache__",
    }
)


@dataclass(frozen=True)
class MinedFunction:
    """A mined standard-library function: cleaned source plus where it came from."""

    source: str  # dedented, no docstring / comment-only / blank lines, trailing newline
    path: str  # relative to the stdlib root, "/"-separated
    name: str
    lineno: int


def _bound_names(fn: ast.FunctionDef) -> tuple[set[str], set[str]]:
    """(names the function reads, names it binds) over its whole body, nested scopes included."""
    loads: set[str] = set()
    bound = {fn.name}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif (
            isinstance(node, (ast.ExceptHandler, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.name
        ):
            bound.add(node.name)
    return loads, bound


def _clean_source(lines: list[str], fn: ast.FunctionDef) -> str | None:
    """The function's lines without docstring, comment-only and blank lines; None if unusable."""
    skip: set[int] = set()
    body0 = fn.body[0]
    if (
        isinstance(body0, ast.Expr)
        and isinstance(body0.value, ast.Constant)
        and isinstance(body0.value.value, str)
    ):
        skip.update(range(body0.lineno, (body0.end_lineno or body0.lineno) + 1))
        if len(fn.body) == 1:
            return None
    kept = []
    for ln in range(fn.lineno, (fn.end_lineno or fn.lineno) + 1):
        line = lines[ln - 1].rstrip()
        if ln in skip or not line.strip() or line.strip().startswith("#"):
            continue
        kept.append(line)
    if not kept:
        return None
    indent = len(kept[0]) - len(kept[0].lstrip())
    if any(len(x) - len(x.lstrip()) < indent for x in kept):
        return None  # a continuation line outdented past the def: keep it simple and skip
    return "\n".join(x[indent:] for x in kept) + "\n"


def _usable(fn: ast.FunctionDef) -> bool:
    if fn.decorator_list or any(
        isinstance(n, (ast.JoinedStr, ast.Global, ast.Nonlocal)) for n in ast.walk(fn)
    ):
        return False  # f-string inner positions are unreliable before 3.12; globals are not self-contained
    loads, bound = _bound_names(fn)
    return not (loads - bound - BUILTIN_NAMES)


@functools.lru_cache(maxsize=2)
def mine_functions(stdlib: str | None = None) -> tuple[MinedFunction, ...]:
    """All usable functions of the standard library at ``stdlib``, sorted and de-duplicated."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    found: dict[str, MinedFunction] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if set(rel.parts[:-1]) & _SKIP_DIRS or rel.parts[0].startswith("config-"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        lines = text.split("\n")
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or not _usable(node):
                continue
            src = _clean_source(lines, node)
            if src is None or "\t" in src or not 5 <= src.count("\n") <= 40:
                continue
            if max(len(x) for x in src.split("\n")) > 100:
                continue
            try:
                ast.parse(src)
            except SyntaxError:
                continue
            found.setdefault(src, MinedFunction(src, rel.as_posix(), node.name, node.lineno))
    return tuple(sorted(found.values(), key=lambda f: (f.path, f.lineno)))


def _eligible(fn: MinedFunction) -> bool:
    """Every corruption must be possible and keep its invariant."""
    src = fn.source
    body = src.rstrip("\n").split("\n")[signature_lines(src) :]
    if len(set(body)) < 2:
        return False
    probe = random.Random(0)
    try:
        renamed = rename_identifiers(src, probe)
        inject_logic_bug(src, probe)
        break_syntax(src, probe)
    except (ValueprobeError, AssertionError):
        return False
    return parses(renamed) and renamed != src


def max_n() -> int:
    """How many functions this interpreter's standard library can supply."""
    return len(_eligible_functions())


@functools.lru_cache(maxsize=2)
def _eligible_functions() -> tuple[MinedFunction, ...]:
    return tuple(f for f in mine_functions() if _eligible(f))


def generate(*, seed: int = 0, n: int | None = None) -> dict[str, list[Example]]:
    """``n`` original functions and their four corruptions each, as ``{"code": [...]}``.

    >>> rows = generate(seed=0, n=2)["code"]
    >>> [r.group for r in rows[:5]]
    ['code/original', 'code/shuffled', 'code/renamed', 'code/syntax', 'code/logic']
    """
    n = DEFAULT_N if n is None else n
    pool = _eligible_functions()
    if n > len(pool):
        raise ValueprobeError(
            f"--n {n} is more than the code family can mine here: this Python's standard library has"
            f" {len(pool)} usable functions; use --n {len(pool)} or fewer"
        )
    rng = random.Random(f"code:{seed}")
    chosen = sorted(rng.sample(range(len(pool)), n))
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    rows: list[Example] = []
    for i, k in enumerate(chosen):
        fn = pool[k]
        base = f"code-{i:04d}"
        meta = {"source": fn.path, "function": fn.name, "lineno": fn.lineno, "python": py}
        rows.append(Example(id=base, label=1, group="code/original", text=fn.source, meta=meta))
        for subtype in SUBTYPES:
            text, what = corrupt(fn.source, subtype, rng)
            rows.append(
                Example(
                    id=f"{base}-{subtype}",
                    label=0,
                    group=f"code/{subtype}",
                    text=text,
                    meta={**meta, "pair": base, "corruption": what},
                )
            )
    return {"code": rows}
