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

The source is the Python standard library, under the PSF License Agreement.
"""

from __future__ import annotations

import ast
import builtins
import functools
import io
import keyword
import random
import string
import sys
import sysconfig
import tokenize
from dataclasses import dataclass
from pathlib import Path

from valueprobe.datasets.io import Example
from valueprobe.errors import ValueprobeError

DEFAULT_N = 200
SUBTYPES = ("shuffled", "renamed", "syntax", "logic")
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
_BUILTINS = frozenset(dir(builtins))


@dataclass(frozen=True)
class Function:
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
    return not (loads - bound - _BUILTINS)


@functools.lru_cache(maxsize=2)
def mine_functions(stdlib: str | None = None) -> tuple[Function, ...]:
    """All usable functions of the standard library at ``stdlib``, sorted and de-duplicated."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    found: dict[str, Function] = {}
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
            found.setdefault(src, Function(src, rel.as_posix(), node.name, node.lineno))
    return tuple(sorted(found.values(), key=lambda f: (f.path, f.lineno)))


# --- corruptions ---------------------------------------------------------------------------------


def _parses(src: str) -> bool:
    try:
        ast.parse(src)
    except (SyntaxError, ValueError):
        return False
    return True


def _same_ast(a: str, b: str) -> bool:
    return ast.dump(ast.parse(a)) == ast.dump(ast.parse(b))


def _signature_lines(src: str) -> int:
    """How many lines the ``def ...:`` header spans."""
    fn = ast.parse(src).body[0]
    assert isinstance(fn, ast.FunctionDef)
    return fn.body[0].lineno - 1


def shuffle_lines(src: str, rng: random.Random) -> str:
    """The body lines in a new order, each keeping its own indentation; never equal to ``src``."""
    lines = src.rstrip("\n").split("\n")
    head = _signature_lines(src)
    body = lines[head:]
    if len(set(body)) < 2:
        raise ValueprobeError("cannot shuffle a body with fewer than two distinct lines")
    while True:
        new = body[:]
        rng.shuffle(new)
        if new != body:
            return "\n".join(lines[:head] + new) + "\n"


def _obfuscated(rng: random.Random, taken: set[str]) -> str:
    while True:
        name = rng.choice(string.ascii_lowercase) + "".join(
            rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(rng.randint(1, 3))
        )
        if name not in taken and not keyword.iskeyword(name) and name not in _BUILTINS:
            taken.add(name)
            return name


def rename_identifiers(src: str, rng: random.Random) -> str:
    """Replace the function name, parameters and locals with obfuscated names, by AST position.

    Names bound by ``import``, ``except ... as`` or nested ``def``/``class`` keep their spelling
    (their positions are not in the AST), so every use of them stays consistent.
    """
    tree = ast.parse(src)
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    keep: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            keep.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif (
            isinstance(node, (ast.ExceptHandler, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node is not fn
            and node.name
        ):
            keep.add(node.name)
    # Locals are parameters and assigned names; a local may shadow a builtin, so decide by binding.
    local = {n.arg for n in ast.walk(fn) if isinstance(n, ast.arg)}
    local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    local = (local | {fn.name}) - keep
    edits: list[tuple[int, int, str]] = []  # (line, byte column, old name)
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id in local:
            edits.append((node.lineno, node.col_offset, node.id))
        elif isinstance(node, ast.arg) and node.arg in local:
            edits.append((node.lineno, node.col_offset, node.arg))
    lines = [x.encode("utf-8") for x in src.split("\n")]
    head = lines[fn.lineno - 1]
    name_col = head.index(b"def ") + 4
    edits.append((fn.lineno, name_col, fn.name))
    names = sorted({old for _, _, old in edits})
    taken = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)} | set(names) | keep
    mapping = {old: _obfuscated(rng, taken) for old in names}
    for lineno, col, old in sorted(set(edits), reverse=True):
        line = lines[lineno - 1]
        assert line[col : col + len(old.encode())] == old.encode(), (line, col, old)
        lines[lineno - 1] = line[:col] + mapping[old].encode() + line[col + len(old.encode()) :]
    return b"\n".join(lines).decode("utf-8")


def _tokens(src: str) -> list[tokenize.TokenInfo]:
    return list(tokenize.generate_tokens(io.StringIO(src).readline))


def _replace_at(src: str, start: tuple[int, int], end: tuple[int, int], new: str) -> str:
    """Replace the (row, col) .. (row, col) range of a tokenize token (cols are characters)."""
    lines = src.split("\n")
    (r0, c0), (r1, c1) = start, end
    assert r0 == r1
    line = lines[r0 - 1]
    lines[r0 - 1] = line[:c0] + new + line[c1:]
    return "\n".join(lines)


def _pick(options: list[tuple[str, str]], rng: random.Random, ok) -> tuple[str, str]:
    """Choose a kind of edit first (the text before ' on line'), then an edit of that kind, so rare
    kinds such as off-by-one are not drowned out by common ones."""
    kinds: dict[str, list[tuple[str, str]]] = {}
    for new, what in options:
        kinds.setdefault(_kind(what), []).append((new, what))
    order = sorted(kinds)
    rng.shuffle(order)
    for kind in order:
        group = kinds[kind]
        rng.shuffle(group)
        for new, what in group:
            if ok(new):
                return new, what
    raise ValueprobeError("no edit of the requested kind found")


def _kind(what: str) -> str:
    for k in (
        "deleted the block colon",
        "deleted",
        "misspelled",
        "became",
        "operator",
        "constant",
        "condition",
        "off-by-one",
    ):
        if k in what:
            return k
    return what


def break_syntax(src: str, rng: random.Random) -> tuple[str, str]:
    """One edit that makes ``ast.parse`` fail: returns (source, what was done)."""
    toks = _tokens(src)
    options: list[tuple[str, str]] = []
    for t in toks:
        if t.type == tokenize.OP and t.string in ")]}":
            options.append(
                (_replace_at(src, t.start, t.end, ""), f"deleted '{t.string}' on line {t.start[0]}")
            )
        if (
            t.type == tokenize.OP
            and t.string == ":"
            and t.line.rstrip().endswith(":")
            and t.end[1] == len(t.line.rstrip())
        ):
            options.append(
                (_replace_at(src, t.start, t.end, ""), f"deleted the block colon on line {t.start[0]}")
            )
        if t.type == tokenize.NAME and t.string in ("def", "return", "for", "while", "if", "else", "in"):
            typo = (
                t.string[1] + t.string[0] + t.string[2:] if len(t.string) > 2 else t.string + t.string[-1] * 2
            )
            options.append(
                (_replace_at(src, t.start, t.end, typo), f"misspelled '{t.string}' on line {t.start[0]}")
            )
        if t.type == tokenize.OP and t.string == "=":
            options.append((_replace_at(src, t.start, t.end, "=="), f"'=' became '==' on line {t.start[0]}"))
    return _pick(options, rng, lambda new: not _parses(new))


_SWAPS = {
    "<": "<=",
    "<=": "<",
    ">": ">=",
    ">=": ">",
    "==": "!=",
    "!=": "==",
    "+": "-",
    "-": "+",
    "+=": "-=",
    "-=": "+=",
    "and": "or",
    "or": "and",
    "is": "is not",
    "True": "False",
    "False": "True",
}


def inject_logic_bug(src: str, rng: random.Random) -> tuple[str, str]:
    """One semantic edit that still parses: returns (source, what was done)."""
    toks = _tokens(src)
    options: list[tuple[str, str]] = []
    for t in toks:
        row = t.start[0]
        if (t.type == tokenize.OP or t.type == tokenize.NAME) and t.string in _SWAPS:
            new = _SWAPS[t.string]
            options.append(
                (_replace_at(src, t.start, t.end, new), f"operator '{t.string}' -> '{new}' on line {row}")
            )
        if t.type == tokenize.NUMBER and t.string.isdigit():
            v = int(t.string)
            new = str(v + 1) if v != 1 else "0"
            options.append(
                (_replace_at(src, t.start, t.end, new), f"constant {t.string} -> {new} on line {row}")
            )
    fn = ast.parse(src).body[0]
    lines = src.split("\n")
    for node in ast.walk(fn):
        if isinstance(node, (ast.If, ast.While)) and node.test.lineno == node.test.end_lineno:
            seg = ast.get_source_segment(src, node.test)
            r = node.test.lineno - 1
            line = lines[r]
            # get_source_segment works in characters; col offsets are bytes, so locate by text
            b = line.encode()
            c0 = len(b[: node.test.col_offset].decode())
            if seg and line[c0 : c0 + len(seg)] == seg:
                new_line = line[:c0] + f"not ({seg})" + line[c0 + len(seg) :]
                new = "\n".join(lines[:r] + [new_line] + lines[r + 1 :])
                options.append((new, f"condition negated on line {r + 1}"))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "range"
            and node.args
        ):
            arg = node.args[-1] if len(node.args) <= 2 else node.args[1]
            if arg.lineno == arg.end_lineno:
                r = arg.lineno - 1
                b = lines[r].encode()
                e = len(b[: arg.end_col_offset].decode())
                delta = rng.choice((" + 1", " - 1"))
                new_line = lines[r][:e] + delta + lines[r][e:]
                options.append(
                    (
                        "\n".join(lines[:r] + [new_line] + lines[r + 1 :]),
                        f"off-by-one in range() on line {r + 1}",
                    )
                )
        if (
            isinstance(node, ast.Subscript)
            and not isinstance(node.slice, (ast.Slice, ast.Tuple))
            and not (isinstance(node.slice, ast.Constant) and not isinstance(node.slice.value, int))
        ):
            idx = node.slice
            if idx.lineno == idx.end_lineno and isinstance(node.ctx, ast.Load):
                r = idx.lineno - 1
                e = len(lines[r].encode()[: idx.end_col_offset].decode())
                delta = rng.choice((" + 1", " - 1"))
                new_line = lines[r][:e] + delta + lines[r][e:]
                options.append(
                    ("\n".join(lines[:r] + [new_line] + lines[r + 1 :]), f"off-by-one index on line {r + 1}")
                )
    return _pick(options, rng, lambda new: _parses(new) and not _same_ast(new, src))


def corrupt(src: str, subtype: str, rng: random.Random) -> tuple[str, str]:
    """Apply one corruption ``subtype`` (see :data:`SUBTYPES`): returns (source, what was done)."""
    if subtype == "shuffled":
        return shuffle_lines(src, rng), "body lines shuffled"
    if subtype == "renamed":
        return rename_identifiers(src, rng), "identifiers renamed"
    if subtype == "syntax":
        return break_syntax(src, rng)
    if subtype == "logic":
        return inject_logic_bug(src, rng)
    raise ValueprobeError(f"unknown code corruption {subtype!r}; choose from {', '.join(SUBTYPES)}")


def _eligible(fn: Function) -> bool:
    """Every corruption must be possible and keep its invariant."""
    src = fn.source
    body = src.rstrip("\n").split("\n")[_signature_lines(src) :]
    if len(set(body)) < 2:
        return False
    probe = random.Random(0)
    try:
        renamed = rename_identifiers(src, probe)
        inject_logic_bug(src, probe)
        break_syntax(src, probe)
    except (ValueprobeError, AssertionError):
        return False
    return _parses(renamed) and renamed != src


def max_n() -> int:
    """How many functions this interpreter's standard library can supply."""
    return len(_eligible_functions())


@functools.lru_cache(maxsize=2)
def _eligible_functions() -> tuple[Function, ...]:
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
