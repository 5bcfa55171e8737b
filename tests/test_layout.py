"""The layout's promises that no linter checks: few top-level modules, short functions.

The import order itself is checked by ``lint-imports`` (pyproject ``[tool.importlinter]``) in CI.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "valueprobe"
MAX_TOP_LEVEL = 8
MAX_LINES = 80  # outside datasets/, whose generators hold word tables


def test_at_most_eight_modules_at_the_top():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top


def test_no_function_over_80_lines_outside_datasets():
    long = []
    for path in PACKAGE.rglob("*.py"):
        if "datasets" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def _layers(container: str) -> set[str]:
    """The names the layers contract of ``container`` (pyproject) puts in its layers."""
    import tomllib

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers" and c["containers"] == [container]]
    return {part.strip() for layer in layers["layers"] for part in layer.split("|")}


def test_the_layer_contract_names_every_subpackage():
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    assert subpackages | modules == _layers("valueprobe")


def test_steering_is_split_by_role_and_its_contract_names_every_folder():
    """steering/ holds only its three role folders, and their layers contract names each."""
    steering = PACKAGE / "steering"
    folders = {p.parent.name for p in steering.glob("*/__init__.py")}
    assert {p.name for p in steering.glob("*.py")} == {"__init__.py"}
    assert folders == _layers("valueprobe.steering") == {"hook", "decode", "experiment"}


MAX_PARAMETERS = 12  # issue 29: a public function (or CLI command) says at most this many things


def _public_functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Module-level public functions and the public methods (``__init__`` included) of public
    classes, by qualified name; nested functions and anything private are left out."""
    out: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
            out.append((node.name, node))
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            out += [
                (f"{node.name}.{item.name}", item)
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                and (not item.name.startswith("_") or item.name == "__init__")
            ]
    return out


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    names = [x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return [n for n in names if n not in ("self", "cls")]


def test_no_public_function_or_command_takes_more_than_twelve_parameters():
    """CLI commands are public functions too: an option group (`valueprobe.cli.groups`) is one
    parameter of the command, however many options typer shows for it."""
    many = [
        f"{path.relative_to(PACKAGE)}:{name} ({len(_parameters(fn))})"
        for path in PACKAGE.rglob("*.py")
        for name, fn in _public_functions(ast.parse(path.read_text(encoding="utf-8")))
        if len(_parameters(fn)) > MAX_PARAMETERS
    ]
    assert not many, many


def test_the_parameter_count_sees_a_long_signature():
    """The rule above can fail: a method of 13 parameters, a command whose groups count once."""
    src = "class A:\n    def f(self, a, b, c, d, e, f, g, h, i, j, k, l, m): ...\ndef g(ctx, load, spec): ..."
    counts = {name: len(_parameters(fn)) for name, fn in _public_functions(ast.parse(src))}
    assert counts == {"A.f": 13, "g": 3}


def test_nn_module_hooks_are_registered_under_hooks_only():
    """``register_forward_hook`` and its kin are called in hooks/ alone (the vLLM plugin included)."""
    calls = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).parts[0] != "hooks"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute) and node.attr.startswith("register_") and "hook" in node.attr
    ]
    assert not calls, calls


def test_the_public_names_are_listed_alike_and_load_lazily():
    """``__all__``, the lazy table and the TYPE_CHECKING imports of valueprobe/__init__.py agree,
    every name resolves, and ``import valueprobe`` loads none of their modules (nor torch)."""
    import subprocess
    import sys

    import valueprobe as vp

    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    checked = next(n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))
    typed = {
        (node.module, alias.name)
        for node in checked.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    lazy = {(module, name) for module, names in vp._HOMES.items() for name in names}
    assert typed == lazy
    assert {name for _, name in lazy} | {"__version__"} == set(vp.__all__)
    for name in vp.__all__:
        assert getattr(vp, name) is not None
    code = "import sys, valueprobe; print(sorted(m for m in sys.modules if m.startswith(('torch', 'valueprobe.'))))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['valueprobe.version']"


def test_help_loads_no_heavy_library():
    """``valueprobe --help`` and every ``VERB --help`` import neither torch nor transformers nor
    plotly: the library loads when a command runs (cli/app.py; benchmarks/cli_start.py times it)."""
    import subprocess
    import sys

    code = (
        "import sys, typer\n"
        "from valueprobe.cli.main import app\n"
        "from valueprobe.cli.boundary import run_app\n"
        "names = [c.name for c in typer.main.get_command(app).commands.values()]\n"
        "heavy = {'torch', 'transformers', 'plotly', 'scipy', 'sklearn'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy), len(names))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("]")[0] == "[" and int(out.split()[-1]) >= 15, out
