"""What docs/ARCHITECTURE.md promises about the tree, checked on the syntax tree (issue 29).

- one RNG entry point for directions: only ``stats/null.py`` draws from a normal distribution;
- single homes: a name the issue found defined twice is defined once.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "valueprobe"

# A random direction is a normal draw normalised; every such draw goes through stats/null.py
# (`random_directions` by seed, `unit_directions` on a generator a caller also shuffles with).
# These are the samplers that can make one: numpy's Generator / np.random methods and torch's.
# Uniform draws (the sampler's `torch.rand` for inverse-CDF sampling), permutations, integers and
# choices (bootstrap resampling, splits) and `random.Random` (dataset generators) are not
# directions and stay where they are.
NORMAL_SAMPLERS = {"standard_normal", "normal", "multivariate_normal", "randn", "randn_like", "normal_"}
RNG_HOME = Path("stats/null.py")


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE), ast.parse(path.read_text(encoding="utf-8"))


def normal_draws(tree: ast.AST) -> list[int]:
    """Lines that call a normal sampler (``x.standard_normal(...)``, ``torch.randn(...)``, ...)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in NORMAL_SAMPLERS:
                lines.append(node.lineno)
    return lines


def test_only_stats_null_draws_random_directions():
    outside = [f"{rel}:{line}" for rel, tree in _modules() if rel != RNG_HOME for line in normal_draws(tree)]
    assert not outside, f"draw random directions through valueprobe.stats.null: {outside}"
    assert normal_draws(ast.parse((PACKAGE / RNG_HOME).read_text(encoding="utf-8")))  # the home draws


def test_the_rng_rule_sees_each_kind_of_draw():
    for src in (
        "torch.randn(5, generator=g)",
        "rng.standard_normal((3, 4))",
        "np.random.normal(0, 1, 3)",
        "v.normal_()",
        "randn(3)",
    ):
        assert normal_draws(ast.parse(src)) == [1], src
    assert not normal_draws(ast.parse("torch.rand(1, generator=g); rng.permutation(4); rng.integers(0, 3)"))


def _top_level_functions() -> dict[str, list[str]]:
    where: dict[str, list[str]] = {}
    for rel, tree in _modules():
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                where.setdefault(node.name, []).append(str(rel))
    return where


def test_single_homes():
    where = _top_level_functions()
    for name in ("is_refusal", "null_range", "trace_figure"):
        assert len(where.get(name, [])) == 1, (name, where.get(name))


def _top_level_names() -> dict[str, list[str]]:
    where: dict[str, list[str]] = {}
    for rel, tree in _modules():
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                where.setdefault(node.name, []).append(str(rel))
    return where


# Names issue 29 found meaning two (or three) things; each is now defined in one module at most.
# The α sweep is "sweep" (steering/experiment/sweep.py); the layer sweep's types say "LayerSweep".
ONE_MEANING = ("Target", "Direction", "Step", "Positions", "write_report", "summarize", "SweepResult")
# ... and those a later count found (each was two things in two subpackages)
ONE_MEANING += (
    "Pair",
    "read_pairs",
    "Chunk",
    "Source",
    "Gate",
    "Function",
    "choose",
    "resolve_name",
    "summary_lines",
    "Candidate",
    "check",
)


def test_each_clashing_name_means_one_thing():
    where = _top_level_names()
    clashes = {name: where[name] for name in ONE_MEANING if len(where.get(name, [])) > 1}
    assert not clashes, clashes
    assert "summarise" not in where, where.get("summarise")  # one spelling: summarize
    assert not [n for n in where if n.startswith("Sweep") and "layer_sweep" in where[n][0]], (
        "layer sweep types say LayerSweep"
    )


def _command_functions() -> list[tuple[str, str]]:
    """(module, function) of every function a typer app registers as a command (``@x.command(...)``)."""
    found = []
    for rel, tree in _modules():
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "command"
                for d in node.decorator_list
            ):
                found.append((str(rel), node.name))
    return found


def test_a_cli_command_is_named_for_its_role():
    # `capture`, `fit`, `score`, `tune`, ... were also library functions (vp.capture): a command's
    # function says it is one, so a name in cli/ never shadows the API it calls
    commands = _command_functions()
    assert len(commands) >= 20, commands  # the rule sees the decorators
    assert [c for c in commands if not c[1].endswith("_command")] == []


# Every JSON and HTML file goes through valueprobe/files.py's write_json / write_html (atomic: temp
# then rename). What counts as a raw write, outside files.py:
# - any `json.dump(...)` call, and any `.write_html(...)` call (plotly's writer);
# - a file write (`write_text`, `write_bytes`, `atomic_write_text`, `atomic_write_bytes`, `.write`)
#   whose arguments hold a `json.dumps(...)`, or a name the same function assigned from one;
# - such a file write whose path holds a string constant ending in ".html".
# JSON Lines are not JSON files: a write whose path holds a ".jsonl" constant is exempt, and so are
# the appenders named here (rows appended and fsynced; a resume truncates to the last whole line).
FILE_WRITES = {"write_text", "write_bytes", "atomic_write_text", "atomic_write_bytes", "write"}
JSONL_APPENDERS = {("steering/experiment/sweep.py", "_append")}
JSON_HOME = Path("files.py")


def _is_call(node: ast.AST, name: str, module: str | None = None) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute):
        return f.attr == name and (module is None or (isinstance(f.value, ast.Name) and f.value.id == module))
    return module is None and isinstance(f, ast.Name) and f.id == name


def _holds(node: ast.AST, test) -> bool:
    return any(test(n) for n in ast.walk(node))


def _constants(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _raw_writes_in(fn: ast.AST) -> list[int]:
    dumps = {
        t.id
        for n in ast.walk(fn)
        if isinstance(n, ast.Assign) and _holds(n.value, lambda x: _is_call(x, "dumps", "json"))
        for t in n.targets
        if isinstance(t, ast.Name)
    }

    def json_text(x: ast.AST) -> bool:
        return _is_call(x, "dumps", "json") or (isinstance(x, ast.Name) and x.id in dumps)

    bad = []
    for n in ast.walk(fn):
        plotly_writer = _is_call(n, "write_html") and isinstance(n.func, ast.Attribute)
        if _is_call(n, "dump", "json") or plotly_writer:
            bad.append(n.lineno)
        elif isinstance(n, ast.Call) and any(_is_call(n, w) for w in FILE_WRITES):
            consts = _constants(n)
            if any(c.endswith(".jsonl") for c in consts):
                continue
            if any(_holds(a, json_text) for a in [*n.args, *(k.value for k in n.keywords)]) or any(
                c.endswith(".html") for c in consts
            ):
                bad.append(n.lineno)
    return bad


def raw_json_html_writes(tree: ast.Module, rel: Path) -> list[str]:
    """``rel:line`` of each JSON or HTML file written without files.write_json / write_html."""
    out = set()
    fns = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    for fn in fns:
        if (str(rel), fn.name) in JSONL_APPENDERS:
            continue
        out |= {f"{rel}:{line}" for line in _raw_writes_in(fn)}
    nested = {line for fn in fns for n in ast.walk(fn) for line in [getattr(n, "lineno", None)] if line}
    top = ast.Module(
        body=[
            n for n in tree.body if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        ],
        type_ignores=[],
    )
    out |= {f"{rel}:{line}" for line in _raw_writes_in(top) if line not in nested}
    return sorted(out)


def test_every_json_and_html_file_goes_through_files_py():
    raw = [w for rel, tree in _modules() if rel != JSON_HOME for w in raw_json_html_writes(tree, rel)]
    assert not raw, f"write JSON / HTML files with valueprobe.files.write_json / write_html: {raw}"


def test_the_write_rule_sees_each_kind_of_raw_write():
    def caught(src: str) -> bool:
        return bool(raw_json_html_writes(ast.parse(src), Path("x.py")))

    assert caught("def f(p, d):\n    p.write_text(json.dumps(d))")
    assert caught("def f(p, d, fh):\n    json.dump(d, fh)")
    assert caught("def f(p, fig):\n    fig.write_html(str(p))")
    assert caught("def f(p, d):\n    text = json.dumps(d) + '\\n'\n    atomic_write_text(p / 'a.json', text)")
    assert caught("def f(p, page):\n    atomic_write_text(p / 'report.html', page)")
    assert not caught(
        "def f(p, rows):\n    atomic_write_text(p / 'rows.jsonl', ''.join(json.dumps(r) for r in rows))"
    )
    assert not caught("def f(p, d):\n    write_json(p / 'a.json', d)\n    key = json.dumps(d)")


ARCHITECTURE = PACKAGE.parent / "docs" / "ARCHITECTURE.md"


def _expand(token: str) -> list[str]:
    """``a/{b,c}.py`` -> ``a/b.py``, ``a/c.py`` (the page names sibling modules that way)."""
    m = re.search(r"\{([^{}]*)\}", token)
    if m is None:
        return [token]
    return [
        t
        for alt in m.group(1).split(",")
        for t in _expand(token[: m.start()] + alt.strip() + token[m.end() :])
    ]


def placed_modules(page: str) -> set[str]:
    """Every inline-code name on the page, braces expanded (code blocks left out)."""
    page = re.sub(r"```.*?```", "", page, flags=re.S)
    return {t for token in re.findall(r"`([^`\n]+)`", page) for t in _expand(token.strip())}


def test_architecture_places_every_module():
    placed = placed_modules(ARCHITECTURE.read_text(encoding="utf-8"))
    modules = [str(rel) for rel, _ in _modules() if rel.name != "__init__.py"]
    missing = [m for m in modules if m not in placed]
    assert not missing, f"docs/ARCHITECTURE.md names no place for {missing}"
    assert "steering/experiment/sweep.py" in placed_modules("x `steering/{experiment/sweep,hook/spec}.py`")


def test_architecture_cites_the_alpha_walk_and_the_rng_home():
    page = ARCHITECTURE.read_text(encoding="utf-8")
    assert "tests/alpha_walk.py" in page and "7 modules, none twice" in page
    assert "`stats/null.py`" in page and "one entry point" in page


# nn.Module hooks are registered in hooks/ only (`hooks.patch.hook_module`); the vLLM plugin and
# attribution's patching and ablation go through it.
HOOK_REGISTRATIONS = {
    "register_forward_hook",
    "register_forward_pre_hook",
    "register_full_backward_hook",
    "register_full_backward_pre_hook",
    "register_backward_hook",
    "register_module_forward_hook",
    "register_module_forward_pre_hook",
    "register_module_full_backward_hook",
}


def hook_registrations(tree: ast.AST) -> list[int]:
    return [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in HOOK_REGISTRATIONS
    ]


def test_nn_module_hooks_are_registered_only_under_hooks():
    outside = [
        f"{rel}:{line}"
        for rel, tree in _modules()
        if rel.parts[0] != "hooks"
        for line in hook_registrations(tree)
    ]
    assert not outside, f"register hooks through valueprobe.hooks.patch.hook_module: {outside}"
    assert hook_registrations(ast.parse((PACKAGE / "hooks" / "patch.py").read_text(encoding="utf-8")))
    assert hook_registrations(ast.parse("m.register_forward_pre_hook(f, with_kwargs=True)")) == [1]
