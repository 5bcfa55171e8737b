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


def test_the_layer_contract_names_every_subpackage():
    import tomllib

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    (layers,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    named = {part.strip() for layer in layers["layers"] for part in layer.split("|")}
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    assert subpackages | modules == named
