r"""The four corruptions of the code family, each an edit of one function's source.

    >>> import random
    >>> from valueprobe.datasets.code_edits import corrupt
    >>> corrupt("def f(x):\n    return x + 1\n", "logic", random.Random(0))
    ('def f(x):\n    return x + 0\n', 'constant 1 -> 0 on line 2')

``shuffled``: the body lines in a new order; ``renamed``: parameters, locals and the name
obfuscated consistently; ``syntax``: one edit ``ast.parse`` rejects; ``logic``: one edit that
still parses and changes the AST. :mod:`valueprobe.datasets.code_corruption` mines the functions
and builds the dataset with these.
"""

from __future__ import annotations

import ast
import builtins
import io
import keyword
import random
import string
import tokenize

from valueprobe.errors import ValueprobeError

__all__ = [
    "BUILTIN_NAMES",
    "SUBTYPES",
    "break_syntax",
    "corrupt",
    "inject_logic_bug",
    "parses",
    "rename_identifiers",
    "shuffle_lines",
    "signature_lines",
]

SUBTYPES = ("shuffled", "renamed", "syntax", "logic")
BUILTIN_NAMES = frozenset(dir(builtins))  # never chosen as an obfuscated name; free in a mined function


def parses(src: str) -> bool:
    try:
        ast.parse(src)
    except (SyntaxError, ValueError):
        return False
    return True


def _same_ast(a: str, b: str) -> bool:
    return ast.dump(ast.parse(a)) == ast.dump(ast.parse(b))


def signature_lines(src: str) -> int:
    """How many lines the ``def ...:`` header spans."""
    fn = ast.parse(src).body[0]
    assert isinstance(fn, ast.FunctionDef)
    return fn.body[0].lineno - 1


def shuffle_lines(src: str, rng: random.Random) -> str:
    """The body lines in a new order, each keeping its own indentation; never equal to ``src``."""
    lines = src.rstrip("\n").split("\n")
    head = signature_lines(src)
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
        if name not in taken and not keyword.iskeyword(name) and name not in BUILTIN_NAMES:
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
    return _pick(options, rng, lambda new: not parses(new))


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
    return _pick(options, rng, lambda new: parses(new) and not _same_ast(new, src))


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
